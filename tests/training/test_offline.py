"""The offline mode (METHOD §2) against hand-computed values: leave-one-out baselines, the dataset
rows of hand-made trajectories (rewards, prev_best, contexts, baseline groups), the three
objectives' losses and gradients, and the `OfflineTrainer` on the tiny model: a real step moves a
completion's log-probability the way its advantage says, and a killed run resumes."""

from __future__ import annotations

import math

import pytest
import torch

from cobalt.bandit.selection import ProblemData
from cobalt.training.method.offline_objectives import awr_weights, offline_loss
from cobalt.training.method.offline_rows import assign_advantages, loo_baselines, offline_rows
from cobalt.training.offline import OfflineCollator, prepare_offline_rows
from cobalt.training.settings import OfflineSettings, TrainingConfig
from cobalt.trajectories.records import Record, Sample, Turn

# --- leave-one-out baselines and advantages ------------------------------------------------------


def test_loo_baseline_is_the_mean_of_the_others() -> None:
    # rewards 1.0, 0.2, -0.1: baselines (0.2 - 0.1) / 2, (1 - 0.1) / 2, (1 + 0.2) / 2
    assert loo_baselines([1.0, 0.2, -0.1]) == pytest.approx([0.05, 0.45, 0.6])
    assert loo_baselines([0.5]) == [None]
    assert loo_baselines([]) == []
    # r - baseline = n / (n - 1) * (r - mean): 0.95, -0.25, -0.7 = 1.5 * (r - 1.1 / 3)
    rewards = [1.0, 0.2, -0.1]
    advantages = [r - b for r, b in zip(rewards, loo_baselines(rewards), strict=True)]
    assert advantages == pytest.approx([0.95, -0.25, -0.7])
    assert advantages == pytest.approx([1.5 * (r - 1.1 / 3) for r in rewards])


def turn(t: int, answer: str, code: bool = True, feedback: str | None = "fb", **kw) -> Turn:
    return Turn(
        turn=t,
        response=answer,
        answer=answer,
        code="x" if code else None,
        outcome="code" if code else "no_code",
        feedback=feedback,
        **kw,
    )


def problem(pid: str, samples: list[list[Turn]], rates: list[list[float]]) -> ProblemData:
    """n_tests == n_public == 4, so the combined pass rate is the rate given."""
    record = Record(
        problem_id=pid,
        difficulty="hard",
        stage="multiturn",
        system="",
        instruction=f"solve {pid}",
        feedback_tests="public",
        samples=[Sample(index=i, turns=t) for i, t in enumerate(samples)],
    )
    return ProblemData(record, rates, rates, 4, None)


def hand_made() -> list[ProblemData]:
    p1 = problem(
        "p/1",
        [
            [turn(0, "a0", feedback="f0"), turn(1, "b0", feedback=None)],
            [turn(0, "a1", code=False, feedback="f1"), turn(1, "b1", feedback=None)],
            [turn(0, "a2", feedback="f2"), turn(1, "b2", feedback=None, finish_reason="length")],
        ],
        [[0.5, 1.0], [0.0, 0.25], [0.75, 0.5]],
    )
    # two samples that wrote the same first answer and got the same feedback: one turn-1 context
    p2 = problem(
        "p/2",
        [
            [turn(0, "same", feedback="f"), turn(1, "fixed", feedback=None)],
            [turn(0, "same", feedback="f"), turn(1, "broken", feedback=None)],
        ],
        [[0.0, 1.0], [0.0, 0.0]],
    )
    # one sample only (no baseline); its second turn ended the sample without generating
    p3 = problem(
        "p/3",
        [[turn(0, "only", feedback="f"), Turn(turn=1, outcome="engine_error", error="boom")]],
        [[0.5, 0.0]],
    )
    return [p1, p2, p3]


