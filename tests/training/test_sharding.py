"""Several GPUs as a user asks for them (issue 38): the checks that run before any work, each
failing with one line that names the setting and the fix, and the memory arithmetic that decides
whether a strategy holds an 8B model and how much of each GPU a colocated vLLM gets."""

from __future__ import annotations

import importlib.util

import pytest
from test_recipe import qwen3_8b

from cobalt.training.config import LoraSettings, TrainingConfig
from cobalt.training.memory import (
    GIB,
    TrainingMemoryError,
    check_holds,
    parameter_count,
    state_bytes,
    vllm_share,
)
from cobalt.training.sharding import ShardingError, check_batch, check_launch, resolve_sharding

H100 = 80 * GIB
H200 = 141 * GIB


@pytest.mark.parametrize(
    ("config", "gpus", "message"),
    [
        ({"num_processes": 4}, 2, r"num_processes 4 \(--gpus\): this machine has 2 GPU\(s\); "
         r"pass --gpus 2 or fewer"),
        ({"num_processes": 1, "sharding": "fsdp"}, 4, r"sharding fsdp on 1 process shards "
         r"nothing: pass --gpus N \(N > 1\), or --sharding ddp"),
        ({"num_processes": 2, "sharding": "zero3"}, 0, r"sharding zero3: accelerate shards a "
         r"model across GPUs only, and this machine has none; on CPU processes \(gloo\) use "
         r"--sharding ddp"),
        ({"num_processes": 2, "sharding": "fsdp", "accelerate_config": "mine.yaml"}, 2,
         r"accelerate_config \(mine\.yaml\) decides the distribution, so training\.sharding fsdp "
         r"would be ignored: set one of them"),
        ({"num_processes": 2, "accelerate_config": "/nope/mine.yaml"}, 2,
         r"accelerate_config /nope/mine\.yaml: no such file"),
    ],
)  # fmt: skip
def test_what_cannot_run_here_is_refused_naming_the_fix(config, gpus, message) -> None:
    with pytest.raises(ShardingError, match=message):
        check_launch(TrainingConfig(**config), gpus=gpus)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="installed")
def test_zero3_without_deepspeed_says_what_to_install() -> None:
    with pytest.raises(ShardingError, match=r"zero3 needs DeepSpeed.*pip install deepspeed, or "
                       r"use --sharding fsdp"):  # fmt: skip
        check_launch(TrainingConfig(num_processes=4, sharding="zero3"), gpus=4)


def test_what_can_run_passes() -> None:
    check_launch(TrainingConfig(num_processes=4, sharding="fsdp"), gpus=4)
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
    with pytest.raises(ShardingError, match=r"num_processes 3: .* use --gpus 1, 2, 4, 8"):
        TrainingConfig(preset="paper", num_processes=3).grpo_kwargs("out")


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
        colocated_vllm=True,
    )


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
