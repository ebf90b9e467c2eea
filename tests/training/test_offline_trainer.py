"""`OfflineTrainer` (transformers' Trainer with the offline objectives) on the tiny model, on CPU:
real optimizer steps move each completion's log-probability the way its advantage says, a killed
run resumes from its checkpoint, and LoRA adapters are merged on save."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard_events import scalars

from cobalt.training.machinery.checkpoints import last_checkpoint
from cobalt.training.offline import (
    OfflineCollator,
    end_of_turn_id,
    token_logprobs,
    tokenize_row,
    train_offline,
)
from cobalt.training.settings import LoraSettings, OfflineSettings, TrainingConfig

PROMPT = [{"role": "user", "content": "Print the sum of two integers."}]
GOOD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
BAD = "I think the answer is 3."


def rows() -> list[dict]:
    common = {"prompt": PROMPT, "stopped": True, "turn": 0, "example_id": "p"}
    return [
        {**common, "completion": GOOD, "reward": 1.0, "advantage": 1.0, "sample": 0},
        {**common, "completion": BAD, "reward": -1.0, "advantage": -1.0, "sample": 1},
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from shared_models import tiny_model as shared_tiny_model

    return shared_tiny_model()


def sequence_logprobs(model_dir: Path | str) -> list[float]:
    """Sum of the completion tokens' log-probabilities of each row (GOOD, BAD)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    eos = end_of_turn_id(tokenizer, model_dir)
    batch = OfflineCollator(tokenizer.pad_token_id)(
        [tokenize_row(r, tokenizer, eos) for r in rows()]
    )
    with torch.no_grad():
        logprobs = token_logprobs(model, batch)
    return (logprobs * batch["completion_mask"][:, 1:]).sum(dim=1).tolist()


