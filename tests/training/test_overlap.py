"""Generation overlapped with training, one step off (`--async`, cobalt.training.machinery.overlap):
real
GRPO runs of the tiny model on CPU, the background thread sampling from a copy of the policy."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from cobalt.training.machinery import overlap
from cobalt.training.machinery.overlap import Lookahead, OneStepOff, TransformersCopy
from cobalt.training.machinery.trl_trainer import CobaltGRPOTrainer
from cobalt.training.settings import LoraSettings, TrainingConfig

SCORE = CobaltGRPOTrainer._generate_and_score_completions
PREPARE = TransformersCopy.prepare


def test_lookahead_reads_ahead_without_losing_or_reordering_an_item() -> None:
    ahead = Lookahead(iter(range(5)))
    assert next(ahead) == 0 and ahead.taken == 1
    assert ahead.peek(2) == 3 and ahead.peek(0) == 1
    assert list(ahead) == [1, 2, 3, 4] and ahead.taken == 5
    assert ahead.peek(0) is None and ahead.peek(-1) is None  # past the end, before the next


def test_async_is_refused_where_it_is_not_built_naming_the_setting() -> None:
    for bad in (
        {"mode": "multi_turn"},
        {"mode": "offline"},
        {"rollout": "benchmarks.parity_rollout:replay"},
        {"generation": "paged"},
        {"overrides": {"vllm_enable_sleep_mode": True}},
    ):
        with pytest.raises(ValueError, match="async_generation"):
            TrainingConfig(preset="tiny", async_generation=True, **bad)
    # a vLLM server (yours, or the stage's own on GPUs of its own) samples one step off too
    TrainingConfig(
        preset="tiny",
        async_generation=True,
        generation="vllm_server",
        vllm_server_base_url="http://x:8000",
    )
    TrainingConfig(preset="tiny", async_generation=True, vllm_server_gpus=1)
    # colocated vLLM: awake one step off, asleep under fsdp otherwise
    config = TrainingConfig(preset="tiny", async_generation=True, overrides={"use_vllm": True})
    assert "vllm_enable_sleep_mode" not in config.grpo_kwargs("/tmp/x", gpus=0)


class Nudge(TrainerCallback):
    """Moves every trainable weight after each step, as an update would: the tiny random model
    writes no code, so its rewards are all -1 and GRPO's own updates are zero."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.01 * state.global_step)


def spied_run(
    tmp_path, monkeypatch, async_generation: bool, lora: bool = False, save_steps=None, **overrides
):
    """A tiny GRPO run on the 4 rows of test_grpo_tiny, its weights nudged after each step;
    returns (the example ids of each generation batch in training order, what the background
    copy was prepared with, the run)."""
    from shared_models import tiny_model as shared_tiny_model
    from test_grpo_tiny import SANDBOX, rows

    from cobalt.training.grpo import train

    trained: list[list[str]] = []

    def score(self, inputs):
        trained.append([str(x["example_id"]) for x in inputs])
        return SCORE(self, inputs)

    monkeypatch.setattr(CobaltGRPOTrainer, "_generate_and_score_completions", score)
    records: list[dict] = []

    def prepare(self, trainer, prompts):
        job = PREPARE(self, trainer, prompts)
        policy = dict(trainer.model.named_parameters())
        same = all(
            torch.equal(p, policy[name].detach())
            for name, p in self.model.named_parameters()
            if name in self.trainable
        )
        records.append({"step": trainer.state.global_step, "weights_current": same})
        return job

    monkeypatch.setattr(TransformersCopy, "prepare", prepare)
    model = shared_tiny_model()
    config = TrainingConfig(
        preset="tiny", mode="cobalt", sandbox=SANDBOX, report_to=[], async_generation=async_generation,
        lora=LoraSettings(r=4, alpha=8) if lora else None, save_steps=save_steps,
        overrides={"per_device_train_batch_size": 2, **overrides},
    )  # fmt: skip
    run = train(config, rows(), model, tmp_path / f"out-{async_generation}", callbacks=[Nudge()])
    return trained, records, run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_each_batch_is_sampled_while_the_one_before_trains_from_the_same_rows(
    tmp_path, monkeypatch, lora
) -> None:
    """4 steps of one prompt's 2 samples: the first batch is sampled in place, each later one in
    the background from the weights of the step before (refreshed from the policy when sent;
    LoRA: its adapters), none is sent after the last; the rows train in the synchronous run's
    order."""
    sync_order, _, sync = spied_run(tmp_path, monkeypatch, False, max_steps=4)
    order, records, run = spied_run(tmp_path, monkeypatch, True, lora=lora, max_steps=4)
    assert order == sync_order and len(order) == 4
    assert sync.overlap is None
    assert run.overlap["overlapped_batches"] == 3 and run.overlap["fresh_batches"] == 1
    assert run.overlap["generator"] == "TransformersCopy"
    # prepared: batch 0 at step 0 (in place), then batches 1, 2, 3 sent at steps 0, 1, 2
    assert [r["step"] for r in records] == [0, 0, 1, 2]
    assert all(r["weights_current"] for r in records)
    steps = [h for h in run.history if "loss" in h]
    assert [h["async/overlapped"] for h in steps] == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.timeout(300)