def test_offline_rows_of_hand_made_trajectories() -> None:
    rows = offline_rows(hand_made())
    got = {(r["example_id"], r["sample"], r["turn"]): r for r in rows}
    assert list(got) == [
        ("p/1", 0, 0),
        ("p/1", 0, 1),
        ("p/1", 1, 0),
        ("p/1", 1, 1),
        ("p/1", 2, 0),
        ("p/1", 2, 1),
        ("p/2", 0, 0),
        ("p/2", 0, 1),
        ("p/2", 1, 0),
        ("p/2", 1, 1),
        ("p/3", 0, 0),
    ]  # p/3's engine error is no row
    # rewards (METHOD §1.5) from the pass rate and the best earlier turn of the same sample
    expected = {
        ("p/1", 0, 0): (0.5, 0.0, 0.2),  # p >= 0.5
        ("p/1", 0, 1): (1.0, 0.5, 1.0),  # solved
        ("p/1", 1, 0): (None, 0.0, -1.0),  # no code block
        ("p/1", 1, 1): (0.25, 0.0, 0.0),  # p > 0, prev_best 0: no improvement term
        ("p/1", 2, 0): (0.75, 0.0, 0.2),
        ("p/1", 2, 1): (0.5, 0.75, -0.1 + 0.1 * (0.5 - 0.75) / 0.75),  # regression penalty
        ("p/2", 0, 1): (1.0, 0.0, 1.0),
        ("p/2", 1, 1): (0.0, 0.0, -0.1),
    }
    for key, (pass_rate, prev_best, reward) in expected.items():
        row = got[key]
        assert row["pass_rate"] == (None if pass_rate is None else pytest.approx(pass_rate)), key
        assert row["prev_best_pass_rate"] == pytest.approx(prev_best), key
        assert row["reward"] == pytest.approx(reward), key
    # contexts: the instruction at turn 0; then the sample's own answer and feedback
    assert got[("p/1", 0, 0)]["prompt"] == [{"role": "user", "content": "solve p/1"}]
    assert got[("p/1", 2, 1)]["prompt"] == [
        {"role": "user", "content": "solve p/1"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "f2"},
    ]
    assert got[("p/1", 2, 1)]["completion"] == "b2"
    assert got[("p/1", 2, 1)]["stopped"] is False and got[("p/1", 2, 0)]["stopped"] is True

    # turn 0 of p/1: one context for all three samples; rewards 0.2, -1, 0.2
    # baselines (-1 + 0.2) / 2 = -0.4, (0.2 + 0.2) / 2 = 0.2, -0.4
    assert [got[("p/1", s, 0)]["baseline_group"] for s in range(3)] == ["context"] * 3
    assert [got[("p/1", s, 0)]["advantage"] for s in range(3)] == pytest.approx([0.6, -1.2, 0.6])
    # turn 1 of p/1: three different contexts -> the other samples of the same problem and turn
    # rewards 1.0, 0.0, r = -0.1333; baselines (0 + r) / 2, (1 + r) / 2, (1 + 0) / 2
    r = -0.1 + 0.1 * (0.5 - 0.75) / 0.75
    assert [got[("p/1", s, 1)]["baseline_group"] for s in range(3)] == ["turn"] * 3
    assert [got[("p/1", s, 1)]["advantage"] for s in range(3)] == pytest.approx(
        [1.0 - r / 2, 0.0 - (1 + r) / 2, r - 0.5]
    )
    # p/2: both turn-0 rewards -0.1 (pass rate 0): advantage 0; identical turn-1 contexts share
    # a group: 1.0 vs -0.1 -> +1.1 and -1.1
    assert [got[("p/2", s, 0)]["advantage"] for s in range(2)] == pytest.approx([0.0, 0.0])
    assert [got[("p/2", s, 1)]["baseline_group"] for s in range(2)] == ["context"] * 2
    assert [got[("p/2", s, 1)]["advantage"] for s in range(2)] == pytest.approx([1.1, -1.1])
    # p/3: alone in its context and its turn: no baseline, advantage 0
    assert got[("p/3", 0, 0)]["baseline_group"] == "none"
    assert got[("p/3", 0, 0)]["baseline"] is None and got[("p/3", 0, 0)]["advantage"] == 0.0


def test_context_group_wins_over_the_turn_group() -> None:
    rows = [
        {"example_id": "p", "turn": 1, "prompt": [{"role": "user", "content": c}], "reward": r}
        for c, r in (("A", 1.0), ("A", 0.0), ("B", -1.0))
    ]
    assign_advantages(rows)
    # A, A share a context: 1 - 0, 0 - 1; B is alone: the other two of the turn, (1 + 0) / 2
    assert [r["advantage"] for r in rows] == pytest.approx([1.0, -1.0, -1.5])
    assert [r["baseline_group"] for r in rows] == ["context", "context", "turn"]


# --- objectives ----------------------------------------------------------------------------------

