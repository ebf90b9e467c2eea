"""Long module: the plan and every check it makes before any work, kept together (the checks read
the plan's inputs and end in its one-line refusals).

The training stage's GPU plan: decided once, before any work, from the machine
(`engines.machine`) and the settings, printed with them, and followed by everything after it.

It holds what every training process must agree on: how many processes and how they share the
model (the sharding, a user's accelerate file's own when one is given), the numerics (mixed
precision: bf16 compute, fp32 master weights, gradients reduced in fp32), the GPU memory every
process plans its micro-batch against (the smallest visible GPU's: a process never measures its
own GPU, whose free memory differs with the contexts other processes opened on it), a colocated
vLLM's share of each GPU, the host memory the processes need while they load the model, and how
long a process waits for the others in a collective. `plan_training` raises a one-line error
naming the setting and the fix when any of it cannot work here. The launch takes its processes,
accelerate config and mixed precision from the plan (`cobalt.training.launch`); each process its
memory budget and vLLM share (`cobalt.training.grpo`), and checks at start that every process
planned the same micro-batch (`same_on_every_process`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from cobalt.errors import UserError
from cobalt.training.decisions import (
    SHARDED,
    SHARDINGS,
    Numerics,
    ShardingError,
    check_batch,
    check_save_steps,
    checkpoint_dtype,
    decide,
    resolve_sharding,
)
from cobalt.training.machinery.memory import (
    GIB,
    MicroBatchPlan,
    TrainingMemoryError,
    check_holds,
    fit_micro_batch,
    multi_turn_completion_tokens,
    parameter_count,
    sampler_copy_bytes,
    state_bytes,
    vllm_awake_bytes,
    vllm_share,
)
from cobalt.training.machinery.sharding import config_file
from cobalt.training.settings import TrainingConfig
from engines.machine import Machine, detect

HOST_HEADROOM = 0.9  # of the host memory free at the plan: what loading may take
FP8_CAPABILITY = (8, 9)  # vLLM's fp8 kernels: Ada, Hopper and later
# the plan line's words for FSDP's gather policies (training.fsdp_gather) other than one dtype
GATHERED = {"bf16-linear": "linear layers gathered in bfloat16, the rest in float32"}


class TrainingPlan(BaseModel):
    """Where and how a training run computes; the same for every one of its processes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    processes: int  # in all: per_node on each of the nodes
    nodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port where the nodes meet (nodes > 1)
    rendezvous_timeout_s: int = 600
    sharding: str  # ddp, fsdp, zero3 or hybrid
    accelerate_config: str | None  # the file the launch passes (None: one process)
    mixed_precision: str  # bf16 or no: the launch's --mixed_precision
    precision: str  # mixed, fp32 or bf16
    reduce_dtype: str  # gradients summed across processes in this dtype
    numerics: Numerics  # every dtype of the run (the trainers read it: nothing decides it again)
    gather_dtype: str = "float32"  # FSDP gathers the layers in this dtype under mixed precision
    gpus: int  # visible on the machine planned for
    gpu_bytes: int  # each process plans its micro-batch against this (the smallest GPU's)
    plans_micro_batch: bool = False  # the preset plans it from memory (paper)
    generation: str  # how GRPO samples (offline: none)
    one_step_off: bool = False  # --async: sampling overlapped with training, staleness 1
    passes: str = "padded"  # GRPO's forward passes: padded (TRL's), trimmed or packed
    parameters: int | None = None  # the policy's, when its config was there to count
    vllm_share: float | None = None  # a colocated, sleeping vLLM's gpu_memory_utilization
    server_gpus: int = 0  # a vLLM server the launch starts on the GPUs after the processes'
    fp8_generation: bool = False  # that server (or the user's) samples in fp8
    fp8_kv_cache: bool = False  # that server (or the user's) keeps its KV cache in fp8
    importance_sampling: str | None = None  # TRL's correction of vLLM's samples: its mode, if on
    host_bytes_needed: int | None = None  # every process loading its copies at once
    host_bytes_free: int = 0
    collective_timeout_s: int = 600

    @property
    def per_node(self) -> int:
        return self.processes // self.nodes

    @property
    def shards(self) -> int:
        """Processes the model's state is spread over (1: every process holds all of it;
        hybrid: a node's)."""
        if self.sharding == "hybrid":
            return self.per_node
        return self.processes if self.sharding in SHARDED else 1

    def fp8_what(self) -> str:
        """What the sampler computes in fp8, in the plan's words."""
        parts = ["sampling in fp8 (vLLM's online quantization)"] if self.fp8_generation else []
        parts += ["keys and values cached in fp8"] if self.fp8_kv_cache else []
        return ", ".join(parts)

    def describe(self) -> str:
        where = f"{self.processes} process{'es' if self.processes > 1 else ''}"
        if self.nodes > 1:
            where += f" ({self.per_node} on each of {self.nodes} nodes, this one node "
            where += f"{self.node_rank}, meeting at {self.rdzv_endpoint})"
        where += f" on {'GPUs' if self.gpus else 'the CPU (gloo)'}"
        if self.processes > 1:
            where += f", {self.sharding}"
        parts = [
            where,
            f"precision {self.precision} (gradients reduced in {self.reduce_dtype}"
            + (
                f", {GATHERED.get(self.gather_dtype, f'layers gathered in {self.gather_dtype}')})"
                if self.sharding in ("fsdp", "hybrid") and self.processes > 1
                else ")"
            ),
            f"micro-batch planned for {self.gpu_bytes / GIB:.0f} GiB a GPU on every process"
            if self.gpus and self.plans_micro_batch
            else "",
            (
                f"generation on a vLLM server of the run's own ({self.server_gpus} GPU"
                f"{'s' if self.server_gpus > 1 else ''} after the training processes', the "
                "weights sent by NCCL each step)"
                if self.server_gpus
                else f"generation {self.generation}"
            )
            + (
                ", overlapped with training, one step off"
                if self.one_step_off and self.server_gpus
                else " overlapped with training, one step off (vLLM awake beside it)"
                if self.one_step_off and self.generation.startswith("vllm")
                else " overlapped with training, one step off (a copy of the policy samples)"
                if self.one_step_off
                else ""
            )
            + (
                f", {self.fp8_what()}; importance-sampling correction "
                f"{self.importance_sampling or 'off'}"
                if self.fp8_generation or self.fp8_kv_cache
                else ""
            )
            if self.generation != "none"
            else "",
            f"{self.passes} forward passes" if self.generation != "none" else "",
            f"vLLM colocated, asleep while the optimizer steps: {self.vllm_share} of each GPU"
            if self.vllm_share
            else "",
            f"host memory at load ~{self.host_bytes_needed / GIB:.0f} of "
            f"{self.host_bytes_free / GIB:.0f} GiB free"
            if self.host_bytes_needed
            else "",
            f"a process waits {self.collective_timeout_s} s for the others"
            if self.processes > 1
            else "",
        ]
        return "; ".join(p for p in parts if p)


