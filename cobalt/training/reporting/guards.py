"""A guard against non-finite training steps, decided by every process together.

Before every optimizer step each process checks its own gradients (its shard under FSDP: a
sharded gradient's local part) and the processes agree on the verdict (a MAX all-reduce of "I saw
one"): a NaN or inf in any process's gradients voids the step on all of them. The step is void
because every gradient is dropped (`p.grad = None`): torch's optimizers skip a parameter without
a gradient, so AdamW neither applies its momentum nor its weight decay and the weights stay
exactly as they were (zeroing the gradients instead would still move them by Adam's momentum).
Training then stops on every process at once (no process waits in a collective for one that
stopped), no checkpoint is written of that step, and `check()` raises `NonFiniteError` naming the
step, the parameters whose gradients broke first and the last logged metrics, instead of a
corrupted model failing later with an opaque "device-side assert" while sampling.

Under DeepSpeed ZeRO-3 the optimizer steps inside `backward` (accelerate's DeepSpeed engine
wrapper), before any callback runs, and the partitioned gradients are not parameters' `.grad`:
there the guard reads the logged loss and gradient norm (reduced over every process, so every
process stops together), stops training and keeps that step from being saved; the checkpoint on
disk is the last finite one.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

MAX_NAMES = 8


class NonFiniteError(RuntimeError):
    """A training step produced non-finite gradients; the message says where and what to try."""


class NonFiniteGuard(TrainerCallback):
    def __init__(self) -> None:
        self.tripped: dict[str, Any] | None = None
        self.last_logs: dict[str, Any] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if model is None or self.tripped is not None:
            return
        bad = non_finite(model)
        everyone = agreed_count(len(bad))
        if everyone:
            self.tripped = {"step": state.global_step + 1, "parameters": bad[:MAX_NAMES]}
            self.tripped["count"] = len(bad)
            self.tripped["elsewhere"] = not bad  # another process saw it
            for p in model.parameters():
                p.grad = None  # the optimizer skips every parameter: the step is void
            control.should_training_stop = True

    def on_step_end(self, args, state, control, **kwargs):
        if self.tripped is not None:
            control.should_save = False  # never a checkpoint of a void or broken step

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        self.last_logs = {k: v for k, v in logs.items() if isinstance(v, int | float)}
        if self.tripped is None and any(
            isinstance(logs.get(k), float) and not math.isfinite(logs[k])
            for k in ("loss", "grad_norm")
        ):
            self.tripped = {"step": state.global_step, "parameters": [], "count": 0}
        if self.tripped is not None:
            control.should_training_stop = True
            control.should_save = False

    def check(self, dtype_hint: str = "") -> None:
        if self.tripped is None:
            return
        t = self.tripped
        if t["parameters"]:
            where = f"{t['count']} parameters, first {', '.join(t['parameters'])}"
        elif t.get("elsewhere"):
            where = "in another process's gradients"
        else:
            where = "the logged loss or gradient norm"
        raise NonFiniteError(
            f"non-finite gradients at optimizer step {t['step']} ({where}); the step was not "
            f"taken and training stopped. Last logged metrics: {self.last_logs}. "
            f"{dtype_hint}".strip()
        )


def non_finite(model: Any) -> list[str]:
    """Names of the parameters whose gradient (this process's part of it) holds a NaN or inf."""
    import torch

    bad = []
    for name, p in model.named_parameters():
        grad = p.grad
        if grad is None:
            continue
        local = grad.to_local() if hasattr(grad, "to_local") else grad  # an FSDP2 shard
        if not torch.isfinite(local).all():
            bad.append(name)
    return bad


def agreed_count(mine: int) -> int:
    """The largest `mine` over every process of the job (this process's alone when it runs
    alone): the verdict every process acts on."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return mine
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    flag = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())