LOGPROBS = [[-1.0, -2.0], [-0.5, -3.0]]
MASK = [[1, 1], [1, 0]]  # row 1's second position is padding
ADV = [0.5, -1.0]


def loss_of(objective: str, ref=None, **settings):
    f64 = torch.float64  # exact enough to compare with the hand-computed values
    logprobs = torch.tensor(LOGPROBS, dtype=f64, requires_grad=True)
    loss, metrics = offline_loss(
        logprobs,
        torch.tensor(MASK),
        torch.tensor(ADV, dtype=f64),
        OfflineSettings(objective=objective, **settings),
        None if ref is None else torch.tensor(ref, dtype=f64),
    )
    loss.backward()
    return float(loss.detach()), metrics, logprobs.grad.flatten().tolist()


def test_reinforce_loo_loss_is_minus_advantage_times_logprob() -> None:
    loss, metrics, grad = loss_of("reinforce_loo")
    # (-0.5 * -1 + -0.5 * -2 + 1.0 * -0.5) / 3 tokens
    assert loss == pytest.approx((0.5 + 1.0 - 0.5) / 3)
    assert grad == pytest.approx([-0.5 / 3, -0.5 / 3, 1.0 / 3, 0.0])
    assert metrics["weighted_advantage"] == pytest.approx((0.5 - 1.0) / 2)
    assert metrics["logprob"] == pytest.approx((-1 - 2 - 0.5) / 3)


def test_awr_weights_are_exponentiated_and_clipped() -> None:
    w = awr_weights(torch.tensor([0.6, -1.2, 3.0]), beta=0.5, max_weight=5.0)
    # exp(1.2) = 3.3201, exp(-2.4) = 0.0907, exp(6) = 403 -> 5
    assert w.tolist() == pytest.approx([math.exp(1.2), math.exp(-2.4), 5.0])
    loss, metrics, grad = loss_of("awr", awr_beta=1.0, awr_max_weight=20.0)
    w0, w1 = math.exp(0.5), math.exp(-1.0)
    assert loss == pytest.approx((w0 * 1 + w0 * 2 + w1 * 0.5) / 3)
    assert grad == pytest.approx([-w0 / 3, -w0 / 3, -w1 / 3, 0.0])  # every row pulled up
    assert metrics["weight"] == pytest.approx((w0 + w1) / 2)
    assert metrics["weighted_advantage"] == pytest.approx((w0 * 0.5 - w1 * 1.0) / 2)
    clipped, _, _ = loss_of("awr", awr_beta=0.1, awr_max_weight=2.0)  # exp(5) -> 2
    assert clipped == pytest.approx((2 * 1 + 2 * 2 + math.exp(-10) * 0.5) / 3)


def test_clipped_ratio_clips_against_the_reference() -> None:
    # ratios: row 0 exp(-1 + 1) = 1 and exp(-2 + 1.5) = 0.6065 (A > 0: the unclipped term is
    # the smaller, no clip); row 1 exp(-0.5 - 0) = 0.6065 < 0.8 with A < 0: clipped to 0.8
    ref = [[-1.0, -1.5], [0.0, -3.0]]
    loss, metrics, grad = loss_of("clipped_ratio", ref=ref, ratio_clip=0.2)
    r01, r10 = math.exp(-0.5), math.exp(-0.5)
    assert loss == pytest.approx((-0.5 * 1.0 - 0.5 * r01 + 1.0 * 0.8) / 3)
    # d/dl of -A r = -A r; the clipped token has no gradient
    assert grad == pytest.approx([-0.5 / 3, -0.5 * r01 / 3, 0.0, 0.0])
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["ratio"] == pytest.approx(((1.0 + r01) / 2 + r10) / 2)
    # at the reference itself the ratio is 1 and the gradient is REINFORCE's
    _, _, at_ref = loss_of("clipped_ratio", ref=LOGPROBS)
    assert at_ref == pytest.approx(loss_of("reinforce_loo")[2])
    with pytest.raises(ValueError, match="reference log-probabilities"):
        loss_of("clipped_ratio")


def test_bad_objective_name_is_refused_with_the_field() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"offline\.objective") as caught:
        TrainingConfig(mode="offline", offline={"objective": "ppo"})
    assert "reinforce_loo" in str(caught.value) and "clipped_ratio" in str(caught.value)
    with pytest.raises(ValueError, match="num_generations"):
        TrainingConfig(mode="offline", overrides={"num_generations": 4}).check()
    with pytest.raises(ValueError, match="use_format_reward"):
        TrainingConfig(mode="offline", use_format_reward=True)


