"""GPU memory of a GRPO step, and the micro-batch that fits (issue 23: a preset that fits).

The paper preset trains on 1024 completions per optimizer step (64 prompts x 16 samples) of up to
10,240 prompt + 6,144 completion tokens. How many of them one forward/backward can hold depends on
the model and the GPU: `plan_micro_batch` picks the largest micro-batch (a divisor of the step's
completions per process) whose estimate fits the free memory, and the gradient accumulation that
keeps the step's size. Estimate, with gradient checkpointing (pure arithmetic over the model's
config, `engines.memory` for the per-layer shapes):

    fixed  = weights + gradients + optimizer states (trainable: fp32 master, Adam's two moments;
             LoRA: the frozen base in its dtype, the adapters' share negligible)
           + the frozen reference model (full fine-tuning with a KL term)
           + vLLM's share when it is colocated (vllm_gpu_memory_utilization x the GPU)
           + one row's fp32 log-softmax temporaries (completion x vocabulary x 8 bytes)
           + a reserve (2 GiB + 5% of the GPU: allocator fragmentation, CUDA context, NCCL)
    per sequence = layers x length x hidden x residual bytes      (checkpointed layer inputs)
                 + length x activation bytes per token x 2         (one layer recomputed + grads)
                 + completion x vocabulary x 3 x compute bytes     (logits, scaled, their grad)

`TrainingMemoryError` names the settings to change when even one sequence does not fit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engines.memory import activation_bytes_per_token, dtype_bytes, text_config

GIB = 1 << 30


class TrainingMemoryError(RuntimeError):
    """Even a micro-batch of one sequence does not fit the GPU."""


@dataclass(frozen=True)
class MicroBatchPlan:
    micro_batch: int
    gradient_accumulation_steps: int
    estimate_gib: float  # the chosen micro-batch's whole estimate
    free_gib: float
    fixed_gib: float
    per_sequence_gib: float
    sequence_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"memory plan: micro-batch {self.micro_batch} x {self.gradient_accumulation_steps} "
            f"accumulation steps; sequences of {self.sequence_tokens} tokens need "
            f"{self.per_sequence_gib:.1f} GiB each over {self.fixed_gib:.1f} GiB fixed, "
            f"{self.estimate_gib:.1f} of {self.free_gib:.1f} GiB free"
        )


def fixed_bytes(
    parameters: int,
    *,
    trainable: int,
    trainable_dtype: str,
    frozen_dtype: str,
    reference_model: bool,
    vllm_bytes: int,
    completion_tokens: int,
    vocab_size: int,
    total_bytes: int,
) -> int:
    """Everything but the per-sequence activations (see the module docstring)."""
    master = dtype_bytes(trainable_dtype)
    frozen = dtype_bytes(frozen_dtype)
    base = (parameters - trainable) * frozen
    learned = trainable * (2 * master + 8)  # weights, gradients, Adam's m and v (fp32)
    reference = parameters * frozen if reference_model else 0
    row_temporaries = completion_tokens * vocab_size * 8
    reserve = 2 * GIB + total_bytes // 20
    return base + learned + reference + vllm_bytes + row_temporaries + reserve


def sequence_bytes(
    model_config: Any,
    sequence_tokens: int,
    completion_tokens: int,
    *,
    compute_dtype: str,
    residual_dtype: str,
) -> int:
    """Activation bytes of one sequence in a checkpointed forward/backward (module docstring)."""
    config = text_config(model_config)
    compute = dtype_bytes(compute_dtype)
    checkpoints = (
        int(config.num_hidden_layers)
        * sequence_tokens
        * int(config.hidden_size)
        * dtype_bytes(residual_dtype)
    )
    layer = sequence_tokens * activation_bytes_per_token(config, compute) * 2
    logits = completion_tokens * int(config.vocab_size) * 3 * compute
    return checkpoints + layer + logits


def plan_micro_batch(
    model_config: Any,
    *,
    sequences_per_step: int,
    prompt_tokens: int,
    completion_tokens: int,
    free_bytes: int,
    fixed: int,
    compute_dtype: str,
    residual_dtype: str,
    largest: int = 16,
) -> MicroBatchPlan:
    """The largest divisor of `sequences_per_step` (at most `largest`) whose estimate fits
    `free_bytes`; `TrainingMemoryError` when not even 1 does."""
    length = prompt_tokens + completion_tokens
    each = sequence_bytes(
        model_config,
        length,
        completion_tokens,
        compute_dtype=compute_dtype,
        residual_dtype=residual_dtype,
    )
    fits = [
        m
        for m in range(1, min(largest, sequences_per_step) + 1)
        if sequences_per_step % m == 0 and fixed + m * each <= free_bytes
    ]
    if not fits:
        raise TrainingMemoryError(
            f"one sequence of {prompt_tokens} prompt + {completion_tokens} completion tokens "
            f"needs about {(fixed + each) / GIB:.1f} GiB ({fixed / GIB:.1f} fixed: weights, "
            f"optimizer, vLLM's share; {each / GIB:.1f} activations) but {free_bytes / GIB:.1f} "
            "GiB are free: lower max_completion_length or training.max_prompt_length (--set / "
            "--max-prompt-tokens), train LoRA adapters (training.lora), lower "
            "vllm_gpu_memory_utilization, or spread the model over more GPUs "
            "(training.num_processes with a DeepSpeed ZeRO-3 / FSDP accelerate_config)"
        )
    m = max(fits)
    return MicroBatchPlan(
        micro_batch=m,
        gradient_accumulation_steps=sequences_per_step // m,
        estimate_gib=round((fixed + m * each) / GIB, 2),
        free_gib=round(free_bytes / GIB, 2),
        fixed_gib=round(fixed / GIB, 2),
        per_sequence_gib=round(each / GIB, 2),
        sequence_tokens=length,
    )


def fit_micro_batch(
    config: Any, kwargs: dict[str, Any], model: Any, numerics: Any, longest_prompt: int
) -> MicroBatchPlan:
    """The paper preset's micro-batch on this GPU: `kwargs` are the GRPOConfig fields (their
    per-device batch x accumulation is the step's size per process), `model` the loaded policy
    (still on the CPU), `numerics` a `cobalt.training.precision.Numerics`."""
    import torch

    free, total = torch.cuda.mem_get_info()
    parameters = sum(p.numel() for p in model.parameters())
    # LoRA's adapters are about 0.5% of an 8B model at rank 16: counted as frozen here
    trainable = 0 if config.lora else parameters
    vllm = 0
    if kwargs.get("use_vllm") and kwargs.get("vllm_mode", "colocate") == "colocate":
        vllm = int(float(kwargs.get("vllm_gpu_memory_utilization", 0.3)) * total)
    completion = int(kwargs["max_completion_length"])
    fixed = fixed_bytes(
        parameters,
        trainable=trainable,
        trainable_dtype=numerics.trainable,
        frozen_dtype=numerics.frozen,
        reference_model=not config.lora and bool(kwargs.get("beta")),
        vllm_bytes=vllm,
        completion_tokens=completion,
        vocab_size=int(text_config(model.config).vocab_size),
        total_bytes=total,
    )
    compute = "bfloat16" if numerics.compute != "float32" else "float32"
    return plan_micro_batch(
        model.config,
        sequences_per_step=int(kwargs["per_device_train_batch_size"])
        * int(kwargs["gradient_accumulation_steps"]),
        prompt_tokens=longest_prompt,
        completion_tokens=completion,
        free_bytes=free,
        fixed=fixed,
        compute_dtype=compute,
        residual_dtype="bfloat16" if numerics.trainable == "bfloat16" else "float32",
    )