def plan_training(
    config: TrainingConfig,
    model: str | Path | None = None,
    machine: Machine | None = None,
    parameters: int | None = None,
) -> TrainingPlan:
    """The plan of `config` for the policy in directory `model` (None, or a directory without
    config.json yet: a model the flow builds later, planned without its memory; `parameters`
    stands for its size in auto's choice of generation) on `machine` (None: this one).
    ShardingError / TrainingMemoryError / ValueError name what to change."""
    machine = machine or detect()
    gpus = machine.gpus
    check_processes(config, gpus, machine.gpu_capability)
    sharding = resolve_sharding(config, gpus)
    has_config = model is not None and Path(model, "config.json").is_file()
    checkpoint = checkpoint_dtype(model) if has_config else "float32"
    numerics = decide(
        config.precision, checkpoint, gpu=gpus > 0, mixed=config.defaults().mixed_precision
    )
    processes = config.world()
    generation, kwargs = "none", None
    if config.mode == "offline":
        config.offline_micro_batches()  # the step's rows split over the processes
    else:
        kwargs = config.grpo_kwargs("plan", model if has_config else None, gpus)
        check_batch(kwargs, processes)
        check_save_steps(kwargs, processes)
        generation, _ = config.generation_choice(
            gpus > 0, model if has_config else None, parameters
        )
    launch = config.accelerate_config
    if launch is None and processes > 1:
        launch = str(config_file(sharding))
    plan = TrainingPlan(
        processes=processes,
        nodes=config.nodes,
        node_rank=config.node_rank,
        rdzv_endpoint=config.rdzv_endpoint,
        rendezvous_timeout_s=config.rendezvous_timeout_s,
        sharding=sharding,
        accelerate_config=launch,
        mixed_precision="bf16" if numerics.precision == "mixed" else "no",
        precision=numerics.precision,
        reduce_dtype=numerics.reduce,
        numerics=numerics,
        gather_dtype=config.fsdp_gather if numerics.autocast else numerics.trainable,
        gpus=gpus,
        gpu_bytes=machine.gpu_bytes,
        plans_micro_batch=config.defaults().plan_micro_batch,
        generation=generation,
        one_step_off=config.async_generation,
        server_gpus=config.vllm_server_gpus,
        fp8_generation=config.fp8_generation,
        fp8_kv_cache=config.fp8_kv_cache,
        importance_sampling=(kwargs or {}).get("vllm_importance_sampling_mode", "sequence_mask")
        if (kwargs or {}).get("vllm_importance_sampling_correction")
        else None,
        passes=(
            "packed (prompts shared)"
            if config.share_prompts
            else "packed"
            if config.packing
            else "trimmed"
            if config.trims_padding()
            else "padded"
        ),
        host_bytes_free=machine.host_bytes,
        collective_timeout_s=config.collective_timeout_s,
    )
    if not has_config:
        return plan
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(str(model))
    if kwargs is not None:
        check_context(config, kwargs, model_config, model)
    parameters = parameter_count(model_config)
    reference = (
        config.mode != "offline" and config.lora is None and bool((kwargs or {}).get("beta"))
    )
    colocated = generation == "vllm_colocate"
    if gpus:
        check_holds(
            model_config,
            lora=config.lora is not None,
            reference_model=reference,
            trainable_dtype=numerics.trainable,
            frozen_dtype=numerics.frozen,
            shards=plan.shards,
            sharding=sharding,
            gpu_bytes=machine.gpu_bytes,
            processes=processes,
            vllm_bytes=max(parameters * 2, vllm_awake_bytes(kwargs or {}, machine.gpu_bytes))
            if colocated
            else 0,
            copy=sampler_copy_bytes(
                parameters, config.lora is not None, numerics.trainable, numerics.frozen
            )
            if config.async_generation and generation == "transformers"
            else 0,
        )
    share = None
    if gpus and colocated and kwargs and kwargs.get("vllm_enable_sleep_mode"):
        share = colocated_share(config, kwargs, model_config, numerics, plan, parameters)
    if (
        gpus
        and kwargs
        and plan.plans_micro_batch
        and "per_device_train_batch_size" not in config.overrides
    ):
        # the processes plan their micro-batch once loaded, from the rows' longest prompt (the
        # launch and vLLM's start before it): one row must fit already with a 1-token prompt and
        # a multi-turn completion at its shortest (after the longest prompt the limit lets in), a
        # lower bound of theirs, so never a false refusal
        shared = {} if share is None else {"vllm_gpu_memory_utilization": share}
        try:
            planned_micro_batch(
                config,
                kwargs | shared,
                model_config,
                parameters,
                numerics,
                plan,
                1,
                completion_after=config.prompt_limit(),
            )
        except TrainingMemoryError as refused:
            raise TrainingMemoryError(
                f"the planned micro-batch cannot hold one row on {plan.processes} GPU(s) of "
                f"{plan.gpu_bytes / GIB:.0f} GiB ({plan.sharding}), even with a 1-token prompt: "
                f"{refused}"
            ) from None
    needed = host_bytes(config, parameters, numerics, plan.shards, sharding, reference)
    check_host_memory(needed, machine, config.num_processes, sharding)
    return plan.model_copy(
        update={"parameters": parameters, "vllm_share": share, "host_bytes_needed": needed}
    )


