"""Several GPUs as a user asks for them: the training's GPU plan, decided before
any work on a given machine, each refusal one line that names the setting and the fix; a user's
own accelerate file honoured; one micro-batch for every process; the host memory of the model's
loads; the memory arithmetic that decides whether a strategy holds an 8B model and how much of
each GPU a colocated vLLM gets."""

from __future__ import annotations

import importlib.util

import pytest
from test_recipe import qwen3_8b

from cobalt.training.decisions import ShardingError, check_batch, resolve_sharding
from cobalt.training.machinery.memory import (
    GIB,
    TrainingMemoryError,
    check_holds,
    parameter_count,
    state_bytes,
    vllm_share,
)
from cobalt.training.machinery.plan import check_resume, plan_training
from cobalt.training.settings import LoraSettings, TrainingConfig
from engines.machine import Machine

H100 = 80 * GIB
H200 = 141 * GIB


def machine(gpus: int, gpu: int = H100, host: int = 1000 * GIB) -> Machine:
    return Machine(gpus, gpu if gpus else 0, "H100" if gpus else "", host, 64)


def check_launch(config: TrainingConfig, gpus: int) -> None:
    plan_training(config, None, machine(gpus))


STEP = {"per_device_train_batch_size": 8}  # a step 4 processes can share (the tiny preset's is 2)


@pytest.mark.parametrize(
    ("config", "gpus", "message"),
    [
        ({"num_processes": 4}, 2, r"num_processes 4 \(--gpus\): this machine has 2 GPU\(s\); "
         r"pass --gpus 2 or fewer"),
        ({"num_processes": 1, "sharding": "fsdp"}, 4, r"sharding fsdp on 1 process shards "
         r"nothing: pass --gpus N \(N > 1\), or --sharding ddp"),
        ({"num_processes": 2, "sharding": "fsdp"}, 0, r"sharding fsdp: accelerate shards a "
         r"model with FSDP across GPUs only \(it runs an FSDP config on CPU processes as plain "
         r"DDP\), and this machine has none; on CPU processes \(gloo\) use --sharding ddp, or "
         r"zero3"),
        ({"num_processes": 2, "sharding": "fsdp", "accelerate_config": "mine.yaml"}, 2,
         r"accelerate_config \(mine\.yaml\) decides the distribution, so training\.sharding fsdp "
         r"would be ignored: set one of them"),
        ({"num_processes": 2, "accelerate_config": "/nope/mine.yaml"}, 2,
         r"accelerate_config /nope/mine\.yaml: no such file"),
        ({"num_processes": 4, "sharding": "hybrid"}, 4, r"sharding hybrid shards within each "
         r"node and replicates across nodes: on 1 node pass --sharding fsdp, or --nodes N"),
        ({"num_processes": 2, "sharding": "hybrid", "nodes": 2, "rdzv_endpoint": "h:1"}, 0,
         r"sharding hybrid: accelerate shards a model with FSDP across GPUs only"),
    ],
)  # fmt: skip
def test_what_cannot_run_here_is_refused_naming_the_fix(config, gpus, message) -> None:
    with pytest.raises(ShardingError, match=message):
        check_launch(TrainingConfig(**config), gpus=gpus)


