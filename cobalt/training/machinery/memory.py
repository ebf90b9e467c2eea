"""GPU memory of a GRPO step, and the micro-batch that fits (so that a preset fits its GPUs).

The paper preset trains on 1024 completions per optimizer step (64 prompts x 16 samples) of up to
10,240 prompt + 6,144 completion tokens. How many of them one forward/backward can hold depends on
the model and the GPU: `plan_micro_batch` picks the largest micro-batch (a divisor of the step's
completions per process) whose estimate fits the free memory, and the gradient accumulation that
keeps the step's size. Estimate, with gradient checkpointing (pure arithmetic over the model's
config, `engines.memory` for the per-layer shapes):

    fixed  = weights + gradients + optimizer states (trainable: fp32 master, Adam's two moments;
             LoRA: the frozen base in its dtype, the adapters' share negligible), / N processes
             when fsdp or zero3 shards them (cobalt/training/machinery/sharding.py)
           + the frozen reference model (full fine-tuning with a KL term), / N when sharded
           + vLLM's share when it is colocated and awake while the optimizer steps
             (vllm_gpu_memory_utilization x the GPU; 0 in sleep mode, `vllm_share` plans it)
           + --async with transformers generation: a whole copy of the policy, on every process
             (`sampler_copy_bytes`)
           + when sharded, what is gathered whole at a time (`gathered_bytes`: the root's
             embeddings and head, the head's gradient, two decoder layers and their gradients),
             in the trainable dtype (FSDP gathers the float32 master weights under `mixed`:
             cobalt.training.machinery.precision)
           + under FSDP, the gradients held whole between the micro-batches of a step
             (`held_gradient_bytes`: accelerate runs all but a step's last micro-batch under
             `no_sync`, so FSDP2 accumulates unsharded float32 gradients until the last one);
             when those do not fit, the plan reduce-scatters every micro-batch instead
             (accelerate's `sync_each_batch`) and counts only the shards
           + TRL's fused head in the backward: its float32 weight-gradient accumulator and two
             logit tiles (`fused_head_bytes`; bf16 autocast runs without its weight cache, which
             would hold a bf16 copy of every trainable layer until the forward ends:
             cobalt.training.machinery.precision)
           + a reserve (2 GiB + 5% of the GPU: allocator fragmentation, CUDA context, NCCL)
    per micro-batch = its rows' activations in a checkpointed pass
    (cobalt.training.machinery.activations:
             each row at its longest; with --share-prompts each prompt's tokens counted once)

On one H200 (`scripts/gpu/memory_calibrate.py`; docs/RESULTS.md, the memory plan) this bounds what a
pass of 1-16 rows of 1,187 tokens and of 1-2 rows of 16,041 allocates, 1.0-1.6x, at 4 and 12 layers
of the 8B width (`tests/training/test_memory_calibration.py`).

The micro-batch holds at most `PADDED_ROWS` rows when rows are padded (a bigger one pads more
rows to its longest) and `PACKED_ROWS` with packed passes (no padding: a bigger micro-batch only
means fewer, larger kernels and fewer FSDP gathers a step, and more of a prompt's samples in one
micro-batch to share it); either way every row is counted at its longest, so a packed micro-batch
never holds more than the estimate. The loss is a token mean over the whole optimizer step
("dapo"), so how a step's rows are cut into micro-batches changes only the rounding.

`TrainingMemoryError` names the settings to change when even one sequence does not fit;
`check_holds` fails before any work when a strategy cannot hold the model's state at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from cobalt.errors import UserError
from cobalt.training.machinery.activations import (
    fused_head_bytes,
    micro_batch_bytes,
    prompts_in_micro_batch,
    sequence_bytes,
)
from engines.memory import (
    dtype_bytes,
    kv_bytes_per_token,
    text_config,
)

GIB = 1 << 30
PADDED_ROWS = 16  # the most rows in a padded or trimmed micro-batch
PACKED_ROWS = 64  # the most rows in a packed micro-batch (training.packing)


class TrainingMemoryError(UserError):
    """The model, a micro-batch of one sequence or the processes' copies do not fit; the message
    names the setting to change."""


@dataclass(frozen=True)
class MicroBatchPlan:
    micro_batch: int
    gradient_accumulation_steps: int
    estimate_gib: float  # the chosen micro-batch's whole estimate
    free_gib: float
    fixed_gib: float
    per_sequence_gib: float
    sequence_tokens: int
    reduce_every_micro_batch: bool = False  # FSDP's gradients reduce-scattered each micro-batch
    prompts_per_micro_batch: int | None = None  # --share-prompts: the prompts computed once each

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"memory plan: micro-batch {self.micro_batch} x {self.gradient_accumulation_steps} "
            f"accumulation steps; sequences of {self.sequence_tokens} tokens need "
            f"{self.per_sequence_gib:.1f} GiB each over {self.fixed_gib:.1f} GiB fixed, "
            f"{self.estimate_gib:.1f} of {self.free_gib:.1f} GiB free"
            + (
                "; gradients reduce-scattered every micro-batch, not held whole until the "
                "step's last (training.gradient_sync)"
                if self.reduce_every_micro_batch
                else ""
            )
            + (
                f"; its rows' prompts shared: {self.prompts_per_micro_batch} computed once for "
                f"{self.micro_batch} rows"
                if self.prompts_per_micro_batch is not None
                else ""
            )
        )


def fixed_bytes(
    parameters: int,
    *,
    trainable: int,
    trainable_dtype: str,
    frozen_dtype: str,
    reference_model: bool,
    vllm_bytes: int,
    total_bytes: int,
    shards: int = 1,
    gathered_bytes: int = 0,
    pass_bytes: int = 0,
) -> int:
    """Everything but the per-sequence activations and the gradients held whole (see the
    module docstring); `shards`: the processes fsdp / zero3 spread the model's state and the
    reference model over; `gathered_bytes`: what a sharded process holds whole at a time
    (`gathered_bytes`); `pass_bytes`: a pass's own buffers (`fused_head_bytes`)."""
    return (
        state_bytes(
            parameters,
            trainable=trainable,
            trainable_dtype=trainable_dtype,
            frozen_dtype=frozen_dtype,
            reference_model=reference_model,
            shards=shards,
        )
        + vllm_bytes
        + (gathered_bytes if shards > 1 else 0)
        + pass_bytes
        + 2 * GIB
        + total_bytes // 20  # reserve: fragmentation, CUDA context, NCCL
    )


