"""How training spreads over several GPUs (issue 38): the sharding a run asks for, the accelerate
config the project ships for it (`infra/accelerate/`), and the checks that run before any work
(enough GPUs, a strategy this machine can run, a batch that splits over the processes).

| sharding | what each GPU holds of the trained model | accelerate config |
| --- | --- | --- |
| `ddp` | all of it: weights, gradients, Adam's moments (16 bytes a trained fp32 parameter) | `ddp.yaml` |
| `fsdp` | 1/N of it (FSDP2 full shard; a layer is gathered in bf16 for its compute) | `fsdp.yaml` |
| `zero3` | 1/N of it (DeepSpeed ZeRO stage 3; `pip install deepspeed`) | `zero3.yaml` |

`auto` is `fsdp` for full fine-tuning on several GPUs and `ddp` otherwise: LoRA trains a few
adapters over a frozen bf16 base that every GPU holds anyway, one process shards nothing, and
CPU processes (gloo) cannot be sharded by accelerate. `training.accelerate_config` names a file
of the user's instead (several machines, offload). Whether a strategy can hold the model is
`cobalt.training.memory.check_holds`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Literal, get_args

from cobalt.errors import UserError

Sharding = Literal["auto", "ddp", "fsdp", "zero3"]
SHARDINGS: tuple[str, ...] = get_args(Sharding)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "infra" / "accelerate"
SHARDED = ("fsdp", "zero3")


class ShardingError(UserError):
    """The GPUs or the sharding asked for cannot run here; the message names the setting."""


def resolve_sharding(config: Any, gpus: int) -> str:
    """`config.sharding` with auto made concrete for a machine with `gpus` GPUs."""
    if config.sharding != "auto":
        return config.sharding
    full = config.lora is None
    return "fsdp" if full and config.num_processes > 1 and gpus > 0 else "ddp"


def config_file(sharding: str) -> Path:
    """The accelerate config the project ships for a strategy."""
    return CONFIG_DIR / f"{sharding}.yaml"


def visible_gpus() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applied by torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_launch(config: Any, gpus: int | None = None) -> None:
    """The process count and sharding can run on this machine; ShardingError names the fix."""
    gpus = visible_gpus() if gpus is None else gpus
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
    if gpus and n > gpus:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        raise ShardingError(
            f"training.num_processes {n} (--gpus): this machine has {gpus} GPU(s){where}; pass "
            f"--gpus {gpus} or fewer"
        )
    if asked in SHARDED and n == 1:
        raise ShardingError(
            f"training.sharding {asked} on 1 process shards nothing: pass --gpus N (N > 1), or "
            "--sharding ddp"
        )
    if asked in SHARDED and not gpus:
        raise ShardingError(
            f"training.sharding {asked}: accelerate shards a model across GPUs only, and this "
            "machine has none; on CPU processes (gloo) use --sharding ddp"
        )
    if asked == "zero3" and importlib.util.find_spec("deepspeed") is None:
        raise ShardingError(
            "training.sharding zero3 needs DeepSpeed, which is not installed: pip install "
            "deepspeed, or use --sharding fsdp (the same memory per GPU, no extra package)"
        )


def check_batch(kwargs: dict[str, Any], processes: int) -> None:
    """TRL's generation batch splits into whole per-process micro-batches and whole prompt groups
    (it checks this inside the launched processes only, where a mistake costs the model's load)."""
    per_device = int(kwargs["per_device_train_batch_size"])
    generations = int(kwargs["num_generations"])
    step = per_device * processes
    batch = kwargs.get("generation_batch_size")
    batch = int(batch) if batch is not None else step * int(kwargs["gradient_accumulation_steps"])
    if batch % step:
        raise ShardingError(
            f"training: generation_batch_size {batch} does not split over {processes} processes "
            f"of per_device_train_batch_size {per_device} ({step} completions a round): set "
            f"--set generation_batch_size={max(step, batch // step * step)} (a multiple of "
            f"{step}), or change --gpus"
        )
    if batch % generations:
        raise ShardingError(
            f"training: generation_batch_size {batch} is not a whole number of prompt groups of "
            f"num_generations {generations}: set --set generation_batch_size="
            f"{max(generations, batch // generations * generations)}"
        )


def check_fits(config: Any, model_path: str | Path, gpus: int | None = None) -> None:
    """Before any work, on a GPU machine: each GPU can hold its share of the policy's state
    under the resolved sharding (`cobalt.training.memory.check_holds`); nothing to check on a
    CPU machine (its processes hold tiny models) or for a model without a config.json yet (the
    embedded fit makes one later)."""
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus or not Path(model_path, "config.json").is_file():
        return
    import torch
    from transformers import AutoConfig

    from cobalt.training.memory import check_holds
    from cobalt.training.precision import checkpoint_dtype, decide

    numerics = decide(
        config.precision,
        checkpoint_dtype(model_path),
        gpu=True,
        mixed=config.defaults().mixed_precision,
    )
    sharding = config.resolved_sharding(gpus)
    kl = config.mode != "offline" and config.lora is None and config.overrides.get("beta", 1) != 0
    check_holds(
        AutoConfig.from_pretrained(str(model_path)),
        lora=config.lora is not None,
        reference_model=kl,
        trainable_dtype=numerics.trainable,
        frozen_dtype=numerics.frozen,
        shards=config.num_processes if sharding in SHARDED else 1,
        sharding=sharding,
        gpu_bytes=torch.cuda.mem_get_info(0)[1],
        processes=config.num_processes,
        colocated_vllm=_colocated(config, model_path),
    )


def _colocated(config: Any, model_path: str | Path) -> bool:
    """vLLM shares the training GPUs (vllm_colocate, or auto's choice for this model)."""
    try:
        return config.generation_kwargs(True, model_path).get("vllm_mode") == "colocate"
    except ValueError:  # vLLM asked for and missing: the trainer's config check says so
        return False
