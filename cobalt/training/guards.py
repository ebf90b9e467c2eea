"""A guard against non-finite training steps: before every optimizer step it checks that the
gradients are finite; if one is not (inf or NaN, e.g. from a loss that overflowed), the step is
not taken (the gradients are zeroed, so the weights stay as they were), training stops, and
`check()` raises `NonFiniteError` naming the step, the parameters whose gradients broke first and
the last logged metrics, instead of a corrupted model failing later with an opaque
"device-side assert" while sampling."""

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
        import torch

        bad = [
            name
            for name, p in model.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        if bad:
            self.tripped = {"step": state.global_step + 1, "parameters": bad[:MAX_NAMES]}
            self.tripped["count"] = len(bad)
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        self.last_logs = {k: v for k, v in logs.items() if isinstance(v, int | float)}
        if self.tripped is None and any(
            isinstance(logs.get(k), float) and not math.isfinite(logs[k])
            for k in ("loss", "grad_norm")
        ):
            self.tripped = {"step": state.global_step, "parameters": [], "count": 0}
            control.should_training_stop = True

    def check(self, dtype_hint: str = "") -> None:
        if self.tripped is None:
            return
        t = self.tripped
        where = (
            f"{t['count']} parameters, first {', '.join(t['parameters'])}"
            if t["parameters"]
            else "the logged loss or gradient norm"
        )
        raise NonFiniteError(
            f"non-finite gradients at optimizer step {t['step']} ({where}); the step was not "
            f"taken and training stopped. Last logged metrics: {self.last_logs}. "
            f"{dtype_hint}".strip()
        )
