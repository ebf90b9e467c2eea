"""The evaluation arithmetic against hand-computed cases: the unbiased pass@k estimator and the
per-turn Pass@1 table (relative change to turn 0, by difficulty), and the plot."""

from __future__ import annotations

import pytest

from cobalt.tables import markdown_table
from cobalt.trajectories.evaluation import (
    EvalRecord,
    ProgramResult,
    pass_at_k,
    plot_pass_at_1,
    turn_table,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (16, 4, 1, 4 / 16),  # pass@1 is the share of correct samples
        (16, 0, 1, 0.0),
        (16, 16, 1, 1.0),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (3, 1, 3, 1.0),  # every draw holds the correct one: C(2,3) = 0
        (4, 1, 2, 1 - 3 / 6),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def cell(correct: bool | None, rate: float | None = None) -> ProgramResult:
    if correct is None:
        return ProgramResult(status="no_code")
    if correct:
        return ProgramResult(status="accepted", pass_rate=1.0, passed="11")
    return ProgramResult(
        status="wrong_answer", pass_rate=0.5 if rate is None else rate, passed="10"
    )


def record(pid: str, difficulty: str, grid: list[list[bool | None]]) -> EvalRecord:
    """grid[sample][turn]: True correct, False wrong (pass rate 0.5), None no program."""
    return EvalRecord(
        problem_id=pid,
        difficulty=difficulty,
        n_tests=2,
        n_public=1,
        results=[[cell(x) for x in row] for row in grid],
    )


EVALS = [
    # easy A: turn 0 one of two correct (0.5), turn 1 both (1.0)
    record("A", "easy", [[True, True], [False, True]]),
    # easy B: 0 -> 0.5
    record("B", "easy", [[False, False], [None, True]]),
    # hard C: 1.0 -> 0.5 (a regression)
    record("C", "hard", [[True, True], [True, False]]),
]


def test_turn_table_by_difficulty_against_hand_computed_values():
    table = turn_table(EVALS)
    by = {(r["difficulty"], r["turn"]): r for r in table}
    assert [(r["difficulty"], r["turn"]) for r in table] == [
        ("all", 0),
        ("all", 1),
        ("easy", 0),
        ("easy", 1),
        ("hard", 0),
        ("hard", 1),
    ]
    # all: turn 0 (0.5 + 0 + 1) / 3 = 50%, turn 1 (1 + 0.5 + 0.5) / 3 = 66.67%: +33.33%
    assert by["all", 0]["pass@1"] == 50.0 and by["all", 1]["pass@1"] == 66.67
    assert by["all", 0]["change_vs_turn0"] == 0.0 and by["all", 1]["change_vs_turn0"] == 33.33
    # easy: 25% -> 75% (+200%); hard: 100% -> 50% (-50%)
    assert (by["easy", 0]["pass@1"], by["easy", 1]["pass@1"]) == (25.0, 75.0)
    assert by["easy", 1]["change_vs_turn0"] == 200.0
    assert (by["hard", 0]["pass@1"], by["hard", 1]["change_vs_turn0"]) == (100.0, -50.0)
    assert by["all", 0]["problems"] == 3 and by["easy", 1]["samples"] == 4
    # mean test pass rate, turn 0: A (1 + .5)/2, B (.5 + 0)/2, C 1 -> (0.75 + 0.25 + 1) / 3
    assert by["all", 0]["test_pass_rate"] == 66.67
    assert by["all", 0]["no_program"] == pytest.approx(100 * 1 / 6, abs=0.01)
    assert "passes_wrong_test" not in by["all", 0]


def test_pass_at_k_over_samples_and_turns_argument():
    table = turn_table(EVALS, turns=1, k=2)
    by = {(r["difficulty"], r["turn"]): r for r in table}
    # k = 2 of n = 2: a problem counts if any sample is correct: turn 0 A, C; turn 1 all
    assert by["all", 0]["pass@2"] == 66.67 and by["all", 1]["pass@2"] == 100.0
    assert turn_table([]) == []


def test_markdown_and_png():
    table = turn_table(EVALS)
    text = markdown_table(table)
    assert text.splitlines()[0].startswith("| difficulty | turn | problems")
    assert len(text.splitlines()) == 2 + len(table)
    png = plot_pass_at_1(table)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