def test_zero3_without_deepspeed_says_what_to_install(monkeypatch) -> None:
    """A machine without DeepSpeed (the test environment has it: hide it)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "deepspeed" else find_spec(name, *a),
    )
    with pytest.raises(ShardingError, match=r"zero3 needs DeepSpeed.*pip install deepspeed, or "
                       r"use --sharding fsdp"):  # fmt: skip
        check_launch(TrainingConfig(num_processes=4, sharding="zero3"), gpus=4)


def test_what_can_run_passes() -> None:
    check_launch(TrainingConfig(num_processes=4, sharding="fsdp", overrides=STEP), gpus=4)
    check_launch(TrainingConfig(num_processes=2), gpus=0)  # CPU processes over gloo
    check_launch(TrainingConfig(num_processes=2, sharding="ddp"), gpus=2)


def test_auto_shards_full_fine_tuning_on_several_gpus_only() -> None:
    assert resolve_sharding(TrainingConfig(num_processes=4), gpus=4) == "fsdp"
    assert resolve_sharding(TrainingConfig(num_processes=4, lora=LoraSettings()), gpus=4) == "ddp"
    assert resolve_sharding(TrainingConfig(num_processes=1), gpus=4) == "ddp"
    assert resolve_sharding(TrainingConfig(num_processes=2), gpus=0) == "ddp"
    assert resolve_sharding(TrainingConfig(num_processes=4, sharding="zero3"), gpus=4) == "zero3"


def test_a_generation_batch_must_split_into_processes_and_groups() -> None:
    kwargs = {"per_device_train_batch_size": 4, "num_generations": 16,
              "gradient_accumulation_steps": 1, "generation_batch_size": 48}  # fmt: skip
    with pytest.raises(ShardingError, match=r"generation_batch_size 48 does not split over 8 "
                       r"processes of per_device_train_batch_size 4 \(32 completions a round\): "
                       r"set --set generation_batch_size=32"):  # fmt: skip
        check_batch(kwargs, 8)
    with pytest.raises(ShardingError, match=r"40 is not a whole number of prompt groups of "
                       r"num_generations 16: set --set generation_batch_size=32"):  # fmt: skip
        check_batch(kwargs | {"generation_batch_size": 40}, 2)
    check_batch(kwargs | {"generation_batch_size": 64}, 4)


def test_the_paper_preset_keeps_its_step_on_any_gpu_count_that_divides_it() -> None:
    """64 prompts x 16 samples a step over N processes: the accumulation shrinks; a smaller
    generation batch (a short run) is one optimizer step, each process's share planned."""
    four = TrainingConfig(preset="paper", num_processes=4).grpo_kwargs("out")
    assert four["per_device_train_batch_size"] * four["gradient_accumulation_steps"] * 4 == 1024
    short = TrainingConfig(
        preset="paper", num_processes=4, overrides={"generation_batch_size": 16}
    ).grpo_kwargs("out")
    assert (short["per_device_train_batch_size"], short["gradient_accumulation_steps"]) == (4, 1)
    with pytest.raises(ShardingError, match=r"num_processes 3: .* use --gpus 1, 2, 4, 8.*, "
                       r"or a step of your own that does \(--set generation_batch_size=1008, "
                       r"a multiple of 48\)"):  # fmt: skip
        TrainingConfig(preset="paper", num_processes=3).grpo_kwargs("out")
    TrainingConfig(
        preset="paper", num_processes=3, overrides={"generation_batch_size": 1008}
    ).check()  # the batch the refusal offers is taken
    # a generation batch of the user's replaces the preset's step: 3 processes (4 GPUs, one
    # for a vLLM server) take a batch that splits over 3, and still refuse one that does not
    three = TrainingConfig(
        preset="paper", num_processes=3, overrides={"generation_batch_size": 1350}
    ).grpo_kwargs("out")
    assert (three["per_device_train_batch_size"], three["gradient_accumulation_steps"]) == (450, 1)
    with pytest.raises(ShardingError, match=r"generation_batch_size 1280 does not split over 3"):
        TrainingConfig(
            preset="paper", num_processes=3, overrides={"generation_batch_size": 1280}
        ).grpo_kwargs("out")


def holds(processes: int, sharding: str, gpu: int, lora: bool = False) -> None:
    shards = processes if sharding in ("fsdp", "zero3") else 1
    check_holds(
        qwen3_8b(),
        lora=lora,
        reference_model=not lora,
        trainable_dtype="float32",
        frozen_dtype="bfloat16",
        shards=shards,
        sharding=sharding,
        gpu_bytes=gpu,
        processes=processes,
        vllm_bytes=parameter_count(qwen3_8b()) * 2,  # asleep: its bf16 weights
    )


