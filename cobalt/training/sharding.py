"""How training spreads over several GPUs: the sharding a run asks for, the accelerate
config the project ships for it (`infra/accelerate/`), and the checks that run before any work
(enough GPUs, a strategy this machine can run, a batch that splits over the processes).

| sharding | what each GPU holds of the trained model | accelerate config |
| --- | --- | --- |
| `ddp` | all of it: weights, gradients, Adam's moments (16 bytes a trained fp32 parameter) | `ddp.yaml` |
| `fsdp` | 1/N of it (FSDP2 full shard; a layer is gathered in bf16 for its compute) | `fsdp.yaml` |
| `zero3` | 1/N of it (DeepSpeed ZeRO stage 3; `pip install deepspeed`) | `zero3.yaml` |
| `hybrid` | 1/G of it, G the GPUs of a node (FSDP2 sharding within each node, the nodes each a replica: gradients all-reduced across nodes once a step; several nodes only) | `fsdp.yaml` + accelerate's parallelism config (`dp_replicate_size` nodes, `dp_shard_size` G) |

`auto` is `fsdp` for full fine-tuning on several GPUs and `ddp` otherwise: LoRA trains a few
adapters over a frozen bf16 base that every GPU holds anyway, one process shards nothing, and
CPU processes (gloo) cannot be sharded by accelerate (it runs an FSDP config on CPUs as plain
DDP). `training.accelerate_config` names a file of the user's instead (several machines,
offload): its own distribution is what the plan, the memory checks and the launch follow
(`file_sharding`). What can run on a machine is checked by the run's GPU plan
(`cobalt.training.plan`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from cobalt.errors import UserError

Sharding = Literal["auto", "ddp", "fsdp", "zero3", "hybrid"]
SHARDINGS: tuple[str, ...] = get_args(Sharding)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "infra" / "accelerate"
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
            import json

            stage = json.loads(Path(loaded.deepspeed_config["deepspeed_config_file"]).read_text())
            stage = stage.get("zero_optimization", {}).get("stage")
        return "zero3" if int(stage or 0) == 3 else "ddp"
    return "ddp"


def config_file(sharding: str) -> Path:
    """The accelerate config the project ships for a strategy (hybrid: FSDP's, its 2-D device
    mesh set by the launch: `hybrid_env`)."""
    return CONFIG_DIR / f"{'fsdp' if sharding == 'hybrid' else sharding}.yaml"


def hybrid_env(nodes: int, per_node: int) -> dict[str, str]:
    """accelerate's parallelism config for hybrid sharding, as its launcher hands it to the
    training processes (the environment: its CPU launcher passes no `--parallelism_config_*`
    flags on): the nodes replicate, each node's processes shard."""
    return {
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": str(nodes),
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": str(per_node),
    }


def visible_gpus() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applied by torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