def planned_micro_batch(
    config: TrainingConfig,
    kwargs: dict[str, Any],
    model_config: Any,
    parameters: int,
    numerics: Any,
    plan: TrainingPlan,
    prompt: int,
    *,
    completion_after: int | None = None,
) -> MicroBatchPlan:
    """The micro-batch a training process plans (`fit_micro_batch`) for rows whose longest prompt
    has `prompt` tokens, against the plan's GPU memory and sharding; a multi-turn completion holds
    every turn and its feedback, counted after a prompt of `completion_after` tokens (default:
    `prompt`). TrainingMemoryError when not one row fits."""
    completion = None
    if config.mode == "multi_turn":
        completion = multi_turn_completion_tokens(
            int(kwargs["max_completion_length"]),
            config.turns,
            prompt if completion_after is None else completion_after,
            kwargs.get("vllm_max_model_length"),
        )
    return fit_micro_batch(
        config,
        kwargs,
        model_config,
        parameters,
        numerics,
        prompt,
        shards=plan.shards,
        gpu_bytes=plan.gpu_bytes,
        completion_tokens=completion,
        sharding=plan.sharding,
    )


def check_context(
    config: TrainingConfig, kwargs: dict[str, Any], model_config: Any, model: str | Path
) -> None:
    """With vLLM generating, its context (a prompt at the limit and its completion, or
    `--set vllm_max_model_length`) fits the model's positions: vLLM refuses a longer one at
    start-up, after the stage has loaded everything."""
    positions = getattr(model_config, "max_position_embeddings", None)
    if not positions or not kwargs.get("use_vllm"):
        return
    completion = int(kwargs["max_completion_length"])
    if "vllm_max_model_length" in config.overrides:
        context = int(config.overrides["vllm_max_model_length"])
        if context > positions:
            raise UserError(
                f"training.overrides vllm_max_model_length {context} exceeds the model's "
                f"{positions} positions (max_position_embeddings in {model}/config.json): "
                f"use --set vllm_max_model_length={positions} or less"
            )
        return
    context = config.prompt_limit() + completion
    if context > positions:
        raise UserError(
            f"training.max_prompt_length {config.prompt_limit()} + max_completion_length "
            f"{completion} = {context} tokens exceed the model's {positions} positions "
            f"(max_position_embeddings in {model}/config.json): lower training.max_prompt_length "
            f"to {positions - completion} or less, or max_completion_length (--set)"
        )