def test_hybrid_shards_within_a_node_and_launches_a_2d_mesh(tmp_path) -> None:
    """Hybrid on 2 nodes of 4 GPUs: the model's state over a node's 4 GPUs (the memory plan's
    shards), FSDP's accelerate config, and accelerate's parallelism config in the launch's
    environment (2 replicas x 4 shards)."""
    from cobalt.training.machinery.sharding import config_file, hybrid_env

    config = TrainingConfig(num_processes=4, nodes=2, rdzv_endpoint="10.0.0.1:29500",
                            sharding="hybrid", overrides=STEP)  # fmt: skip
    plan = plan_training(config, None, machine(4))
    assert (plan.sharding, plan.processes, plan.shards) == ("hybrid", 8, 4)
    assert plan.accelerate_config == str(config_file("fsdp"))
    full = plan_training(config.model_copy(update={"sharding": "fsdp"}), None, machine(4))
    assert full.shards == 8
    assert hybrid_env(plan.nodes, plan.per_node) == {
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "4",
    }


def test_a_strategy_that_cannot_hold_the_8b_model_is_refused_before_any_work() -> None:
    """Qwen3-8B fully fine-tuned: 8.19B x 16 bytes of fp32 state and a bf16 reference model
    (147 GB) do not fit one H100 under ddp, nor two (74 GB each beside vLLM's 16 GB of weights);
    four do, and two H200 do (docs/SCALING.md's budget)."""
    assert 8.18e9 < parameter_count(qwen3_8b()) < 8.2e9
    with pytest.raises(TrainingMemoryError, match=r"training\.sharding ddp on 4 GPU\(s\): each "
                       r"GPU would hold 137 GiB .* use --gpus 4 --sharding fsdp, or train LoRA "
                       r"adapters \(--lora\)"):  # fmt: skip
        holds(4, "ddp", H100)
    with pytest.raises(TrainingMemoryError, match=r"fsdp on 2 GPU\(s\): each GPU would hold 69 "
                       r"GiB .* with a colocated vLLM beside it: use --gpus 4"):  # fmt: skip
        holds(2, "fsdp", H100)
    holds(4, "fsdp", H100)
    holds(2, "fsdp", H200)
    holds(1, "ddp", H100, lora=True)  # the frozen bf16 base: 16 GB


