"""The bootstrap intervals and the verdict, and the per-problem and stop-on-public-pass views of
an evaluation, on hand-made values."""

from __future__ import annotations

import pytest

from cobalt.analysis.intervals import bootstrap_difference, bootstrap_mean, verdict
from cobalt.trajectories.evaluation import (
    EvalRecord,
    ProgramResult,
    problem_scores,
    stop_on_public_pass,
)
from cobalt.trajectories.records import PublicVerdict, Record, Sample, Turn


def test_a_constant_has_a_point_interval_and_the_mean_is_the_observed_one() -> None:
    interval = bootstrap_mean({0: [0.5, 0.5], 1: [0.5]})
    assert (interval.mean, interval.low, interval.high) == (0.5, 0.5, 0.5)
    assert (interval.seeds, interval.values) == (2, 3)
    spread = bootstrap_mean({0: [0.0, 1.0, 1.0, 0.0], 1: [1.0, 1.0, 1.0, 0.0]})
    assert spread.mean == pytest.approx(5 / 8)
    assert 0.0 <= spread.low < spread.mean < spread.high <= 1.0
    assert spread == bootstrap_mean({0: [0.0, 1.0, 1.0, 0.0], 1: [1.0, 1.0, 1.0, 0.0]})  # seeded


def test_seeds_that_disagree_widen_the_interval() -> None:
    agree = bootstrap_mean({s: [0.4, 0.6] * 10 for s in range(5)})
    disagree = bootstrap_mean({s: [s / 4] * 20 for s in range(5)})  # same mean 0.5
    assert agree.mean == pytest.approx(disagree.mean)
    assert (disagree.high - disagree.low) > 2 * (agree.high - agree.low)


def test_paired_difference_and_verdict() -> None:
    a = {s: {f"p{i}": 1.0 if i % 4 else 0.0 for i in range(40)} for s in range(5)}
    b = {s: {f"p{i}": 1.0 if i % 2 else 0.0 for i in range(40)} for s in range(5)}
    ahead = bootstrap_difference(a, b)
    assert ahead.mean == pytest.approx(0.25) and ahead.low > 0
    assert verdict(ahead, "cobalt", "single_turn") == "cobalt ahead"
    assert verdict(bootstrap_difference(b, a), "cobalt", "single_turn") == "single_turn ahead"
    same = bootstrap_difference(a, a)
    assert (same.low, same.high) == (0.0, 0.0)
    assert verdict(same, "cobalt", "single_turn") == "no difference"
    noisy = bootstrap_difference({0: {"p": 1.0, "q": 0.0}}, {0: {"p": 0.0, "q": 1.0}})
    assert verdict(noisy, "x", "y") == "no difference"
    with pytest.raises(ValueError, match="no seed"):
        bootstrap_difference({0: {"p": 1.0}}, {1: {"p": 1.0}})


def result(status: str) -> ProgramResult:
    return ProgramResult(status=status, pass_rate=1.0 if status == "accepted" else 0.0)


def turn(t: int, public: str | None) -> Turn:
    verdict_ = None if public is None else PublicVerdict(status=public, pass_rate=0, passed=[])
    return Turn(turn=t, outcome="code", code="x", public=verdict_)


def test_stop_on_public_pass_keeps_the_first_publicly_passing_program() -> None:
    # sample 0 passes its public tests at turn 0 (and is right), then is rewritten wrongly;
    # sample 1 fails its public tests, is repaired at turn 1, broken again at turn 2
    evals = {
        "p": EvalRecord(
            problem_id="p",
            n_tests=4,
            n_public=2,
            results=[
                [result("accepted"), result("wrong_answer"), result("wrong_answer")],
                [result("wrong_answer"), result("accepted"), result("runtime_error")],
            ],
        )
    }
    record = Record(
        problem_id="p",
        stage="multiturn",
        system="",
        instruction="i",
        samples=[
            Sample(index=0, turns=[turn(0, "accepted"), turn(1, "wrong_answer"), turn(2, None)]),
            Sample(index=1, turns=[turn(0, "wrong_answer"), turn(1, "accepted"), turn(2, None)]),
        ],
    )
    assert [problem_scores(evals.values(), t)["p"] for t in range(3)] == [0.5, 0.5, 0.0]
    stopped = stop_on_public_pass(evals, {"p": record})
    assert [problem_scores(stopped.values(), t)["p"] for t in range(3)] == [0.5, 1.0, 1.0]
    assert [c.status for c in stopped["p"].results[0]] == ["accepted"] * 3
    assert evals["p"].results[0][1].status == "wrong_answer"  # the input is left as it was