def test_a_generation_batch_of_two_optimizer_steps_is_sent_one_batch_ahead(
    tmp_path, monkeypatch
) -> None:
    """steps_per_generation 2 (the paper preset's shape): a batch is generated every other
    step; the second is sent at step 0 and trained from step 2, the rows as synchronous."""
    over = {"max_steps": 4, "steps_per_generation": 2}
    sync_order, _, _ = spied_run(tmp_path, monkeypatch, False, **over)
    order, records, run = spied_run(tmp_path, monkeypatch, True, **over)
    assert order == sync_order and len(order) == 2
    assert [r["step"] for r in records] == [0, 0]
    assert (run.overlap["overlapped_batches"], run.overlap["fresh_batches"]) == (1, 1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("batch", [2, 8], ids=["four-batches-an-epoch", "one-batch-an-epoch"])
def test_the_next_epochs_first_batch_is_sent_ahead_from_the_samplers_next_order(
    tmp_path, monkeypatch, caplog, batch
) -> None:
    """Two epochs of the 4 rows, as 4 generation batches of 1 prompt each or as one of 4 prompts
    (4 steps of it): the batch after an epoch's last is read from the next draw of TRL's sampler
    before that epoch starts, so only the run's first batch is sampled in place, and the rows
    train in the synchronous order (each epoch's first batch was once sampled in place:
    with one batch an epoch, seen on an H200, --async overlapped nothing)."""
    from cobalt.training.reporting.phases import overlap_phrase

    over = {"max_steps": 8, "generation_batch_size": batch}
    sync_order, _, _ = spied_run(tmp_path, monkeypatch, False, **over)
    with caplog.at_level("WARNING", logger="cobalt.training.machinery.overlap"):
        order, records, run = spied_run(tmp_path, monkeypatch, True, **over)
    batches = 8 * 2 // batch
    assert order == sync_order and len(order) == batches
    assert len({tuple(sorted(ids)) for ids in order}) == batches // 2  # each row in both epochs
    assert (run.overlap["overlapped_batches"], run.overlap["fresh_batches"]) == (batches - 1, 1)
    assert all(r["weights_current"] for r in records)
    assert "not the one trained next" not in caplog.text  # every guess was right
    assert overlap_phrase(run.overlap) == (
        f"one step off: {batches - 1} of {batches} generation batches overlapped, "
        f"{batches - 1} judged ahead; "
    )
    assert overlap_phrase(None) == ""


@pytest.mark.timeout(300)
def test_a_failure_in_the_background_stops_the_run_with_its_own_error(
    tmp_path, monkeypatch
) -> None:
    real_run = TransformersCopy.run
    calls: list[int] = []

    def failing(self, job):
        calls.append(1)
        if len(calls) == 2:  # the first batch sent ahead
            raise RuntimeError("sampler out of memory")
        return real_run(self, job)

    monkeypatch.setattr(TransformersCopy, "run", failing)
    with pytest.raises(RuntimeError, match="sampler out of memory"):
        spied_run(tmp_path, monkeypatch, True, max_steps=3)


@pytest.mark.timeout(300)
def test_every_batch_is_sampled_in_the_background_thread(tmp_path, monkeypatch) -> None:
    """The run's first batch, sampled in place (the trainer waits for it), is sampled in the
    background thread too: the engine is only ever driven from one thread and one stream (a
    colocated vLLM's memory freed on the trainer's stream could be reused there while its kernels
    still ran)."""
    import threading

    real_run = TransformersCopy.run
    threads: list[str] = []

    def run(self, job):
        threads.append(threading.current_thread().name)
        return real_run(self, job)

    monkeypatch.setattr(TransformersCopy, "run", run)
    _, _, result = spied_run(tmp_path, monkeypatch, True, max_steps=3)
    assert result.overlap["fresh_batches"] == 1 and result.overlap["overlapped_batches"] == 2
    assert len(threads) == 3 and all(t.startswith("cobalt-generate") for t in threads), threads


def test_the_engine_in_use_decides_the_generator(monkeypatch) -> None:
    """A trainer on vLLM colocated must keep it awake at tensor parallel 1; a trainer in TRL's
    server mode asks the server."""

    class Args:
        steps_per_generation = gradient_accumulation_steps = 2
        vllm_mode = "server"
        vllm_enable_sleep_mode = False
        vllm_tensor_parallel_size = 1

    class Trainer:
        use_vllm = True
        num_iterations = 1
        args = Args()

    Args.steps_per_generation = 1  # two generation batches an optimizer step
    with pytest.raises(ValueError, match="must start an optimizer step"):
        OneStepOff().attach(Trainer())
    Args.steps_per_generation = 4

    monkeypatch.setattr(overlap.VLLMServer, "__init__", lambda self, trainer: None)
    served = OneStepOff()
    served.attach(Trainer())
    assert isinstance(served.generator, overlap.VLLMServer)
    served.close()
    Args.vllm_mode, Args.vllm_enable_sleep_mode = "colocate", True
    with pytest.raises(ValueError, match="awake"):
        OneStepOff().attach(Trainer())
    Args.vllm_enable_sleep_mode = False
    monkeypatch.setattr(overlap.VLLMColocated, "__init__", lambda self, trainer: None)
    one = OneStepOff()
    one.attach(Trainer())
    assert isinstance(one.generator, overlap.VLLMColocated)
    one.close()


@pytest.mark.timeout(300)
def test_a_failure_setting_up_the_background_thread_is_raised_as_itself(
    tmp_path, monkeypatch
) -> None:
    def broken(self):
        raise ValueError("no such CUDA device")

    monkeypatch.setattr(TransformersCopy, "thread_setup", broken)
    with pytest.raises(ValueError, match="no such CUDA device"):
        spied_run(tmp_path, monkeypatch, True, max_steps=3)


def test_the_training_plan_says_generation_is_overlapped(tiny_model) -> None:
    from cobalt.training.machinery.plan import plan_training

    plan = plan_training(TrainingConfig(preset="tiny", async_generation=True), tiny_model)
    assert "generation transformers overlapped with training, one step off (a copy of the " \
        "policy samples)" in plan.describe()  # fmt: skip
    assert "one step off" not in plan_training(TrainingConfig(preset="tiny"), tiny_model).describe()


@pytest.mark.timeout(300)
def test_a_resumed_run_samples_its_first_batch_fresh_and_trains_the_same_rows(
    tmp_path, monkeypatch
) -> None:
    """Killed after a checkpoint at step 2 and run again to step 4: the resumed run trains the
    rows the uninterrupted one trained at steps 3 and 4, its first batch sampled in place (the
    batch in flight when it stopped is gone), the next from the background."""
    whole, _, _ = spied_run(tmp_path / "whole", monkeypatch, True, max_steps=4)
    first, _, _ = spied_run(tmp_path, monkeypatch, True, max_steps=2, save_steps=2)
    assert first == whole[:2]
    resumed, records, run = spied_run(tmp_path, monkeypatch, True, max_steps=4, save_steps=2)
    assert resumed == whole[2:]
    assert (run.overlap["fresh_batches"], run.overlap["overlapped_batches"]) == (1, 1)
    assert [r["step"] for r in records] == [2, 2]  # in place at 2, then sent ahead at 2


def _vote(rank: int, port: int, votes: list[list[bool]], results) -> None:
    """One of two CPU processes (gloo, accelerate's own set-up): its vote on `flags[rank]` for
    each `flags` of `votes`, in turn."""
    import os
    from types import SimpleNamespace

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )  # fmt: skip
    from accelerate import Accelerator

    trainer = SimpleNamespace(accelerator=Accelerator(cpu=True))
    for i, flags in enumerate(votes):
        results[(i, rank)] = overlap._on_every_process(flags[rank], trainer)
        trainer.accelerator.wait_for_everyone()