def test_a_sleeping_vllm_gets_its_weights_and_its_sequences_kv_cache() -> None:
    """Hand-worked for the paper run on 4 H100: 4 sequences of 16,384 tokens per process, each
    token 147,456 bytes of bf16 KV cache (36 x 8 x 128 x 2 x 2), beside a quarter of the state."""
    config = qwen3_8b()
    params = parameter_count(config)
    resident = state_bytes(params, trainable=params, trainable_dtype="float32",
                           frozen_dtype="bfloat16", reference_model=True, shards=4)  # fmt: skip
    share = vllm_share(config, sequences=4, context_tokens=16_384, total_bytes=H100,
                       resident_bytes=resident)  # fmt: skip
    want = params * 2 + 4 * 16_384 * 147_456 + 4 * GIB
    assert share == pytest.approx(want / H100, abs=1e-3)
    assert 0.3 < share < 0.4
    # 1,000 sequences cannot all be cached: the share stops where the training state begins
    capped = vllm_share(config, sequences=1000, context_tokens=16_384, total_bytes=H100,
                        resident_bytes=resident)  # fmt: skip
    assert capped == pytest.approx((H100 - resident - 2 * GIB - H100 // 20) / H100, abs=1e-3)
    with pytest.raises(TrainingMemoryError, match=r"a colocated vLLM needs .* spread the model "
                       r"over more GPUs \(--gpus N --sharding fsdp\)"):  # fmt: skip
        vllm_share(config, sequences=4, context_tokens=16_384, total_bytes=H100,
                   resident_bytes=4 * resident)  # fmt: skip


def test_a_logit_bias_from_json_reaches_vllm_with_token_ids() -> None:
    """`--set 'generation_kwargs={"logit_bias": {"2": 3.7}}'` (JSON keys are strings): vLLM's
    SamplingParams indexes its logits by the keys, so they become ints (scripts/gpu/
    eos_calibrate.py sets a random model's mean response length this way)."""
    config = TrainingConfig(overrides={"generation_kwargs": {"logit_bias": {"2": 3.7}, "x": 1}})
    assert config.grpo_kwargs("out")["generation_kwargs"] == {"logit_bias": {2: 3.7}, "x": 1}


def accelerate_file(tmp_path, kind: str, **extra) -> str:
    import yaml

    path = tmp_path / f"{kind}.yaml"
    body = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind, "num_machines": 1,
            "num_processes": 4, "mixed_precision": "bf16", **extra}  # fmt: skip
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_a_users_accelerate_file_decides_the_sharding_the_plan_and_launch_follow(tmp_path) -> None:
    """Full fine-tuning with the user's DDP file used to be planned and checked as fsdp (auto);
    now the file's own strategy is the plan's, and the launch passes the file."""
    from cobalt.training.launch import launch_command

    ddp = accelerate_file(tmp_path, "MULTI_GPU")
    fsdp = accelerate_file(tmp_path, "FSDP", fsdp_config={"fsdp_version": 2})
    zero2 = accelerate_file(tmp_path, "DEEPSPEED", deepspeed_config={"zero_stage": 2})
    for path, sharding in ((ddp, "ddp"), (fsdp, "fsdp"), (zero2, "ddp")):
        config = TrainingConfig(num_processes=4, accelerate_config=path, overrides=STEP)
        assert resolve_sharding(config, gpus=4) == sharding
        plan = plan_training(config, None, machine(4))
        assert (plan.sharding, plan.accelerate_config) == (sharding, path)
        command = launch_command(tmp_path / "job.json", plan)
        assert command[command.index("--config_file") + 1] == path


def test_the_launch_follows_the_plan(tmp_path) -> None:
    """Each strategy launches with the accelerate config the project ships, the process count
    and the mixed precision the plan decided, over the file's values."""
    from cobalt.training.launch import launch_command
    from cobalt.training.machinery.sharding import config_file

    def flag(cmd: list[str], name: str) -> str:
        return cmd[cmd.index(name) + 1]

    for sharding in ("ddp", "fsdp"):
        config = TrainingConfig(
            num_processes=4, sharding=sharding, precision="mixed", overrides=STEP
        )
        cmd = launch_command(tmp_path / "job.json", plan_training(config, None, machine(4)))
        assert flag(cmd, "--config_file") == str(config_file(sharding))
        assert (flag(cmd, "--num_processes"), flag(cmd, "--mixed_precision")) == ("4", "bf16")
        assert cmd[-3:] == ["-m", "cobalt.training.launch", str(tmp_path / "job.json")]
    auto = plan_training(TrainingConfig(num_processes=4, overrides=STEP), None, machine(4))
    assert auto.accelerate_config == str(config_file("fsdp"))
    lora = TrainingConfig(num_processes=4, lora=LoraSettings(), overrides=STEP)
    lora = plan_training(lora, None, machine(4))
    assert lora.accelerate_config == str(config_file("ddp"))
    cpu = plan_training(TrainingConfig(num_processes=2), None, machine(0))
    assert (cpu.accelerate_config, cpu.mixed_precision) == (str(config_file("ddp")), "no")


def write_model(tmp_path, config) -> str:
    config.save_pretrained(str(tmp_path / "model"))
    return str(tmp_path / "model")


def test_every_process_plans_the_same_micro_batch_whatever_its_gpu_holds(monkeypatch) -> None:
    """The old plan read each process's own free GPU memory (GPU 0 also held the preflight's
    CUDA context): two processes could choose different micro-batches and then mismatch in
    their collectives. The plan's GPU memory is the only input now."""
    import torch

    from cobalt.training.decisions import decide
    from cobalt.training.machinery.memory import fit_micro_batch

    config = TrainingConfig(preset="paper", num_processes=4)
    kwargs = config.grpo_kwargs("out")
    numerics = decide("mixed", "bfloat16", gpu=True, mixed=True)
    model = qwen3_8b()
    plans = []
    for free in (70 * GIB, 77 * GIB):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, free=free: (free, H100))
        plan = fit_micro_batch(
            config,
            kwargs,
            model,
            parameter_count(model),
            numerics,
            2048,
            shards=4,
            gpu_bytes=H100,
            sharding="fsdp",
        )
        plans.append(plan)
    assert plans[0] == plans[1] and plans[0].micro_batch >= 1