def test_collator_masks_the_prompt_and_aligns_reference_logprobs() -> None:
    features = [
        {"input_ids": [5, 6, 7, 8], "prompt_length": 2, "advantage": 1.0, "reward": 1.0},
        {"input_ids": [5, 9, 10], "prompt_length": 2, "advantage": -1.0, "reward": 0.0},
    ]
    batch = OfflineCollator(pad_id=0)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [5, 9, 10, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["completion_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    assert "ref_logprobs" not in batch
    features[0]["ref_logprobs"], features[1]["ref_logprobs"] = [-0.1, -0.2], [-0.3]
    # shifted targets: position p - 1 predicts token p
    ref = OfflineCollator(0)(features)["ref_logprobs"]
    assert ref.flatten().tolist() == pytest.approx([0.0, -0.1, -0.2, 0.0, -0.3, 0.0])


def test_prepare_drops_zero_advantages_and_long_rows() -> None:
    rows = [{"advantage": a, "n": n} for a, n in ((1.0, 3), (0.0, 3), (-1.0, 9))]

    def tokenize(row):
        return {"input_ids": [1] * row["n"], "prompt_length": 1}

    got = prepare_offline_rows(
        rows, OfflineSettings(objective="reinforce_loo"), tokenize, max_length=8
    )
    assert (len(got.rows), got.dropped_zero_advantage, got.dropped_too_long) == (1, 1, 1)
    awr = prepare_offline_rows(rows, OfflineSettings(objective="awr"), tokenize, max_length=8)
    assert (len(awr.rows), awr.dropped_zero_advantage) == (2, 0)  # AWR keeps A = 0 (weight 1)


def test_prepare_counts_every_reason_when_no_row_is_left() -> None:
    # an unfinished turn cut at 0 tokens: no completion token, nothing to train on
    rows = [{"advantage": a, "n": n} for a, n in ((0.0, 3), (1.0, 9), (1.0, 1), (-1.0, 1))]

    def tokenize(row):
        return {"input_ids": [1] * row["n"], "prompt_length": 1}

    with pytest.raises(ValueError) as error:
        prepare_offline_rows(rows, OfflineSettings(objective="reinforce_loo"), tokenize, 8)
    assert str(error.value) == (
        "no offline rows to train on: of 4 rows, 1 have advantage 0 (reinforce_loo, "
        "drop_zero_advantage), 1 are longer than 8 tokens (training.offline.max_length) and 2 "
        "have an empty completion (no token to train on)"
    )


def test_presets_map_to_training_arguments(tmp_path) -> None:
    paper = TrainingConfig(preset="paper", mode="offline").offline_kwargs(tmp_path)
    # METHOD §1.6: lr 1e-6, 64 prompts x 16 samples = 1024 rows per optimizer step
    assert paper["learning_rate"] == 1e-6 and paper["max_grad_norm"] == 1.0
    assert paper["per_device_train_batch_size"] * paper["gradient_accumulation_steps"] == 1024
    assert paper["gradient_checkpointing"] and paper["save_steps"] == 50
    tiny = TrainingConfig(mode="offline", max_steps=3, save_steps=1).training_arguments(tmp_path)
    assert (tiny.learning_rate, tiny.max_steps, tiny.save_steps) == (1e-5, 3, 1)
    assert tiny.remove_unused_columns is False  # the collator needs the rows' own columns


def test_one_default_objective_for_flows_pipeline_and_learning_check() -> None:
    """`--mode offline` without an objective: the flows, the pipeline's embedded default and the
    learning check all take `DEFAULT_OBJECTIVE` (one constant to change)."""
    from cobalt.presets import tiny_training
    from cobalt.training.settings import DEFAULT_OBJECTIVE, OBJECTIVES
    from experiments.learning_check.config import build_parser

    assert DEFAULT_OBJECTIVE in OBJECTIVES
    assert OfflineSettings().objective == DEFAULT_OBJECTIVE
    assert tiny_training("offline").offline.objective == DEFAULT_OBJECTIVE

    args = build_parser().parse_args(["--out", "x"])
    assert args.offline_objective == DEFAULT_OBJECTIVE
