"""What a person reads while a trainer runs: a progress bar over the optimizer steps and, every few
steps, one compact line (step, reward, loss, KL, seconds a step), in place of transformers'
printing of every step's whole metrics dict (`ProgressCallback.on_log`, `PrinterCallback.on_log`:
some 25 fields on one line a step). The metrics themselves still go where they went: the
trainer's log history and its `report_to` backends (tensorboard by default). `install(trainer)`
puts it in place of those callbacks; GRPO's and the offline trainer's runs install it. Only the
main process writes. Plain Python, no Prefect."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

MAX_EVERY = 10  # a line at least every 10 steps
LINES = 8  # about this many lines over a short run


def every(max_steps: int) -> int:
    """Steps between two lines: about `LINES` over the run, at least one line every `MAX_EVERY`
    steps."""
    return max(1, min(MAX_EVERY, max_steps // LINES))


def step_line(step: int, max_steps: int, logs: dict[str, Any], seconds: float | None = None) -> str:
    """One step's line: `step 8/32  reward 0.4121  loss 0.01234  KL 0.003071  2.31 s/step`;
    a metric the trainer did not log is left out (the offline mode has no KL unless its
    diagnostics are on: kl_ref then)."""
    parts = [f"step {step}/{max_steps}" if max_steps else f"step {step}"]
    kl = logs.get("kl", logs.get("kl_ref"))
    for name, value in (("reward", logs.get("reward")), ("loss", logs.get("loss")), ("KL", kl)):
        if isinstance(value, int | float):
            parts.append(f"{name} {value:.4g}")
    if seconds is None and isinstance(logs.get("step_time"), int | float):
        seconds = float(logs["step_time"])
    if seconds is not None:
        parts.append(f"{seconds:.3g} s/step")
    return "  ".join(parts)


def end_line(logs: dict[str, Any], steps: int) -> str:
    """The trainer's closing log (train_runtime, train_loss) as one line."""
    line = f"trained {steps} step{'s' if steps != 1 else ''} in {logs['train_runtime']:.1f} s"
    if isinstance(logs.get("train_loss"), int | float):
        line += f", mean loss {logs['train_loss']:.4g}"
    return line


class TrainingConsole(TrainerCallback):
    """A tqdm bar over the optimizer steps (none with `disable_tqdm`) and a compact line at the
    first step, every `every(max_steps)` steps and the last; `write`: where lines go (default:
    above the bar, or stdout without one)."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self.bar: Any = None
        self.write = write
        self._started: float | None = None
        self._seconds: list[float] = []  # the steps' durations since the last line
        self._done = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._done = state.global_step
        if not getattr(args, "disable_tqdm", False):
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=state.max_steps,
                initial=state.global_step,  # resumed from a checkpoint
                desc="training",
                unit="step",
                dynamic_ncols=True,
            )

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._started is not None:
            self._seconds.append(time.perf_counter() - self._started)
            self._started = None
        if self.bar is not None:
            self.bar.update(state.global_step - self._done)
        self._done = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "train_runtime" in logs:
            self.emit(end_line(logs, state.global_step))
            return
        step, total = state.global_step, state.max_steps
        if not any(k in logs for k in ("loss", "reward")):
            return
        if step == 1 or step == total or step % every(total) == 0:
            seconds = sum(self._seconds) / len(self._seconds) if self._seconds else None
            self.emit(step_line(step, total, logs, seconds))
            self._seconds.clear()

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def emit(self, line: str) -> None:
        if self.write is not None:
            self.write(line)
        elif self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)


def install(trainer: Any) -> TrainingConsole | None:
    """`trainer`'s console: TrainingConsole in place of transformers' ProgressCallback or
    PrinterCallback; a trainer with neither (a notebook's own progress) is left as it is."""
    removed = [trainer.pop_callback(cls) for cls in (ProgressCallback, PrinterCallback)]
    if not any(removed):
        return None
    console = TrainingConsole()
    trainer.add_callback(console)
    return console