def test_packed_passes_plan_micro_batches_of_more_rows_within_the_same_estimate() -> None:
    """verl's shape (prompts of 200 tokens, completions up to 1,024, 1,280 a step over 4 fsdp
    processes) on an H200: padded rows stop at 16 a micro-batch (20 micro-batches a step, each
    gathering the sharded model, the gradients held whole until the step's last); packed rows go
    up to 64: holding the gradients whole fits 40 (8 micro-batches: 16 whole-model gathers and
    one reduce-scatter a step), reducing every micro-batch fits 64 (5: 10 gathers and 5
    reduce-scatters, fewer bytes), and the plan takes that. Every row still counted at its
    longest. On an H100 whole gradients leave room for 2 rows (160 micro-batches): the plan
    reduces every micro-batch instead, with 16 padded or 20 packed rows."""
    from cobalt.training.decisions import decide
    from cobalt.training.machinery.memory import PADDED_ROWS, fit_micro_batch

    numerics = decide("mixed", "bfloat16", gpu=True, mixed=True)
    model = qwen3_8b()
    verl = {"num_generations": 5, "max_completion_length": 1024, "generation_batch_size": 1280}
    plans = {}
    for packing in (False, True):
        for gpu in (H100, H200):
            for sync in ("auto", "step"):
                config = TrainingConfig(preset="paper", num_processes=4, sharding="fsdp",
                                        packing=packing, overrides=verl, gradient_sync=sync)  # fmt: skip
                kwargs = config.grpo_kwargs("out")
                plan = fit_micro_batch(config, kwargs, model, parameter_count(model), numerics,
                                       200, shards=4, gpu_bytes=gpu, sharding="fsdp")  # fmt: skip
                assert plan.estimate_gib <= plan.free_gib
                plans[packing, gpu, sync] = (
                    plan.micro_batch,
                    plan.gradient_accumulation_steps,
                    plan.reduce_every_micro_batch,
                )
    assert plans[False, H200, "auto"] == plans[False, H200, "step"] == (PADDED_ROWS, 20, False)
    assert plans[True, H200, "step"] == (40, 8, False)
    assert plans[True, H200, "auto"] == (64, 5, True)
    assert plans[False, H100, "step"] == plans[True, H100, "step"] == (2, 160, False)
    assert plans[False, H100, "auto"] == (PADDED_ROWS, 20, True)
    assert plans[True, H100, "auto"] == (20, 16, True)


def test_the_plan_counts_the_gradients_fsdp_holds_whole_between_micro_batches() -> None:
    """accelerate runs every micro-batch of a step but the last under `no_sync`; FSDP2 then
    accumulates whole float32 gradients (checked on CPU processes: each holds every gradient
    element after a no-sync backward). The plan counts (N-1)/N of them beyond the shard under
    fsdp and hybrid when a step takes several micro-batches, not under ZeRO-3 (it partitions
    every micro-batch) nor when one micro-batch is the whole step. The paper's lengths on
    4x H100: holding them does not fit, so the plan reduces every micro-batch (what
    `--gradient-sync micro_batch` forces) and says so."""
    from cobalt.training.decisions import decide
    from cobalt.training.machinery.memory import fit_micro_batch, held_gradient_bytes

    numerics = decide("mixed", "bfloat16", gpu=True, mixed=True)
    model = qwen3_8b()
    params = parameter_count(model)
    assert held_gradient_bytes(params, 4) == params * 4 * 3 // 4  # ~24.6 GB at 8B
    assert held_gradient_bytes(params, 1) == 0

    def plan(sharding: str, gpu: int, sync: str = "auto", **over):
        config = TrainingConfig(preset="paper", num_processes=4, sharding=sharding,
                                gradient_sync=sync, overrides={"generation_batch_size": 64, **over})  # fmt: skip
        return fit_micro_batch(config, config.grpo_kwargs("out"), model, params, numerics, 9897,
                               shards=4, gpu_bytes=gpu, sharding=sharding)  # fmt: skip

    paper = plan("fsdp", H100)
    assert (
        paper.reduce_every_micro_batch and "reduce-scattered every micro-batch" in paper.describe()
    )
    with pytest.raises(TrainingMemoryError, match="gradients held whole"):
        plan("fsdp", H100, "step")
    forced = plan("fsdp", H200, "micro_batch")
    held = plan("fsdp", H200, "step")
    assert forced.reduce_every_micro_batch and not held.reduce_every_micro_batch
    assert held.gradient_accumulation_steps > 1
    assert held.fixed_gib - forced.fixed_gib == pytest.approx(
        held_gradient_bytes(params, 4) / GIB, abs=0.02
    )
    zero3 = plan("zero3", H200)
    assert not zero3.reduce_every_micro_batch and zero3.fixed_gib < held.fixed_gib
    whole_step = plan(
        "fsdp", H200, "step", generation_batch_size=16
    )  # 4 rows a process: one micro-batch
    assert whole_step.gradient_accumulation_steps == 1 and whole_step.fixed_gib == forced.fixed_gib