def check_processes(
    config: TrainingConfig, gpus: int, capability: tuple[int, int] = FP8_CAPABILITY
) -> None:
    """The process count and sharding can run on a machine with `gpus` GPUs (of at least
    `capability`, the compute capability that fp8 generation on the stage's server needs)."""
    n, asked = config.num_processes, config.sharding
    if config.accelerate_config and asked != "auto":
        raise ShardingError(
            f"training.accelerate_config ({config.accelerate_config}) decides the distribution, "
            f"so training.sharding {asked} would be ignored: set one of them (--sharding or "
            "--accelerate-config)"
        )
    if config.accelerate_config and not Path(config.accelerate_config).is_file():
        raise ShardingError(
            f"training.accelerate_config {config.accelerate_config}: no such file; pass an "
            f"accelerate config file, or --sharding {'|'.join(SHARDINGS[1:])}"
        )
    server = config.vllm_server_gpus
    if gpus and n + server > gpus:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        if server:
            raise ShardingError(
                f"training.num_processes {n} (--gpus) and vllm_server_gpus {server} "
                f"(--vllm-server-gpus) take {n + server} GPUs: this machine has {gpus}{where}; "
                f"pass --gpus {max(gpus - server, 1)} --vllm-server-gpus {min(server, gpus - 1)}"
                " or fewer"
            )
        raise ShardingError(
            f"training.num_processes {n} (--gpus): this machine has {gpus} GPU(s){where}; pass "
            f"--gpus {gpus} or fewer"
        )
    if server and not gpus:
        raise ShardingError(
            "training.vllm_server_gpus: a vLLM server needs GPUs and this machine has none; "
            "drop --vllm-server-gpus"
        )
    for field, flag in (("fp8_generation", "--fp8-generation"), ("fp8_kv_cache", "--fp8-kv-cache")):
        if server and getattr(config, field) and capability < FP8_CAPABILITY:
            raise ShardingError(
                f"training.{field}: vLLM's fp8 needs GPUs of compute capability "
                f"{'.'.join(map(str, FP8_CAPABILITY))} or more (Ada, Hopper); this machine's "
                f"is {'.'.join(map(str, capability))}: drop {flag}"
            )
    sharding = resolve_sharding(config, gpus)
    if sharding in SHARDED and config.world() == 1:
        raise ShardingError(
            f"training.sharding {sharding} on 1 process shards nothing: pass --gpus N (N > 1), "
            "or --sharding ddp"
        )
    if sharding == "hybrid" and config.nodes < 2:
        raise ShardingError(
            "training.sharding hybrid shards within each node and replicates across nodes: on "
            f"{config.nodes} node pass --sharding fsdp, or --nodes N (N > 1)"
        )
    check_fsdp_devices(sharding, gpus)
    if sharding == "zero3" and importlib.util.find_spec("deepspeed") is None:
        raise ShardingError(
            "training.sharding zero3 needs DeepSpeed, which is not installed: pip install "
            "deepspeed, or use --sharding fsdp (the same memory per GPU, no extra package)"
        )


