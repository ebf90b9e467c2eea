"""The training console (cobalt/training/reporting/console.py): a compact line every few steps from
the trainer's logs, in place of transformers' printing of every step's metrics dict. Fake logs and
a fake trainer state: no training runs here."""

from __future__ import annotations

from types import SimpleNamespace

from transformers import PrinterCallback, ProgressCallback

from cobalt.training.reporting.console import TrainingConsole, end_line, every, install, step_line

# one GRPO step's logs as TRL 1.16 writes them (some 25 fields)
GRPO_LOGS = {
    "loss": 0.012341, "grad_norm": 0.87, "learning_rate": 1e-4, "num_tokens": 51_200.0,
    "completions/mean_length": 88.1, "completions/min_length": 12.0,
    "completions/max_length": 128.0, "completions/clipped_ratio": 0.25,
    "completions/mean_terminated_length": 70.2, "completions/min_terminated_length": 12.0,
    "completions/max_terminated_length": 127.0, "rewards/correctness/mean": 0.41,
    "rewards/correctness/std": 0.8, "reward": 0.41213, "reward_std": 0.8, "frac_reward_zero_std": 0.5,
    "kl": 0.0030712, "entropy": 1.9, "clip_ratio/low_mean": 0.0, "clip_ratio/low_min": 0.0,
    "clip_ratio/high_mean": 0.0, "clip_ratio/high_max": 0.0, "clip_ratio/region_mean": 0.0,
    "step_time": 2.3114, "epoch": 0.25,
}  # fmt: skip


def test_a_steps_line_is_compact() -> None:
    assert step_line(8, 32, GRPO_LOGS, 2.3114) == (
        "step 8/32  reward 0.4121  loss 0.01234  KL 0.003071  2.31 s/step"
    )
    # no timing of its own: TRL's step_time; the offline mode's metrics (KL as kl_ref, if any)
    assert step_line(8, 32, GRPO_LOGS).endswith("  2.31 s/step")
    offline = {"loss": 0.5, "grad_norm": 1.0, "reward": -0.25, "kl_ref": 0.01, "epoch": 1.0}
    assert step_line(3, 0, offline, 0.5) == "step 3  reward -0.25  loss 0.5  KL 0.01  0.5 s/step"
    assert step_line(1, 2, {"loss": 1.0}) == "step 1/2  loss 1"
    assert end_line({"train_runtime": 95.04, "train_loss": 0.0123}, 32) == (
        "trained 32 steps in 95.0 s, mean loss 0.0123"
    )


def test_a_line_every_few_steps_and_at_the_first_and_last() -> None:
    assert (every(32), every(3), every(1000)) == (4, 1, 10)
    lines: list[str] = []
    console = TrainingConsole(write=lines.append)
    args = SimpleNamespace(disable_tqdm=True)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, max_steps=32)
    console.on_train_begin(args, state, None)
    for step in range(1, 33):
        console.on_step_begin(args, state, None)
        state.global_step = step
        console.on_step_end(args, state, None)
        console.on_log(args, state, None, logs=dict(GRPO_LOGS))
    console.on_log(args, state, None, logs={"train_runtime": 12.0, "train_loss": 0.1})
    console.on_train_end(args, state, None)
    steps = [line.split()[1] for line in lines[:-1]]
    assert steps == ["1/32", *(f"{n}/32" for n in range(4, 33, 4))]
    assert all(line.endswith(" s/step") and len(line) < 80 for line in lines[:-1])
    assert lines[-1] == "trained 32 steps in 12.0 s, mean loss 0.1"
    other = TrainingConsole(write=lines.append)  # another process of the job: silent
    state = SimpleNamespace(is_world_process_zero=False, global_step=1, max_steps=32)
    other.on_log(args, state, None, logs=dict(GRPO_LOGS))
    assert len(lines) == 10


def test_it_takes_the_place_of_transformers_printing() -> None:
    class Trainer:
        def __init__(self, callbacks):
            self.callbacks = list(callbacks)

        def pop_callback(self, cls):
            found = next((c for c in self.callbacks if isinstance(c, cls)), None)
            if found is not None:
                self.callbacks.remove(found)
            return found

        def add_callback(self, callback):
            self.callbacks.append(callback)

    for default in (ProgressCallback, PrinterCallback):
        trainer = Trainer([object(), default()])
        console = install(trainer)
        assert isinstance(console, TrainingConsole) and trainer.callbacks[-1] is console
        assert not any(
            isinstance(c, (ProgressCallback, PrinterCallback)) for c in trainer.callbacks
        )
    notebook = Trainer([object()])  # a progress display of its own: left alone
    assert install(notebook) is None and len(notebook.callbacks) == 1