def test_a_multi_turn_conversation_is_planned_with_every_turn(tmp_path) -> None:
    """Three assistant turns and two feedback turns per sequence: the memory plan sized one turn
    (a micro-batch that then ran out of memory); it sizes the whole conversation now."""
    from cobalt.training.decisions import decide
    from cobalt.training.machinery.memory import (
        FEEDBACK_TOKENS,
        fit_micro_batch,
        multi_turn_completion_tokens,
    )

    assert multi_turn_completion_tokens(6144, 2, 1000) == 3 * 6144 + 2 * FEEDBACK_TOKENS
    assert multi_turn_completion_tokens(6144, 2, 1000, max_context=8192) == 7192 + 6144
    config = TrainingConfig(preset="paper", mode="multi_turn", num_processes=4)
    kwargs = config.grpo_kwargs("out")
    numerics = decide("mixed", "bfloat16", gpu=True, mixed=True)
    model = qwen3_8b()
    one_turn = fit_micro_batch(config, kwargs, model, parameter_count(model), numerics, 1000,
                               shards=4, gpu_bytes=H200)  # fmt: skip
    whole = fit_micro_batch(
        config, kwargs, model, parameter_count(model), numerics, 1000, shards=4, gpu_bytes=H200,
        completion_tokens=multi_turn_completion_tokens(6144, 2, 1000),
    )  # fmt: skip
    assert whole.sequence_tokens == 1000 + 3 * 6144 + 2 * FEEDBACK_TOKENS
    assert whole.micro_batch < one_turn.micro_batch


def test_the_host_memory_of_the_processes_loads_is_planned(tmp_path) -> None:
    """Four processes loading the 8B shape in fp32 with a bf16 reference model each: ~197 GB at
    once (FSDP loads a whole copy per process). A machine with less free memory is refused
    before any work, naming the fixes; ZeRO-3 would partition the weights as they load."""
    model = write_model(tmp_path, qwen3_8b())
    config = TrainingConfig(preset="paper", num_processes=4, sharding="fsdp", precision="mixed")
    plan = plan_training(config, model, machine(4, host=512 * GIB))
    params = parameter_count(qwen3_8b())
    assert plan.host_bytes_needed == 4 * params * (4 + 2)
    assert 180 * GIB < plan.host_bytes_needed < 190 * GIB
    assert "host memory at load ~183 of 512 GiB free" in plan.describe()
    assert "(gradients reduced in float32, layers gathered in float32)" in plan.describe()
    verl = config.model_copy(update={"fsdp_gather": "bfloat16"})
    assert "layers gathered in bfloat16" in plan_training(verl, model, machine(4)).describe()
    assert "trimmed forward passes" in plan.describe()  # the paper preset's
    packed = config.model_copy(update={"packing": True})
    assert "packed forward passes" in plan_training(packed, model, machine(4)).describe()
    shared = packed.model_copy(update={"share_prompts": True})
    assert "packed (prompts shared) forward passes" in (
        plan_training(shared, model, machine(4)).describe()
    )
    split = config.model_copy(update={"fsdp_gather": "bf16-linear"})
    assert "linear layers gathered in bfloat16, the rest in float32" in (
        plan_training(split, model, machine(4)).describe()
    )
    with pytest.raises(TrainingMemoryError, match=r"host memory: 4 training process\(es\) load "
                       r"the policy .* ~183 GiB, but 128 GiB are free on this machine: use "
                       r"--sharding zero3 .*--lora"):  # fmt: skip
        plan_training(config, model, machine(4, host=128 * GIB))
    lora = config.model_copy(update={"lora": LoraSettings(), "sharding": "ddp"})
    assert plan_training(lora, model, machine(4, host=128 * GIB)).host_bytes_needed == (
        4 * params * 2
    )