def check_fsdp_devices(sharding: str, gpus: int) -> None:
    """FSDP needs GPUs: accelerate runs an FSDP config on CPU processes as plain DDP, which
    would train unsharded under an fsdp label. (The tests lift accelerate's gate to measure FSDP
    on CPU processes: tests/support/fsdp_on_cpu.)"""
    if sharding in ("fsdp", "hybrid") and not gpus:
        raise ShardingError(
            f"training.sharding {sharding}: accelerate shards a model with FSDP across GPUs only (it "
            "runs an FSDP config on CPU processes as plain DDP), and this machine has none; on "
            "CPU processes (gloo) use --sharding ddp, or zero3 (DeepSpeed shards on CPUs too)"
        )


def colocated_share(
    config: TrainingConfig,
    kwargs: dict[str, Any],
    model_config: Any,
    numerics: Any,
    plan: TrainingPlan,
    parameters: int,
) -> float:
    """A sleeping colocated vLLM's share of each GPU (`vllm_share`), unless the user set one:
    its weights and the KV cache of a process's share of a generation batch at full length,
    beside the training state that stays on the GPU while it generates."""
    if "vllm_gpu_memory_utilization" in config.overrides:
        return float(config.overrides["vllm_gpu_memory_utilization"])
    resident = state_bytes(
        parameters,
        trainable=0 if config.lora else parameters,
        trainable_dtype=numerics.trainable,
        frozen_dtype=numerics.frozen,
        reference_model=not config.lora and bool(kwargs.get("beta")),
        shards=plan.shards,
    )
    batch = kwargs.get("generation_batch_size") or int(kwargs["per_device_train_batch_size"]) * (
        config.world() * int(kwargs["gradient_accumulation_steps"])
    )
    return vllm_share(
        model_config,
        sequences=max(1, int(batch) // config.world()),
        context_tokens=int(kwargs.get("vllm_max_model_length") or kwargs["max_completion_length"]),
        total_bytes=plan.gpu_bytes,
        resident_bytes=resident,
        tensor_parallel=int(kwargs.get("vllm_tensor_parallel_size", 1)),
    )


def host_bytes(
    config: TrainingConfig,
    parameters: int,
    numerics: Any,
    shards: int,
    sharding: str,
    reference: bool,
) -> int:
    """Host memory the processes of one node hold at once while loading: each loads the policy in
    the dtype it trains (LoRA: the frozen base's) and, with a KL term, TRL's reference model in the
    frozen dtype; under ZeRO-3 the weights are partitioned as they load (each process keeps its
    share), otherwise every process holds a whole copy until the trainer places it (FSDP loads
    in every process: `fsdp_cpu_ram_efficient_loading` is off, see infra/accelerate/fsdp.yaml)."""
    from engines.memory import dtype_bytes

    policy = parameters * dtype_bytes(numerics.frozen if config.lora else numerics.trainable)
    ref = parameters * dtype_bytes(numerics.frozen) if reference else 0
    each = policy + ref
    if sharding == "zero3":
        each //= shards
    return each * config.num_processes


def check_host_memory(needed: int, machine: Machine, processes: int, sharding: str) -> None:
    """The processes' copies fit the host memory free now, else TrainingMemoryError."""
    room = int(machine.host_bytes * HOST_HEADROOM)
    if needed <= room:
        return
    fixes = ["train LoRA adapters (--lora)", "fewer processes (--gpus)"]
    if sharding != "zero3":
        fixes.insert(0, "--sharding zero3 (weights partitioned as they load)")
    raise TrainingMemoryError(
        f"host memory: {processes} training process(es) load the policy (and its reference "
        f"model) at once, ~{needed / GIB:.0f} GiB, but {machine.host_bytes / GIB:.0f} GiB are "
        f"free on this machine: use {', '.join(fixes)}, or a machine with more memory"
    )


def planned_numerics(plan: TrainingPlan, model: str | Path) -> Numerics:
    """The numerics the plan decided, for the trainers; a plan made for a checkpoint of another
    dtype (or before the model was there) is refused rather than trained and saved wrongly."""
    found = checkpoint_dtype(model)
    if plan.numerics.checkpoint != found:
        raise ValueError(
            f"the run's plan was made for a {plan.numerics.checkpoint} checkpoint, {model} is "
            f"{found}: plan the run with its model (plan_training(config, model))"
        )
    return plan.numerics


def same_on_every_process(name: str, value: Any) -> None:
    """Every process of the job computed the same `value` (its micro-batch plan, its node's GPU
    count, ...), else ShardingError naming each process's: processes that disagree would wait
    in mismatched collectives. A no-op in a process that runs alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    if any(v != everyone[0] for v in everyone):
        raise ShardingError(
            f"the training processes disagree on {name} ({everyone}, by process): every process "
            "must follow one plan (cobalt.training.machinery.plan); on several nodes, give every "
            "node as "
            "many GPUs (--gpus) as the others"
        )


def checkpoint_processes(checkpoint: str | Path) -> int | None:
    """How many processes wrote a checkpoint (its per-process RNG states), None if unknown."""
    states = list(Path(checkpoint).glob("rng_state_*.pth"))
    if states:
        return len(states)
    return 1 if Path(checkpoint, "rng_state.pth").is_file() else None


def check_resume(checkpoint: str | Path | None, processes: int) -> None:
    """A run resumes on as many processes as wrote its checkpoint (each process restores its
    own random state and, under FSDP, its shard of the optimizer), else ShardingError."""
    if checkpoint is None:
        return
    wrote = checkpoint_processes(checkpoint)
    if wrote is not None and wrote != processes:
        raise ShardingError(
            f"training: {checkpoint} was written by {wrote} process(es) and this run has "
            f"{processes}: resume with --gpus {wrote}, or start over (--refresh)"
        )