def config(objective: str, **kw) -> TrainingConfig:
    return TrainingConfig(
        mode="offline",
        offline=OfflineSettings(objective=objective, batch_size=2, learning_rate=3e-3),
        **kw,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("objective", ["reinforce_loo", "clipped_ratio", "awr"])
def test_a_step_follows_the_advantage(tiny: Path, tmp_path: Path, objective: str) -> None:
    before = sequence_logprobs(tiny)
    run = train_offline(config(objective, max_steps=3), rows(), tiny, tmp_path / "out")
    after = sequence_logprobs(tmp_path / "out")
    good, bad = (a - b for a, b in zip(after, before, strict=True))
    steps = [h for h in run.history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2, 3] and run.rows == 2
    if objective == "awr":  # a weighted SFT: both rise, the better turn (weight e^2) far more
        assert good > 0 and good > bad, (good, bad)
        assert steps[0]["weight"] == pytest.approx((2.718281828**2 + 2.718281828**-2) / 2, 1e-4)
    else:  # REINFORCE / PPO-clip: the positive advantage up, the negative one down
        assert good > 0 > bad, (good, bad)
        # the logged curves say so too (measured on each step's batch, before its update)
        assert steps[-1]["logprob_positive"] > steps[0]["logprob_positive"]
        assert steps[-1]["logprob_negative"] < steps[0]["logprob_negative"]
    if objective == "clipped_ratio":
        assert run.reference_logprobs_s is not None
        assert steps[0]["ratio"] == pytest.approx(1.0, abs=1e-5)  # step 1: the reference itself
        assert steps[0]["clip_fraction"] == 0.0
    for h in steps:
        assert {"loss", "advantage", "weighted_advantage", "logprob", "reward"} <= h.keys()
    curves = scalars(tmp_path / "out" / "tensorboard")  # report_to tensorboard
    assert [step for step, _ in curves["train/loss"]] == [1, 2, 3], sorted(curves)


@pytest.mark.timeout(300)
def test_a_killed_offline_run_resumes_from_its_checkpoint(tiny: Path, tmp_path: Path) -> None:
    from cobalt.training.reporting.step_timing import StepTimer

    out = tmp_path / "out"
    first = config("clipped_ratio", max_steps=1, save_steps=1)
    train_offline(first, rows(), tiny, out)
    assert last_checkpoint(out) == str(out / "checkpoint-1")
    again = first.model_copy(update={"max_steps": 2})
    with StepTimer() as timer:
        run = train_offline(again, rows(), tiny, out, callbacks=[timer])
    assert len(timer.steps) == 1  # step 1 came from the checkpoint
    assert [h["step"] for h in run.history if "loss" in h] == [1, 2]
    assert last_checkpoint(out) == str(out / "checkpoint-2")


@pytest.mark.timeout(300)
def test_offline_lora_saves_a_plain_merged_model(tiny: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    lora = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    out = tmp_path / "out"
    train_offline(config("reinforce_loo", max_steps=1, lora=lora), rows(), tiny, out)
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    before = AutoModelForCausalLM.from_pretrained(str(tiny)).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed), changed


def test_no_rows_left_says_why(tiny: Path, tmp_path: Path) -> None:
    zero = [{**r, "advantage": 0.0} for r in rows()]
    with pytest.raises(ValueError, match="2 have advantage 0"):
        train_offline(config("reinforce_loo", max_steps=1), zero, tiny, tmp_path / "out")


@pytest.mark.timeout(300)
def test_a_non_finite_step_is_not_taken_and_no_policy_is_saved(
    tiny: Path, tmp_path: Path, monkeypatch
) -> None:
    """The offline trainer has GRPO's non-finite guard: a NaN loss at the second step leaves its
    gradients NaN, the step is void, training stops, and the run fails naming the step instead
    of saving a broken policy."""
    from cobalt.training import offline
    from cobalt.training.reporting.guards import NonFiniteError

    real = offline.OfflineTrainer.compute_loss

    def compute_loss(self, *args, **kwargs):
        loss = real(self, *args, **kwargs)
        return loss * float("nan") if self.state.global_step >= 1 else loss

    monkeypatch.setattr(offline.OfflineTrainer, "compute_loss", compute_loss)
    out = tmp_path / "out"
    with pytest.raises(NonFiniteError, match=r"non-finite gradients at optimizer step 2 \("):
        train_offline(config("reinforce_loo", max_steps=3), rows(), tiny, out)
    assert not (out / "model.safetensors").exists()


def test_reference_logprobs_match_row_by_row(tiny: Path) -> None:
    """Computed in length-sorted batches on a copy of the starting policy, each row's reference
    log-probabilities are its own: the same as the row scored alone (padding and batch order
    change nothing)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cobalt.training.machinery.weights import numerics_for
    from cobalt.training.offline import reference_logprobs

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    eos = end_of_turn_id(tokenizer, tiny)
    texts = [GOOD, BAD, "x", GOOD + "\n" + BAD]
    items = [tokenize_row({**rows()[0], "completion": t}, tokenizer, eos) for t in texts]
    numerics = numerics_for("fp32", tiny, gpu=False, mixed=False)
    got = reference_logprobs(tiny, numerics, items, 3, tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(str(tiny)).eval()
    collate = OfflineCollator(tokenizer.pad_token_id)
    with torch.no_grad():
        for item, ref in zip(items, got, strict=True):
            alone = token_logprobs(model, collate([item]))[0, item["prompt_length"] - 1 :]
            assert len(ref) == len(item["input_ids"]) - item["prompt_length"]
            assert ref == pytest.approx(alone.tolist(), abs=1e-4)


@pytest.mark.timeout(300)
def test_the_same_seed_trains_the_same_weights(tiny: Path, tmp_path: Path) -> None:
    """The learning check's determinism on CPU, for a run whose gradients are not zero: two
    offline runs of one seed under deterministic kernels end with equal weights, bit for bit."""
    from transformers import AutoModelForCausalLM

    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        for name in ("a", "b"):
            train_offline(config("reinforce_loo", max_steps=2), rows() * 2, tiny, tmp_path / name)
    finally:
        torch.use_deterministic_algorithms(False)
    a, b, start = (
        AutoModelForCausalLM.from_pretrained(str(p)).state_dict()
        for p in (tmp_path / "a", tmp_path / "b", tiny)
    )
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it trained
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(300)
def test_every_objective_trains_and_the_objective_matters(tiny: Path, tmp_path: Path) -> None:
    """The CPU smoke of every objective: a few real steps of `train_offline` from one
    seed move the weights with a finite loss, each objective to different weights, and the
    diagnostics the learning check reads are logged every step (drift 0 at step 1: the policy
    is still the reference)."""
    import math

    from safetensors.torch import load_file

    from cobalt.training.settings import OBJECTIVES

    start = load_file(str(tiny / "model.safetensors"))
    weights = {}
    for objective in OBJECTIVES:
        settings = OfflineSettings(
            objective=objective, batch_size=2, learning_rate=3e-3, diagnostics=True
        )
        cfg = TrainingConfig(mode="offline", offline=settings, max_steps=2)
        run = train_offline(cfg, rows() * 2, tiny, tmp_path / objective)
        steps = [h for h in run.history if "loss" in h]
        assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps), objective
        for h in steps:
            assert {
                "advantage_std", "negative_share", "negative_weight_share", "weight_std",
                "weight_max", "kl_ref", "logprob_drift", "ratio", "entropy", "grad_norm",
            } <= h.keys(), (objective, sorted(h))  # fmt: skip
        assert steps[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
        assert steps[0]["ratio"] == pytest.approx(1.0, abs=1e-5)
        assert steps[1]["kl_ref"] > 0 and steps[0]["entropy"] > 0
        # one of two rows has A < 0: REINFORCE and PPO push it down with half the signal, AWR
        # only lowers its weight (e^-2 against e^2)
        assert steps[0]["negative_share"] == 0.5
        expected = 1 / (1 + math.e**4) if objective == "awr" else 0.5
        assert steps[0]["negative_weight_share"] == pytest.approx(expected, rel=1e-4)
        weights[objective] = load_file(str(tmp_path / objective / "model.safetensors"))
        assert any(not torch.equal(weights[objective][k], start[k]) for k in start), objective
    for a in OBJECTIVES:
        for b in OBJECTIVES:
            if a < b:
                assert any(not torch.equal(weights[a][k], weights[b][k]) for k in start), (a, b)


@pytest.mark.timeout(300)
def test_a_step_is_the_token_mean_over_its_rows_whatever_its_micro_batches(
    tiny: Path, tmp_path: Path
) -> None:
    """Four rows of different lengths per optimizer step, as one micro-batch of 4 or as two of
    2 accumulated: the same update. Plain SGD, so the update is the gradient itself (Adam's
    first step is ~lr x sign(gradient), which turns float rounding of near-zero gradients into
    differences up to lr and hides what the test is for). The old mean of micro-batch means
    weighted the short rows' tokens more in the second layout: its update parted by 9%."""
    from safetensors.torch import load_file

    rows4 = rows() * 2
    rows4[1] = {**rows4[1], "completion": BAD + " " + BAD + " " + BAD}
    start = load_file(str(tiny / "model.safetensors"))
    updates = {}
    for name, batch, accumulation in (("one", 4, 1), ("two", 2, 2)):
        settings = OfflineSettings(
            objective="reinforce_loo",
            batch_size=batch,
            gradient_accumulation_steps=accumulation,
            learning_rate=3e-3,
        )
        cfg = TrainingConfig(mode="offline", offline=settings, max_steps=1, report_to=[])
        cfg = cfg.model_copy(update={"overrides": {"data_seed": 0, "optim": "sgd"}})
        train_offline(cfg, rows4, tiny, tmp_path / name)
        trained = load_file(str(tmp_path / name / "model.safetensors"))
        updates[name] = {k: trained[k] - start[k] for k in start}
    moved = max(float(updates["one"][k].abs().max()) for k in start)
    parted = max(float((updates["one"][k] - updates["two"][k]).abs().max()) for k in start)
    assert moved > 0 and parted < 1e-4 * moved, (moved, parted)


def test_the_rows_of_a_step_are_the_same_on_any_number_of_processes() -> None:
    """Rows per optimizer step do not grow with the processes: they share them (the offline
    global batch used to double on two processes), or the config names the fix."""
    from cobalt.training.decisions import ShardingError

    def step(processes: int, **offline) -> tuple[int, int, int]:
        cfg = TrainingConfig(
            mode="offline", num_processes=processes, offline=OfflineSettings(**offline)
        )
        micro, accumulation = cfg.offline_micro_batches()
        return micro, accumulation, micro * accumulation * processes

    assert step(1, batch_size=8) == (8, 1, 8)
    assert step(2, batch_size=8) == (4, 1, 8)
    assert step(2, batch_size=4, gradient_accumulation_steps=4) == (4, 2, 16)
    paper = TrainingConfig(preset="paper", mode="offline", num_processes=4)
    micro, accumulation = paper.offline_micro_batches()
    assert (micro, accumulation * micro * 4) == (8, 1024)
    with pytest.raises(ShardingError, match=r"8 rows per optimizer step .* over 3 processes"):
        step(3, batch_size=8)