def test_a_colocated_vllms_share_is_the_plans(tmp_path, monkeypatch) -> None:
    import cobalt.training.settings as training

    monkeypatch.setattr(training, "vllm_available", lambda: True)
    model = write_model(tmp_path, qwen3_8b())
    config = TrainingConfig(preset="paper", num_processes=4, generation="vllm_colocate")
    plan = plan_training(config, model, machine(4))
    assert plan.sharding == "fsdp" and 0.3 < (plan.vllm_share or 0) < 0.6
    assert f"{plan.vllm_share} of each GPU" in plan.describe()


def test_a_resume_needs_the_processes_that_wrote_the_checkpoint(tmp_path) -> None:
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    for rank in range(4):
        (checkpoint / f"rng_state_{rank}.pth").write_bytes(b"")
    check_resume(checkpoint, 4)
    with pytest.raises(ShardingError, match=r"written by 4 process\(es\) and this run has 2: "
                       r"resume with --gpus 4, or start over \(--refresh\)"):  # fmt: skip
        check_resume(checkpoint, 2)


def test_a_step_trains_as_many_completions_on_any_number_of_processes() -> None:
    """The tiny preset's step (and one given with --set) is one process's: N processes share it
    (it used to grow with them, another recipe on every GPU count), or the config says why not."""

    def step(processes: int, **overrides) -> tuple[int, int, int]:
        kw = TrainingConfig(num_processes=processes, overrides=overrides).grpo_kwargs("o", gpus=4)
        micro, accumulation = kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]
        return micro, accumulation, micro * accumulation * processes

    assert step(1, per_device_train_batch_size=32) == (32, 1, 32)
    assert step(4, per_device_train_batch_size=32) == (8, 1, 32)  # the embedded default's
    assert step(2, per_device_train_batch_size=4, gradient_accumulation_steps=4) == (4, 2, 16)
    with pytest.raises(ShardingError, match=r"a step of 2 completions .* over 4 processes: use "
                       r"--gpus 1 or 2"):  # fmt: skip
        step(4)


def test_each_gpu_index_compiles_vllm_into_a_cache_of_its_own() -> None:
    """vLLM names its compiled artifacts by rank only; a process on GPU 1 that loaded what rank
    1 built on GPU 0 (1 node x 2 after 2 nodes x 1) died starting vLLM. Each launched process
    now caches under its GPU's index, below the user's VLLM_CACHE_ROOT or XDG cache."""
    from cobalt.training.machinery.vllm_server import vllm_cache_root

    home = {"VLLM_CACHE_ROOT": "/data/vllm"}
    assert vllm_cache_root(0, home) == "/data/vllm/cuda0"
    assert vllm_cache_root(1, home) == "/data/vllm/cuda1"
    assert vllm_cache_root(1, {"XDG_CACHE_HOME": "/xdg"}) == "/xdg/vllm/cuda1"
    assert vllm_cache_root(0, {}).endswith("/.cache/vllm/cuda0")


def test_the_config_check_sees_the_generation_batch_of_every_process() -> None:
    """The check before any work builds TRL's GRPOConfig in the flow's one process, where TRL
    would take a world of 1: the tiny preset on 2 processes (a micro-batch of 1 each, 2
    completions a step in all) was refused there as a batch of 1 for groups of 2, though each
    launched process sees 2. A batch that the processes would refuse is still refused, as
    they would count it."""
    TrainingConfig(preset="tiny", mode="single_turn", num_processes=2).check()
    three = TrainingConfig(
        preset="tiny", mode="single_turn", num_processes=2, overrides={"num_generations": 3}
    )
    with pytest.raises(ValueError, match=r"generation_batch_size \(2\) must be divisible by "):
        three.check()


