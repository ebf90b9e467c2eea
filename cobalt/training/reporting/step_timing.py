"""Where a GRPO step's wall time goes: generation, reward wait, weight sync, the rest
(optimisation).

TRL times its own blocks with `trl.extras.profiling.ProfilingContext` but reports them only to
experiment trackers. `StepTimer` is a `TrainerCallback` that also listens to those contexts while
it is active (`with StepTimer() as timer: trainer.train()`), so a plain run gets the breakdown:
generation = TRL's `*.generate*` blocks, reward = `_calculate_rewards` (the sandbox judging every
completion of a batch), weight sync = `sync_weights` (the policy's weights loaded into a vLLM
engine; gathered from the shards first under fsdp / zero3), optimisation = the rest of the
optimizer step (the policy's and the reference model's forward and backward passes, the step). Each
step is also logged as it ends (a run cut short still shows its step times and, on a GPU, its peak
memory so far). With torch's flight recorder on (`cobalt.training.machinery.collectives`), each step
also records the GB its process put through collectives, by collective. Plain Python, no Prefect.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from transformers import TrainerCallback

from cobalt.training.machinery.collectives import CollectiveMeter

GENERATION = "generation"
REWARD = "reward"
WEIGHT_SYNC = "weight_sync"
OPTIMISATION = "optimisation"
BUCKETS = (GENERATION, REWARD, WEIGHT_SYNC)
log = logging.getLogger(__name__)


def _bucket(name: str) -> str | None:
    if name.endswith("_calculate_rewards"):
        return REWARD
    if name.endswith("sync_weights"):
        return WEIGHT_SYNC
    if ".generate" in name or name.endswith("generate_batch"):
        return GENERATION
    return None


class StepTimer(TrainerCallback):
    """Per-step seconds by bucket; `summary()` gives totals and shares of the step time."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self._current: dict[str, float] = defaultdict(float)
        self._started: float | None = None
        self._undo: Any = None
        self._collectives = CollectiveMeter()

    # --- listening to TRL's profiling contexts --------------------------------------------------
    def __enter__(self) -> StepTimer:
        from cobalt.training.machinery.trl_trainer import listen_to_profiling

        def heard(name: str, duration: float) -> None:
            if (bucket := _bucket(name)) is not None:
                self._current[bucket] += duration

        self._undo = listen_to_profiling(heard)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._undo()

    # --- TrainerCallback ----------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._started is None:
            return
        total = time.perf_counter() - self._started
        step = {bucket: self._current[bucket] for bucket in BUCKETS}
        step[OPTIMISATION] = max(0.0, total - sum(step.values()))
        step["total"] = total
        if (moved := self._collectives.read()) is not None:  # outside the step's timed span
            step["collectives"] = moved
        self.steps.append(step)
        self._current.clear()
        self._started = None
        log.info(
            "step %d: %.1f s (generation %.1f, reward %.1f, weight sync %.1f, optimisation %.1f)%s",
            state.global_step,
            total,
            step[GENERATION],
            step[REWARD],
            step[WEIGHT_SYNC],
            step[OPTIMISATION],
            _gpu_peak(),
        )

    def summary(self) -> dict[str, Any]:
        """Seconds per bucket over all steps, their share of step time, the step count and
        torch's CPU threads in the process (engines.cpu_threads); with the flight recorder on,
        the GB each step put through collectives (`collective_gb_step`, and by collective)."""
        import torch

        total = sum(s["total"] for s in self.steps)
        out: dict[str, Any] = {"steps": len(self.steps), "total_s": round(total, 3)}
        out["cpu_threads"] = torch.get_num_threads()
        out["step_s"] = [round(s["total"], 3) for s in self.steps]
        for bucket in (*BUCKETS, OPTIMISATION):
            out[f"{bucket}_step_s"] = [round(s[bucket], 3) for s in self.steps]
            seconds = sum(s[bucket] for s in self.steps)
            out[f"{bucket}_s"] = round(seconds, 3)
            out[f"{bucket}_share"] = round(seconds / total, 4) if total else 0.0
        moved = [s.get("collectives") for s in self.steps]
        if any(moved):  # GB a step through collectives, in total and by collective
            ops = sorted({op for m in moved if m for op in m["gb"]})
            out["collective_gb_step"] = [
                round(sum(m["gb"].values()), 6) if m else None for m in moved
            ]
            out["collective_gb_step_by_op"] = {
                op: [round(m["gb"].get(op, 0.0), 6) if m else None for m in moved] for op in ops
            }
            out["collective_calls_step_by_op"] = {
                op: [m["calls"].get(op, 0) if m else None for m in moved] for op in ops
            }
            out["collectives_complete"] = all(m["complete"] for m in moved if m)
        return out


def _gpu_peak() -> str:
    import torch

    if not torch.cuda.is_available():
        return ""
    return f", GPU peak so far {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated"