@pytest.mark.timeout(120)
def test_one_process_whose_batch_was_not_sent_ahead_sends_every_process_in_place() -> None:
    """The processes agree on using the batch sent ahead only if it is right on every one of
    them: one process alone mismatching makes all of them sample in place (whose weight refresh
    under FSDP is a collective they must all join), on two real gloo processes."""
    import torch.multiprocessing as mp

    from cobalt.training.launch import _free_port

    votes = [[True, False], [False, True], [True, True], [False, False]]
    results = mp.Manager().dict()
    mp.spawn(_vote, args=(_free_port(), votes, results), nprocs=2)
    for i, flags in enumerate(votes):
        assert [results[(i, 0)], results[(i, 1)]] == [all(flags)] * 2, flags


@pytest.mark.timeout(300)
def test_a_batch_sampled_ahead_is_judged_in_the_background_as_the_rewards_will_read_it(
    tmp_path, monkeypatch
) -> None:
    """Each batch sent ahead is judged in the background thread once sampled, with the rows and
    the completions (decoded as TRL decodes them) that TRL's reward step then receives: the
    judge's cache keys are the same, so the reward step finds every result."""
    import threading

    from cobalt.training.method.sandbox_reward import CobaltRewards
    from cobalt.training.reporting.phases import overlap_phrase

    prejudged: list[tuple[str, list[str], list]] = []
    rewarded: list[tuple[list[str], list]] = []
    real_prejudge, real_rewards = CobaltRewards.prejudge, CobaltRewards.correctness_rewards

    def prejudge(self, rows, completions):
        ids = [str(r["example_id"]) for r in rows]
        prejudged.append((threading.current_thread().name, ids, list(completions)))
        return real_prejudge(self, rows, completions)

    def correctness(self, completions, test_cases, prev_best_pass_rate, program=None):
        rewarded.append((list(test_cases), list(completions)))
        return real_rewards(self, completions, test_cases, prev_best_pass_rate, program)

    monkeypatch.setattr(CobaltRewards, "prejudge", prejudge)
    monkeypatch.setattr(CobaltRewards, "correctness_rewards", correctness)
    order, _, run = spied_run(tmp_path, monkeypatch, True, max_steps=4)
    assert run.overlap["prejudged_batches"] == 3  # batches 1-3: sent ahead; batch 0 in place
    assert "3 of 4 generation batches overlapped, 3 judged ahead; " in overlap_phrase(run.overlap)
    assert [ids for _, ids, _ in prejudged] == order[1:]
    assert all(thread.startswith("cobalt-generate") for thread, _, _ in prejudged)
    # the completions judged ahead are the ones TRL rewards, batch for batch (the format
    # reward asks for correctness too: the same number of calls each batch)
    per = len(rewarded) // len(order)
    assert per >= 1 and len(rewarded) == per * len(order)
    assert [c for _, _, c in prejudged] == [c for _, c in rewarded[per::per]]


