"""The pipeline's GPU plan as a user meets it on a 4-GPU machine (the machine is
described, not probed): `--gpus 4` works for the embedded default (its tiny model generates on
one GPU through the transformers engine: the run's trajectory stage used to fail on vLLM's
data_parallel_size), an 8B model's generating stages are served on every GPU and need LiteLLM,
which is checked before anything starts; the plan is printed with the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from cobalt.pipeline import settings_text
from cobalt.pipeline.gpu_plan import plan_run
from cobalt.trajectories.stages import TrajectoryParams
from engines.machine import Machine
from engines.plan import MissingClientError
from flows.pipeline import parse_params

GIB = 1 << 30
FOUR_H100 = Machine(4, 80 * GIB, "NVIDIA H100 80GB HBM3", 500 * GIB, 64)


@pytest.fixture
def vllm_here(monkeypatch):
    """vLLM importable, as on a GPU worker with the gpu extra."""
    import cobalt.training.settings as training
    import engines.auto as auto
    import engines.plan as engine_plan

    monkeypatch.setattr(auto, "_vllm_installed", lambda: True)
    monkeypatch.setattr(training, "vllm_available", lambda: True)
    monkeypatch.setattr(engine_plan, "installed", lambda module: True)


def model_8b(tmp_path: Path) -> str:
    from transformers import Qwen2Config

    Qwen2Config(
        vocab_size=151_936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, dtype="bfloat16",
    ).save_pretrained(str(tmp_path / "model-8b"))  # fmt: skip
    return str(tmp_path / "model-8b")


def test_the_embedded_default_on_four_gpus(vllm_here, tiny_model) -> None:
    params = parse_params(["--gpus", "4", "--sharding", "fsdp"])
    plan = plan_run(params, None, FOUR_H100)
    assert (plan.generation.kind, plan.generation.gpus) == ("transformers", 1)
    assert (plan.training.processes, plan.training.sharding) == (4, "fsdp")
    # each generating stage's parameters validate (they did not: data_parallel_size 4 on the
    # transformers engine auto picks for the tiny model)
    stage = params.trajectories("sets", params.train_table, str(tiny_model), "train")
    again = TrajectoryParams.model_validate(stage.model_dump())
    resolved = again.engine.resolved()
    assert (resolved.kind, resolved.data_parallel_size) == ("transformers", "auto")
    text = settings_text(params, plan.lines())
    assert "GPU plan on 4 GPUs (NVIDIA H100 80GB HBM3, 80 GiB each)" in text
    assert "trajectories and evaluations: transformers (" in text and "on 1 GPU" in text
    assert "training: 4 processes on GPUs, fsdp; precision fp32" in text
    assert "generation transformers" in text  # auto for the tiny model, as its stages
    assert "padded forward passes" in text  # the tiny preset's: TRL's own


def test_an_8b_model_is_served_on_every_gpu_and_needs_litellm(vllm_here, tmp_path, monkeypatch):
    import engines.plan as engine_plan

    model = model_8b(tmp_path)
    params = parse_params(["--model", model, "--gpus", "4", "--sharding", "fsdp"])
    plan = plan_run(params, model, FOUR_H100)
    assert (plan.generation.kind, plan.generation.engines) == ("vllm", 4)
    assert plan.generation.clients == ("vllm", "litellm")
    assert plan.training.precision == "mixed" and plan.training.reduce_dtype == "float32"
    assert plan.training.vllm_share and plan.training.host_bytes_needed
    monkeypatch.setattr(engine_plan, "installed", lambda module: module != "litellm")
    with pytest.raises(MissingClientError, match=r"engine vllm on 4 GPUs is served \(vllm serve "
                       r"--data-parallel-size 4\) and reached through LiteLLM, which is not "
                       r"installed here: pip install litellm .*--gpus 1"):  # fmt: skip
        plan_run(params, model, FOUR_H100)


def test_a_vllm_context_beyond_the_models_positions_is_refused_before_any_work(
    vllm_here, tiny_model
) -> None:
    """vLLM refuses a max_model_len past max_position_embeddings only at its start-up, once the
    stage has loaded everything (seen on an H200: a prompt limit of 4,096 + 24 on the tiny model);
    the plan says it first, naming the settings and the largest that fits."""
    from cobalt.errors import UserError
    from cobalt.training.machinery.plan import plan_training
    from cobalt.training.settings import TrainingConfig

    one_h200 = Machine(1, 140 * GIB, "NVIDIA H200", 100 * GIB, 16)
    vllm = {"preset": "tiny", "mode": "single_turn", "generation": "vllm_colocate"}
    completion = TrainingConfig(**vllm).grpo_kwargs("plan")["max_completion_length"]
    with pytest.raises(UserError) as refused:
        plan_training(TrainingConfig(**vllm, max_prompt_length=4096), tiny_model, one_h200)
    message = str(refused.value)
    assert "\n" not in message
    assert f"max_prompt_length 4096 + max_completion_length {completion}" in message
    assert f"to {4096 - completion} or less" in message
    fits = TrainingConfig(**vllm, max_prompt_length=4096 - completion)
    assert plan_training(fits, tiny_model, one_h200).generation == "vllm_colocate"
    # vLLM's own setting, when given, is the one checked
    with pytest.raises(UserError, match="vllm_max_model_length 8192 exceeds the model's 4096"):
        plan_training(
            TrainingConfig(**vllm, overrides={"vllm_max_model_length": 8192}), tiny_model, one_h200
        )
    # transformers generation is not vLLM's limit: the same prompt limit plans
    plain = TrainingConfig(preset="tiny", mode="single_turn", generation="transformers")
    assert plan_training(plain.model_copy(update={"max_prompt_length": 4096}), tiny_model, one_h200)


def test_the_async_copy_of_the_policy_is_in_the_memory_plan(tmp_path, monkeypatch) -> None:
    """--async with transformers generation keeps a whole copy of the policy on every process:
    8B under fsdp on 2 H100s (no KL term: no reference model) holds its ~61 GiB state share, not
    that and a ~31 GiB float32 copy; the refusal names the copy before any work, and vLLM as the
    way out only where its awake share (TRL's 0.3 of the GPU) fits beside the state: not on 2
    H100s, on 4 GPUs of 64 GiB (~31 GiB of state each)."""
    from cobalt.errors import UserError
    from cobalt.training.machinery.plan import plan_training
    from cobalt.training.settings import TrainingConfig

    monkeypatch.setattr("cobalt.training.machinery.plan.checkpoint_dtype", lambda model: "float32")
    two_h100 = Machine(2, 80 * GIB, "NVIDIA H100 80GB HBM3", 500 * GIB, 64)
    model = model_8b(tmp_path)
    settings = {"mode": "single_turn", "generation": "transformers", "num_processes": 2}
    settings |= {"sharding": "fsdp", "precision": "fp32", "overrides": {"beta": 0.0}}
    assert plan_training(TrainingConfig(**settings), model, two_h100).processes == 2
    with pytest.raises(UserError) as refused:
        plan_training(TrainingConfig(**settings, async_generation=True), model, two_h100)
    message = str(refused.value)
    assert "\n" not in message and "training.async_generation" in message
    assert "GiB copy of the policy sampling in the background" in message
    assert "vllm_colocate" not in message and "spread the model over more GPUs" in message
    four_64 = Machine(4, 64 * GIB, "a 64 GiB GPU", 500 * GIB, 64)
    on_four = {**settings, "num_processes": 4, "async_generation": True}
    on_four["overrides"] = {"beta": 0.0, "per_device_train_batch_size": 8}
    with pytest.raises(UserError, match=r"vllm_colocate"):
        plan_training(TrainingConfig(**on_four), model, four_64)
    vllm = {**on_four, "generation": "vllm_colocate"}
    monkeypatch.setattr("cobalt.training.settings.vllm_available", lambda: True)
    assert plan_training(TrainingConfig(**vllm), model, four_64).one_step_off
    # kept awake with half of each GPU, vLLM no longer fits beside the state (its weights did)
    half = {**vllm, "overrides": {**vllm["overrides"], "vllm_gpu_memory_utilization": 0.5}}
    with pytest.raises(UserError, match=r"on 4 GPU\(s\).* with a colocated vLLM beside it"):
        plan_training(TrainingConfig(**half), model, four_64)
    # LoRA: the copy is the frozen base in its dtype (bf16 under mixed precision), and it fits
    lora = {**settings, "lora": {}, "precision": "mixed"}
    assert plan_training(TrainingConfig(**lora, async_generation=True), model, two_h100)


def test_a_micro_batch_that_cannot_hold_one_row_is_refused_before_any_work(
    vllm_here, tmp_path
) -> None:
    """NeMo-RL's shape split 2 + 2 (8B full fine-tuning under fsdp on 2 GPUs,
    a vLLM server on the other 2, completions of up to 4,096 tokens): on 80 GiB cards two shards
    of the model's float32 state and the reference model leave no room for one row, and the
    plan says so before any work (not the processes after the launch and vLLM's start), with
    the fixes. On 140 GiB cards the same run is planned; the processes' own plan agrees."""
    from cobalt.training.machinery.memory import TrainingMemoryError
    from cobalt.training.machinery.plan import plan_training
    from flows.training import parse_params

    model = model_8b(tmp_path)
    argv = ["--model", model, "--preset", "paper", "--mode", "single_turn", "--gpus", "2"]
    argv += ["--sharding", "fsdp", "--vllm-server-gpus", "2", "--async", "--share-prompts"]
    argv += ["--set", "num_generations=32", "--set", "generation_batch_size=2048"]
    argv += ["--set", "max_completion_length=4096", "--max-prompt-tokens", "512"]
    argv += ["--set", "save_strategy=no"]
    config = parse_params(argv).training
    with pytest.raises(TrainingMemoryError) as refused:
        plan_training(config, model, FOUR_H100)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "the planned micro-batch cannot hold one row on 2 GPU(s) of 80 GiB (fsdp), even with a "
        "1-token prompt: one sequence of 1 prompt + 4096 completion tokens needs about"
    )
    assert "train LoRA adapters" in message and "spread the model over more GPUs" in message
    four_h200 = Machine(4, 140 * GIB, "NVIDIA H200", 500 * GIB, 64)
    plan = plan_training(config, model, four_h200)
    assert plan.processes == 2
    # what the processes plan once loaded (rows of a 512-token prompt) agrees with the preflight:
    # a micro-batch on 140 GiB cards, the same refusal on 80 GiB ones
    from cobalt.training.decisions import decide
    from cobalt.training.grpo import micro_batch

    numerics = decide(config.precision, "bfloat16", gpu=True, mixed=True)
    kwargs = config.grpo_kwargs(str(tmp_path / "out"), model)
    rows = [{"prompt": "p"}]
    planned = micro_batch(config, kwargs, model, numerics, rows, lambda _: 512, plan)
    assert planned.micro_batch >= 1
    small = plan.model_copy(update={"gpu_bytes": FOUR_H100.gpu_bytes})
    with pytest.raises(TrainingMemoryError, match="one sequence of 512 prompt"):
        micro_batch(config, kwargs, model, numerics, rows, lambda _: 512, small)
    # a micro-batch the user sets is not planned, so not checked here
    given = config.model_copy(
        update={"overrides": {**config.overrides, "per_device_train_batch_size": 1}}
    )
    assert plan_training(given, model, FOUR_H100).processes == 2
