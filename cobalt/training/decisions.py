"""What a training run decides from its settings and the machine, each decision made by one
function here that every other place reads (the settings' checks, the GPU plan, the trainers, the
launch, the report):

- the GPU count: `engines.visible_gpus` (the GPUs this process may use; the plan's `Machine` reads
  it too);
- the numerics: `resolve_precision` (`auto` made concrete) and `decide` (the dtypes of the trainable
  and frozen weights, the compute, the reduction and the saved model: `Numerics`); how they are
  applied to a model is `cobalt.training.machinery.precision`;
- the sharding: `resolve_sharding` (`auto` made concrete; a user's accelerate file decides by
  itself, `file_sharding`); the accelerate configs and launch environment are
  `cobalt.training.machinery.sharding`;
- the batch's divisibility: `check_batch` (a generation batch splits into whole micro-batches of
  every process and whole prompt groups), `check_save_steps` (checkpoints fall between
  generation batches), `rows_regrouped` (whether the GRPO trainer orders a generation batch's rows
  itself) and `starts_optimizer_step` (what one-step-off generation needs).

Plain functions over plain values: no torch import at module level, nothing of the machinery, so
that the settings (`cobalt.training.settings`) can validate with them before any work.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from cobalt.errors import UserError
from engines import visible_gpus

__all__ = ["visible_gpus"]  # the GPU count, decided in engines (below this layer)

# --- numerics ------------------------------------------------------------------------------------

Precision = Literal["auto", "mixed", "fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("auto", "mixed", "fp32", "bf16")
_FLOATS = {"float32", "bfloat16", "float16"}


@dataclass(frozen=True)
class Numerics:
    """What `decide` chose; `trainable`/`frozen`/`saved` are torch dtype names."""

    precision: str  # mixed, fp32 or bf16 (never auto)
    trainable: str
    compute: str  # "bf16 autocast", "float32" or "bfloat16"
    frozen: str
    saved: str
    checkpoint: str
    reduce: str = "float32"  # gradients summed across processes in this dtype

    @property
    def autocast(self) -> bool:
        return self.compute == "bf16 autocast"

    def trainer_kwargs(self) -> dict[str, Any]:
        """The `TrainingArguments` fields that follow from it: bf16 autocast or none. Pure bf16
        runs without autocast (the weights are already bf16)."""
        return {"bf16": self.autocast, "fp16": False}

    def describe(self) -> str:
        return (
            f"numerics: {self.precision}: trainable weights {self.trainable}, compute "
            f"{self.compute}, frozen weights {self.frozen}, gradients reduced in {self.reduce}, "
            f"saved as {self.saved} (checkpoint {self.checkpoint})"
        )

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def checkpoint_dtype(model_path: str | Path) -> str:
    """The floating dtype a saved model declares in its config.json (`dtype`, or transformers
    4's `torch_dtype`); float32 when it declares none."""
    try:
        config = json.loads(Path(model_path, "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    declared = config.get("dtype") or config.get("torch_dtype") or "float32"
    return declared if declared in _FLOATS else "float32"


def resolve_precision(precision: Precision, *, gpu: bool, mixed: bool) -> str:
    """`auto` made concrete: mixed on a GPU where the preset says so (paper), else fp32."""
    if precision != "auto":
        return precision
    return "mixed" if gpu and mixed else "fp32"


def decide(precision: Precision, checkpoint: str, *, gpu: bool, mixed: bool) -> Numerics:
    """The numerics of a run from the setting, the checkpoint's dtype and the hardware. `mixed`
    asked for on a CPU autocasts to bf16 on the CPU (slow, but the same numerics: what CI checks
    of a GPU's mixed-precision paths); `auto` is fp32 there."""
    chosen = resolve_precision(precision, gpu=gpu, mixed=mixed)
    if chosen == "mixed":
        frozen = checkpoint if checkpoint != "float32" else "bfloat16"
        return Numerics(chosen, "float32", "bf16 autocast", frozen, checkpoint, checkpoint)
    if chosen == "fp32":
        return Numerics(chosen, "float32", "float32", "float32", checkpoint, checkpoint)
    return Numerics(
        chosen, "bfloat16", "bfloat16", "bfloat16", checkpoint, checkpoint, reduce="bfloat16"
    )


# --- sharding and the batch ----------------------------------------------------------------------

Sharding = Literal["auto", "ddp", "fsdp", "zero3", "hybrid"]
SHARDINGS: tuple[str, ...] = get_args(Sharding)
SHARDED = ("fsdp", "zero3", "hybrid")


class ShardingError(UserError):
    """The GPUs or the sharding asked for cannot run here; the message names the setting."""


def resolve_sharding(config: Any, gpus: int) -> str:
    """The strategy a run uses on a machine with `gpus` GPUs: the user's accelerate file's own
    (`file_sharding`), else `config.sharding` with auto made concrete."""
    if config.accelerate_config:
        return file_sharding(config.accelerate_config)
    if config.sharding != "auto":
        return config.sharding
    full = config.lora is None
    return "fsdp" if full and config.world() > 1 and gpus > 0 else "ddp"


def file_sharding(path: str | Path) -> str:
    """What an accelerate config file distributes as: fsdp (FSDP), zero3 (DeepSpeed ZeRO stage
    3), ddp (any other DeepSpeed stage keeps whole weights on every GPU, as do DDP and one
    process)."""
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(path))
    kind = str(getattr(loaded.distributed_type, "value", loaded.distributed_type))
    if kind == "FSDP":
        return "fsdp"
    if kind == "DEEPSPEED":
        stage = (loaded.deepspeed_config or {}).get("zero_stage")
        if stage is None and (loaded.deepspeed_config or {}).get("deepspeed_config_file"):
            stage = json.loads(Path(loaded.deepspeed_config["deepspeed_config_file"]).read_text())
            stage = stage.get("zero_optimization", {}).get("stage")
        return "zero3" if int(stage or 0) == 3 else "ddp"
    return "ddp"


def check_batch(kwargs: dict[str, Any], processes: int) -> None:
    """TRL's generation batch splits into whole per-process micro-batches and whole prompt groups
    (it checks this inside the launched processes only, where a mistake costs the model's load);
    the fix offered is the nearest batch that does both."""
    import math

    per_device = int(kwargs["per_device_train_batch_size"])
    generations = int(kwargs["num_generations"])
    step = per_device * processes
    batch = kwargs.get("generation_batch_size")
    batch = int(batch) if batch is not None else step * int(kwargs["gradient_accumulation_steps"])
    both = math.lcm(step, generations)
    fix = f"--set generation_batch_size={max(both, batch // both * both)}"
    if batch % step:
        raise ShardingError(
            f"training: generation_batch_size {batch} does not split over {processes} processes "
            f"of per_device_train_batch_size {per_device} ({step} completions a round): set "
            f"{fix} (a multiple of {step} and of num_generations {generations}), or change --gpus"
        )
    if batch % generations:
        raise ShardingError(
            f"training: generation_batch_size {batch} is not a whole number of prompt groups of "
            f"num_generations {generations}: set {fix}"
        )


def check_save_steps(kwargs: dict[str, Any], processes: int) -> None:
    """Checkpoints fall between generation batches: a run resumed in the middle of one would
    sample its rest anew and score it against the resumed weights (TRL keeps no generation in
    a checkpoint), not train as the uninterrupted run did."""
    if kwargs.get("save_strategy") != "steps" or not kwargs.get("save_steps"):
        return
    step = int(kwargs["per_device_train_batch_size"]) * processes
    step *= int(kwargs.get("gradient_accumulation_steps", 1))
    batch = int(kwargs.get("generation_batch_size") or step)
    windows = max(1, batch // step) * int(kwargs.get("num_iterations", 1))
    if int(kwargs["save_steps"]) % windows:
        raise ShardingError(
            f"training: save_steps {kwargs['save_steps']} puts checkpoints inside generation "
            f"batches ({windows} optimizer steps each): a resumed run would not train as the "
            f"uninterrupted one; use a multiple of {windows} (--set save_steps=N)"
        )


def rows_regrouped(steps_per_generation: int, gradient_accumulation_steps: int) -> bool:
    """Whether a generation batch's micro-batches make whole optimizer steps: then the GRPO trainer
    orders its rows itself, each optimizer step training on the same completions on any number of
    processes (`cobalt.training.machinery.padding.optimizer_windows`); otherwise TRL's own shuffle
    and split run (the trainer says so once)."""
    return steps_per_generation % gradient_accumulation_steps == 0


def starts_optimizer_step(
    steps_per_generation: int, num_iterations: int, gradient_accumulation_steps: int
) -> bool:
    """Whether every generation batch (its `num_iterations` passes) starts an optimizer step:
    what generation one step ahead needs (`training.async_generation`)."""
    return (steps_per_generation * num_iterations) % gradient_accumulation_steps == 0