def test_programs_judged_ahead_are_not_judged_again_and_reward_the_same() -> None:
    """The rewards' cache, filled ahead, answers the reward step: the judge sees each program
    once, and the rewards equal those of a batch judged in the reward step."""
    from cobalt.training.method.sandbox_reward import CobaltRewards
    from sandbox import SandboxConfig, TestSuite

    class CountingJudge:
        def __init__(self) -> None:
            self.programs: list[str] = []

        def judge_many(self, requests):
            from types import SimpleNamespace

            self.programs += [r.code for r in requests]
            return [SimpleNamespace(pass_rate=0.5, passed=[True, False]) for _ in requests]

    suite = TestSuite.model_validate({"inputs": ["1", "2"], "outputs": ["1", "2"]}).model_dump()
    rows = [{"test_cases": suite}, {"test_cases": suite}]
    completions = [
        [{"role": "assistant", "content": "```python\nprint(1)\n```"}],
        [{"role": "assistant", "content": "no code"}],
    ]
    ahead, fresh = CobaltRewards(SandboxConfig()), CobaltRewards(SandboxConfig())
    ahead.judge, fresh.judge = CountingJudge(), CountingJudge()
    ahead.prejudge(rows, completions)
    assert ahead.judge.programs == ["print(1)"]
    tests = [r["test_cases"] for r in rows]
    rewards = ahead.correctness_rewards(completions, tests, [0.0, 0.0])
    assert ahead.judge.programs == ["print(1)"]  # not judged again
    assert rewards == fresh.correctness_rewards(completions, tests, [0.0, 0.0])
    assert fresh.judge.programs == ["print(1)"]