def test_shared_prompts_let_a_micro_batch_hold_more_rows_at_the_papers_lengths() -> None:
    """At the paper's lengths (~9,900-token prompts, 6,144-token completions, 16 samples) a
    micro-batch of packed rows holds 1-2 whole sequences; with --share-prompts each prompt's
    tokens are counted once for the rows that sample it, so the plan fits more rows a pass on
    the same GPU (what makes sharing pay there), its estimate counting the computed tokens and
    the keys each row gathers. A step whose rows straddle prompts counts an extra prompt."""
    from cobalt.training.decisions import decide
    from cobalt.training.machinery.activations import micro_batch_bytes, prompts_in_micro_batch
    from cobalt.training.machinery.memory import fit_micro_batch

    numerics = decide("mixed", "bfloat16", gpu=True, mixed=True)
    model = qwen3_8b()
    params = parameter_count(model)
    packed = TrainingConfig(preset="paper", num_processes=4, packing=True)
    shared = packed.model_copy(update={"share_prompts": True})

    def plan(config: TrainingConfig):
        return fit_micro_batch(config, config.grpo_kwargs("out"), model, params, numerics, 9897,
                               shards=4, gpu_bytes=H200, sharding="fsdp")  # fmt: skip

    alone, together = plan(packed), plan(shared)
    assert alone.prompts_per_micro_batch is None and alone.micro_batch == 4
    assert together.micro_batch >= 2 * alone.micro_batch
    assert together.prompts_per_micro_batch == 1  # rows of one prompt: its 16 samples or fewer
    assert f"1 computed once for {together.micro_batch} rows" in together.describe()
    assert together.estimate_gib <= together.free_gib
    kw = {"compute_dtype": "bfloat16", "residual_dtype": "float32"}
    rows = together.micro_batch
    whole = micro_batch_bytes(model, rows, 9897, 6144, **kw)
    once = micro_batch_bytes(model, rows, 9897, 6144, group=16, rows_per_step=256, **kw)
    assert once < whole and whole == rows * micro_batch_bytes(model, 1, 9897, 6144, **kw)
    # the prompts a micro-batch holds: aligned, or straddling groups (one more, at most rows)
    assert [prompts_in_micro_batch(m, 16, 256) for m in (1, 4, 16, 32)] == [1, 1, 1, 2]
    assert prompts_in_micro_batch(4, 16, 250) == 2  # a process's step is not whole groups
    assert prompts_in_micro_batch(6, 16, 96) == 2 and prompts_in_micro_batch(3, 1, 96) == 3


def test_rows_are_regrouped_only_where_a_generation_batch_makes_whole_optimizer_steps() -> None:
    """The two alignment decisions (cobalt.training.decisions): the trainer orders a generation
    batch's rows itself only when its micro-batches make whole optimizer steps; one-step-off
    generation needs each generation batch, over its iterations, to start an optimizer step."""
    from cobalt.training.decisions import rows_regrouped, starts_optimizer_step

    assert rows_regrouped(2, 2) and rows_regrouped(4, 2) and not rows_regrouped(3, 2)
    assert starts_optimizer_step(2, 1, 2) and not starts_optimizer_step(1, 1, 2)
    # they part where a batch is trained on twice: 3 micro-batches, two passes, steps of 2
    assert starts_optimizer_step(3, 2, 2) and not rows_regrouped(3, 2)


def test_a_plan_made_for_another_checkpoints_dtype_is_refused_by_the_trainers(tmp_path) -> None:
    """The trainers take the numerics from the run's plan (`planned_numerics`): a plan made
    before the model was there (float32 assumed) does not train a bf16 checkpoint."""
    import json

    from cobalt.training.machinery.plan import plan_training, planned_numerics

    plan = plan_training(TrainingConfig())  # no model yet: planned as a float32 checkpoint
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert planned_numerics(plan, tmp_path) == plan.numerics
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    with pytest.raises(ValueError, match=r"made for a float32 checkpoint.*is bfloat16"):
        planned_numerics(plan, tmp_path)