def held_gradient_bytes(trainable: int, shards: int) -> int:
    """What FSDP holds beyond its gradient shard between the micro-batches of a step: the whole
    float32 gradients (accelerate's `no_sync` until the step's last micro-batch) less the
    1/shards `state_bytes` counts."""
    return trainable * 4 * (shards - 1) // shards if shards > 1 else 0


def state_bytes(
    parameters: int,
    *,
    trainable: int,
    trainable_dtype: str,
    frozen_dtype: str,
    reference_model: bool,
    shards: int = 1,
) -> int:
    """A GPU's share of the model: weights, gradients and Adam's moments of what is trained,
    the frozen base and the reference model, divided by `shards` when sharded."""
    master = dtype_bytes(trainable_dtype)
    frozen = dtype_bytes(frozen_dtype)
    base = (parameters - trainable) * frozen
    learned = trainable * (2 * master + 8)  # weights, gradients, Adam's m and v (fp32)
    reference = parameters * frozen if reference_model else 0
    return (base + learned + reference) // shards


def gathered_bytes(model_config: Any, trainable_dtype: str, layers_dtype: str | None = None) -> int:
    """What a sharded process holds whole at a time, in the trainable dtype: the root's weights
    (embeddings and an untied head: FSDP keeps the root gathered from the forward to the end of
    the backward), the head's gradient (the first one the backward makes, the root's are
    reduced last) and two decoder layers (one computing, one prefetched) with their gradients,
    those in `layers_dtype` when it differs (`fsdp_gather` bf16-linear)."""
    config = text_config(model_config)
    hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    head = int(config.vocab_size) * hidden
    root = head * (1 if tied else 2)
    per_layer = layer_parameters(model_config) // max(layers, 1)
    layers = 4 * per_layer * dtype_bytes(layers_dtype or trainable_dtype)
    return (root + head) * dtype_bytes(trainable_dtype) + layers


def layer_parameters(model_config: Any) -> int:
    """The decoder layers' parameters (everything but the embeddings, the head and the final
    norm)."""
    config = text_config(model_config)
    hidden = int(config.hidden_size)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    root = int(config.vocab_size) * hidden * (1 if tied else 2)
    return parameter_count(model_config) - root - hidden


