"""The policy's weights in and out, one path for every trainer: GRPO (`cobalt/training/grpo.py`),
the offline objectives (`cobalt/training/offline.py`) and the reference model's SFT fit
(`cobalt/reference.py`). The model is loaded in the numerics `cobalt.training.machinery.precision`
decides for it, and the trained one saved as a plain model directory the engines and vLLM load: LoRA
adapters merged, the weights in the checkpoint's dtype, written once, by the main process, from
the state gathered over every process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cobalt.training.decisions import Numerics, Precision, checkpoint_dtype, decide
from cobalt.training.machinery.precision import cast_saved, load_dtype, write_saved_dtype

log = logging.getLogger(__name__)


def load_tokenizer(model_path: str | Path) -> Any:
    """The model's tokenizer, its end-of-sequence token padding when it names no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def numerics_for(
    precision: Precision, model_path: str | Path, *, gpu: bool, mixed: bool
) -> Numerics:
    """The numerics of training the model saved in `model_path` (its checkpoint's dtype) on this
    hardware (`cobalt.training.decisions.decide`)."""
    return decide(precision, checkpoint_dtype(model_path), gpu=gpu, mixed=mixed)


def load_policy(model_path: str | Path, numerics: Numerics, *, lora: bool = False, **kwargs) -> Any:
    """The model to train, in the dtype `numerics` gives it (the frozen base's under LoRA, the
    trainable weights' otherwise); `kwargs` go to `from_pretrained` (attn_implementation)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(model_path), dtype=load_dtype(numerics, lora), **kwargs
    )


def save_policy(
    trainer: Any, output_dir: str | Path, numerics: Numerics, tokenizer: Any, *, lora: bool
) -> None:
    """The trained policy as a plain model directory in the checkpoint's dtype (`numerics.saved`):
    LoRA adapters merged into the weights; a full model's state gathered from every process
    (whole under ddp, from the shards under fsdp / zero3: every process takes part), cast and
    written once by the main process (an 8B policy: 16 GB of bf16, not 32 GB of fp32 rewritten).
    Every process returns once it is written."""
    import torch

    main = trainer.is_world_process_zero()
    if lora:
        if main:
            trainer.model.merge_and_unload().save_pretrained(str(output_dir))
            cast_saved(output_dir, numerics)
    else:
        # under DeepSpeed the engine gathers ZeRO-3's shards (as transformers' own save_model)
        deepspeed = getattr(trainer, "is_deepspeed_enabled", False)
        state = trainer.accelerator.get_state_dict(
            trainer.deepspeed if deepspeed else trainer.model
        )
        if deepspeed and numerics.saved == "float32":
            state = master_weights(trainer.deepspeed.module, state, main)
        if main:
            dtype = getattr(torch, numerics.saved)
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
            model = trainer.accelerator.unwrap_model(trainer.model)
            model.save_pretrained(str(output_dir), state_dict=state)
            write_saved_dtype(output_dir, numerics)
    if main:
        tokenizer.save_pretrained(str(output_dir))
        processes = trainer.accelerator.num_processes
        log.info("the policy saved to %s by the main process of %d", output_dir, processes)
    trainer.accelerator.wait_for_everyone()


def master_weights(module: Any, state: dict[str, Any] | None, main: bool) -> dict[str, Any] | None:
    """ZeRO-3's float32 master copy of every trained weight in place of the 16-bit weights its
    engine gathered into `state` (DeepSpeed's bf16 mode keeps the module in bf16: saved as they
    are, an fp32 checkpoint's training would come back rounded to bf16). Every process takes part
    (each weight is gathered from its shards); the main process gets the dict, the others None."""
    from deepspeed.utils import safe_get_full_fp32_param

    gathered: dict[int, Any] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        key = id(param)
        if key not in gathered:
            full = safe_get_full_fp32_param(param)
            gathered[key] = full.detach().cpu() if full is not None and main else None
        if main and gathered[key] is not None and name in state:
            state[name] = gathered[key]
    return state