def parameter_count(model_config: Any) -> int:
    """Parameters of a decoder-only transformer from its config (embeddings, attention with
    its biases where the family has them, the gated MLP, norms, an untied head)."""
    config = text_config(model_config)
    hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head = int(getattr(config, "head_dim", None) or hidden // heads)
    inter = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    vocab = int(config.vocab_size)
    attention = hidden * head * (heads + 2 * kv_heads) + heads * head * hidden
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


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
    largest: int = PADDED_ROWS,
    held: int = 0,
    group: int = 1,
) -> MicroBatchPlan:
    """The largest divisor of `sequences_per_step` (at most `largest`) whose estimate fits
    `free_bytes`; `held`: bytes added when the step takes more than one micro-batch (gradients
    held whole between them); `group`: rows sharing a prompt that --share-prompts computes once
    (1: none); `TrainingMemoryError` when not even 1 row fits."""
    length = prompt_tokens + completion_tokens
    numerics = {"compute_dtype": compute_dtype, "residual_dtype": residual_dtype}
    each = sequence_bytes(model_config, length, completion_tokens, **numerics)

    def rows_bytes(m: int) -> int:
        return micro_batch_bytes(
            model_config,
            m,
            prompt_tokens,
            completion_tokens,
            group=group,
            rows_per_step=sequences_per_step,
            **numerics,
        )

    def base(m: int) -> int:
        return fixed + (held if sequences_per_step // m > 1 else 0)

    fits = [
        m
        for m in range(1, min(largest, sequences_per_step) + 1)
        if sequences_per_step % m == 0 and base(m) + rows_bytes(m) <= free_bytes
    ]
    if not fits:
        need = base(1)
        holding = (
            f", {held / GIB:.1f} of it the gradients held whole between micro-batches: "
            "--gradient-sync auto or micro_batch reduces them every micro-batch"
            if need > fixed
            else ""
        )
        raise TrainingMemoryError(
            f"one sequence of {prompt_tokens} prompt + {completion_tokens} completion tokens "
            f"needs about {(need + each) / GIB:.1f} GiB ({need / GIB:.1f} fixed: weights, "
            f"optimizer, vLLM's share{holding}; {each / GIB:.1f} activations) but "
            f"{free_bytes / GIB:.1f} GiB are free: lower max_completion_length or "
            "training.max_prompt_length (--set / "
            "--max-prompt-tokens), train LoRA adapters (training.lora), lower "
            "vllm_gpu_memory_utilization, or spread the model over more GPUs "
            "(training.num_processes with a DeepSpeed ZeRO-3 / FSDP accelerate_config)"
        )
    m = max(fits)
    return MicroBatchPlan(
        micro_batch=m,
        gradient_accumulation_steps=sequences_per_step // m,
        estimate_gib=round((base(m) + rows_bytes(m)) / GIB, 2),
        free_gib=round(free_bytes / GIB, 2),
        fixed_gib=round(base(m) / GIB, 2),
        per_sequence_gib=round(each / GIB, 2),
        sequence_tokens=length,
        prompts_per_micro_batch=prompts_in_micro_batch(m, group, sequences_per_step)
        if group > 1
        else None,
    )


# the shardings whose gradients stay whole between a step's micro-batches (accelerate's no_sync
# with FSDP2); ZeRO-3 partitions them every micro-batch, DDP holds them whole anyway
HOLDS_WHOLE = ("fsdp", "hybrid")


def fit_micro_batch(
    config: Any,
    kwargs: dict[str, Any],
    model_config: Any,
    parameters: int,
    numerics: Any,
    longest_prompt: int,
    *,
    shards: int,
    gpu_bytes: int,
    completion_tokens: int | None = None,
    sharding: str = "ddp",
) -> MicroBatchPlan:
    """The paper preset's micro-batch for a process: `kwargs` are the GRPOConfig fields (their
    per-device batch x accumulation is the step's size per process), `numerics` a
    `cobalt.training.decisions.Numerics`, `shards` the processes fsdp / zero3 spread the model
    over (1: ddp or one process), `gpu_bytes` the GPU memory the run's plan gives every process
    (never this process's own free memory: every process must reach the same plan),
    `completion_tokens` a sequence's longest completion (default max_completion_length; a
    multi-turn conversation holds several turns: `multi_turn_completion_tokens`) and `sharding`
    the run's (fsdp and hybrid hold a step's gradients whole between its micro-batches).

    Under FSDP, `training.gradient_sync` decides: `step` holds the gradients whole until a
    step's last micro-batch (one reduce-scatter a step), `micro_batch` reduce-scatters every
    micro-batch (only the shards held), `auto` holds them unless that does not fit, or fits so
    few rows that the step moves more bytes: each micro-batch gathers the model twice (forward,
    backward), so holding costs 2 gathers a micro-batch + 1 reduce-scatter, reducing every
    micro-batch 2 gathers + 1 reduce-scatter each (a float32 gather moves what the float32
    reduce-scatter does, a bf16 one half)."""
    completion = int(completion_tokens or kwargs["max_completion_length"])
    full = not config.lora  # LoRA's adapters: ~0.5% of 8B, not counted
    compute = "bfloat16" if numerics.compute != "float32" else "float32"
    fixed = fixed_bytes(
        parameters,
        trainable=parameters if full else 0,
        trainable_dtype=numerics.trainable,
        frozen_dtype=numerics.frozen,
        reference_model=full and bool(kwargs.get("beta")),
        vllm_bytes=vllm_awake_bytes(kwargs, gpu_bytes)
        + (
            sampler_copy_bytes(parameters, not full, numerics.trainable, numerics.frozen)
            if config.async_generation and not kwargs.get("use_vllm")
            else 0
        ),
        total_bytes=gpu_bytes,
        shards=shards,
        gathered_bytes=gathered_bytes(
            model_config,
            "bfloat16" if config.fsdp_gather == "bfloat16" else numerics.trainable,
            "bfloat16" if config.fsdp_gather == "bf16-linear" else None,
        ),
        pass_bytes=fused_head_bytes(model_config, compute),
    )

    def plan(held: int) -> MicroBatchPlan:
        return plan_micro_batch(
            model_config,
            sequences_per_step=int(kwargs["per_device_train_batch_size"])
            * int(kwargs["gradient_accumulation_steps"]),
            prompt_tokens=longest_prompt,
            completion_tokens=completion,
            free_bytes=gpu_bytes,
            fixed=fixed,
            compute_dtype=compute,
            residual_dtype="bfloat16" if numerics.trainable == "bfloat16" else "float32",
            largest=PACKED_ROWS if config.packing else PADDED_ROWS,
            held=held,
            group=int(kwargs.get("num_generations") or 1) if config.share_prompts else 1,
        )

    held = held_gradient_bytes(parameters, shards) if full and sharding in HOLDS_WHOLE else 0
    sync = config.gradient_sync
    if not held or sync == "step":
        return plan(held)
    every = plan(0)
    every = replace(every, reduce_every_micro_batch=every.gradient_accumulation_steps > 1)
    if sync == "micro_batch":
        return every
    try:
        holding = plan(held)
    except TrainingMemoryError:
        return every
    gather = 1.0 if config.fsdp_gather == "float32" else 0.5  # a gather's bytes / a reduction's
    holding_moves = holding.gradient_accumulation_steps * 2 * gather + 1
    every_moves = every.gradient_accumulation_steps * (2 * gather + 1)
    return holding if holding_moves <= every_moves else every


# the most tokens one feedback turn adds between two assistant turns: METHOD §1.2's report (input,
# output, expected: each cut to 400 characters) and the user turn's instructions, in the chat
# template's framing (~2,000 characters)
FEEDBACK_TOKENS = 1024


def multi_turn_completion_tokens(
    max_completion: int, turns: int, prompt: int, max_context: int | None = None
) -> int:
    """The longest completion of a multi-turn conversation
    (`cobalt.training.method.multiturn_rollout`): `turns` + 1 assistant turns of up to
    `max_completion` tokens and `turns` feedback turns between
    them; a conversation stops growing past `max_context` tokens, then samples one more turn."""
    whole = (turns + 1) * max_completion + turns * FEEDBACK_TOKENS
    if max_context is not None:
        whole = min(whole, max(0, max_context - prompt) + max_completion)
    return whole


def vllm_awake_bytes(kwargs: dict[str, Any], total: int) -> int:
    """What a colocated vLLM holds while the optimizer steps: its share, or 0 asleep."""
    colocated = kwargs.get("use_vllm") and kwargs.get("vllm_mode", "colocate") == "colocate"
    if not colocated or kwargs.get("vllm_enable_sleep_mode"):
        return 0
    return int(float(kwargs.get("vllm_gpu_memory_utilization", 0.3)) * total)


# vLLM's own activations, CUDA graphs and sampler beside its weights and KV cache (measured at
# 8B: ~2-3 GiB); part of the share `vllm_share` plans
VLLM_OVERHEAD = 4 * GIB


def vllm_share(
    model_config: Any,
    *,
    sequences: int,
    context_tokens: int,
    total_bytes: int,
    resident_bytes: int,
    tensor_parallel: int = 1,
) -> float:
    """`vllm_gpu_memory_utilization` for a colocated vLLM that sleeps while the optimizer steps:
    its bf16 weights, the KV cache of the `sequences` this process generates at once at their
    longest (`context_tokens`), and its overhead; at most what the training state resident
    beside it (`resident_bytes`: the process's shards, the reference model) and the reserve
    leave. vLLM pages the cache, so a share below the longest case still runs (it queues).
    TrainingMemoryError when not even one full-length sequence fits beside the state."""
    config = text_config(model_config)
    weights = parameter_count(config) * 2 // tensor_parallel
    kv_token = kv_bytes_per_token(config, 2) // tensor_parallel
    reserve = 2 * GIB + total_bytes // 20
    room = total_bytes - resident_bytes - reserve
    least = weights + context_tokens * kv_token + VLLM_OVERHEAD
    if least > room:
        raise TrainingMemoryError(
            f"a colocated vLLM needs {least / GIB:.1f} GiB (bf16 weights and one sequence of "
            f"{context_tokens} tokens) but only {room / GIB:.1f} GiB of the GPU's "
            f"{total_bytes / GIB:.0f} are left beside the training state ({resident_bytes / GIB:.1f} "
            "GiB): spread the model over more GPUs (--gpus N --sharding fsdp), train LoRA "
            "adapters (--lora), lower max_completion_length, or generate on a server "
            "(training.generation vllm_server)"
        )
    want = weights + sequences * context_tokens * kv_token + VLLM_OVERHEAD
    return round(min(want, room) / total_bytes, 3)


def sampler_copy_bytes(parameters: int, lora: bool, trainable_dtype: str, frozen_dtype: str) -> int:
    """--async with transformers generation: the whole policy copied once more on every process
    (`cobalt.training.machinery.overlap.TransformersCopy`), in the dtype it was loaded in (LoRA: the
    frozen
    base's; the adapters are not counted)."""
    return parameters * dtype_bytes(frozen_dtype if lora else trainable_dtype)


def check_holds(
    model_config: Any,
    *,
    lora: bool,
    reference_model: bool,
    trainable_dtype: str,
    frozen_dtype: str,
    shards: int,
    sharding: str,
    gpu_bytes: int,
    processes: int,
    vllm_bytes: int = 0,
    copy: int = 0,
) -> None:
    """Before any work: a GPU can hold its share of the model's state under this strategy, with
    the reserve, room for one layer's activations and what a colocated vLLM holds beside it
    (`vllm_bytes`: its bf16 weights when it sleeps, its share awake); `copy`: and the bytes of
    --async's copy of the policy (`sampler_copy_bytes`). TrainingMemoryError names the fix."""
    parameters = parameter_count(model_config)
    state = state_bytes(
        parameters,
        trainable=0 if lora else parameters,
        trainable_dtype=trainable_dtype,
        frozen_dtype=frozen_dtype,
        reference_model=reference_model,
        shards=shards,
    )
    room = gpu_bytes - 2 * GIB - gpu_bytes // 20 - 4 * GIB - vllm_bytes
    if state + copy <= room:
        return
    if copy and state <= room:  # vLLM instead of the copy: awake, TRL's 0.3 of the GPU at least
        vllm = state + max(parameters * 2, vllm_awake_bytes({"use_vllm": True}, gpu_bytes)) <= room
        raise TrainingMemoryError(
            f"training.async_generation with transformers generation on {processes} GPU(s): "
            f"each GPU would hold {state / GIB:.0f} GiB of the model's state and a "
            f"{copy / GIB:.0f} GiB copy of the policy sampling in the background, but has "
            f"{gpu_bytes / GIB:.0f} GiB: "
            f"{'generate with vLLM (training.generation vllm_colocate), ' if vllm else ''}"
            "spread the model over more GPUs, or drop --async"
        )
    need = (state * shards) // GIB
    fewest = next((n for n in (2, 4, 8, 16, 32, 64) if state * shards // n <= room), None)
    more = f"--gpus {fewest} --sharding fsdp" if fewest else "more GPUs or several machines"
    raise TrainingMemoryError(
        f"training.sharding {sharding} on {processes} GPU(s): each GPU would hold "
        f"{state / GIB:.0f} GiB of the model's state ({parameters / 1e9:.1f}B parameters, "
        f"{need:.0f} GiB in all: {trainable_dtype} weights, gradients and Adam's moments"
        f"{', a reference model' if reference_model else ''}) but has {gpu_bytes / GIB:.0f} GiB"
        f"{' with a colocated vLLM beside it' if vllm_bytes else ''}: "
        f"use {more}, or train LoRA adapters (--lora)"
    )
