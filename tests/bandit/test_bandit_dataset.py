"""The bandit dataset (METHOD §1.4) against hand-worked expectations."""

from __future__ import annotations

import pytest

from cobalt.bandit.selection import (
    ProblemData,
    bandit_rows,
    combined_pass_rate,
    max_variance_subset,
    partial_contexts,
    problem_data_from_eval,
    problem_rows,
    select_samples,
)
from cobalt.trajectories.evaluation import EvalRecord, ProgramResult
from cobalt.trajectories.records import PublicVerdict, Record, Sample, Turn


def make_record(public: list[list[bool]], pid: str = "p/1") -> Record:
    """public[s][t]: whether turn t of sample s passed the public tests."""
    samples = []
    for s, row in enumerate(public):
        turns = [
            Turn(
                turn=t,
                answer=f"a{s}{t}",
                code="x",
                outcome="code",
                public=PublicVerdict(
                    status="accepted" if ok else "wrong_answer",
                    pass_rate=1.0 if ok else 0.5,
                    passed=[ok] * 4,
                ),
                feedback=f"f{s}{t}",
            )
            for t, ok in enumerate(row)
        ]
        samples.append(Sample(index=s, turns=turns))
    return Record(
        problem_id=pid,
        difficulty="hard",
        stage="multiturn",
        system="SYS",
        instruction="INS",
        feedback_tests="public",
        samples=samples,
    )


def data(rates: list[list[float]], public: list[list[bool]] | None = None) -> ProblemData:
    """n_tests == n_public == 4, so combined == the public rate given here."""
    public = public or [[False] * len(r) for r in rates]
    return ProblemData(make_record(public), rates, rates, 4, {"tests": "all"})


def test_combined_pass_rate() -> None:
    # (0.5 * (10 - 4) + 1.0 * 4) / 10 = (3 + 4) / 10
    assert combined_pass_rate(0.5, 1.0, 10) == pytest.approx(0.7)
    # (0.25 * 4 + 0.5 * 4) / 8 = 3 / 8
    assert combined_pass_rate(0.25, 0.5, 8) == pytest.approx(0.375)


def test_problem_data_from_eval() -> None:
    ev = EvalRecord(
        problem_id="p/1",
        n_tests=6,
        n_public=4,
        results=[[ProgramResult(status="wrong_answer", pass_rate=5 / 6, passed="110111")]],
    )
    d = problem_data_from_eval(make_record([[False]]), ev, None)
    # public "1101" = 3/4, hidden "11" = 2/2; combined (1 * 2 + 0.75 * 4) / 6 = 5/6
    assert d.public == [[0.75]] and d.hidden == [[1.0]]
    assert d.combined() == [[pytest.approx(5 / 6)]]


def test_dynamic_sampling_train_vs_test() -> None:
    diffs = [0.0, 0.5, 0.3, 0.6]
    best = [1.0, 1.0, 0.8, 0.6]
    assert select_samples(diffs, best, "train") == [1]  # diff > 0 and best == 1: only sample 1
    assert select_samples(diffs, best, "test") == [2]  # diff > 0: 1, 2, 3; smallest diff 0.3
    assert select_samples(diffs, best, "validation") == [2]
    assert select_samples([0.0, 0.0], [1.0, 0.0], "test") == []


def test_max_variance_down_sampling() -> None:
    diffs = [0.5, 0.1, 0.9, 0.2, 0.3, 0.7, 0.05]
    # sorted: 0.05(6) 0.1(1) 0.2(3) 0.3(4) 0.5(0) 0.7(5) 0.9(2); n = min(16, 7) = 7
    # k=0 [.05 .1 .2 .3]  mean .1625 var (.01265625+.00390625+.00140625+.01890625)/4 = .009219
    # k=1 [.05 .1 .2 .9]  mean .3125 var (.06890625+.04515625+.01265625+.34515625)/4 = .117969
    # k=2 [.05 .1 .7 .9]  mean .4375 var (.15015625+.11390625+.06890625+.21390625)/4 = .136719
    # k=3 [.05 .5 .7 .9]  mean .5375 var (.23765625+.00140625+.02640625+.13140625)/4 = .099219
    # k=2 wins: samples 6, 1, 5, 2
    assert max_variance_subset(range(7), diffs) == [6, 1, 5, 2]
    assert select_samples(diffs, [1.0] * 7, "train") == [1, 2, 5, 6]
    # at most 4 qualifying: all kept
    assert select_samples(diffs[:4], [1.0] * 4, "train") == [0, 1, 2, 3]


def test_prev_best_and_prefix_lengths() -> None:
    rec = make_record([[False] * 4])
    ctx = partial_contexts(rec, 0, [0.0, 0.25, 0.75, 0.5])
    # contexts after feedback 1, 2, 3; prev_best = max of turns before: max(0)=0,
    # max(0, .25)=.25, max(0, .25, .75)=.75
    assert [len(m) for m, _ in ctx] == [4, 6, 8]
    assert [b for _, b in ctx] == [0.0, 0.25, 0.75]
    assert ctx[2][0] == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "INS"},
        {"role": "assistant", "content": "a00"},
        {"role": "user", "content": "f00"},
        {"role": "assistant", "content": "a01"},
        {"role": "user", "content": "f01"},
        {"role": "assistant", "content": "a02"},
        {"role": "user", "content": "f02"},
    ]


def test_stop_when_two_feedbacks_pass() -> None:
    rec = make_record([[True, True, False, False]])
    ctx = partial_contexts(rec, 0, [0.5, 0.5, 0.5, 0.5])
    # context 1 has one (passing) feedback; context 2's last two feedbacks (turns 0, 1) both pass
    assert [len(m) for m, _ in ctx] == [4]
    rec = make_record([[True, False, True, True]])
    # turns 0 and 2 pass but not in a row: all three contexts stay
    assert len(partial_contexts(rec, 0, [0.5, 0.5, 0.5, 0.5])) == 3


def test_stop_on_token_limit() -> None:
    rec = make_record([[False] * 4])
    # 1000 tokens per message: 4000, 6000, 8000 for contexts 1..3; limit 5000 keeps context 1
    ctx = partial_contexts(rec, 0, [0.0] * 4, lambda m: 1000 * len(m), max_prompt_tokens=5000)
    assert [len(m) for m, _ in ctx] == [4]
    ctx = partial_contexts(rec, 0, [0.0] * 4, lambda m: 1000 * len(m))  # 10,000 default: all 3
    assert len(ctx) == 3


def test_stop_when_already_solved() -> None:
    rec = make_record([[False] * 4])
    # context 2: turn 1 (before) == 1.0 and turn 2 (at) == 1.0 -> stop; context 1 kept
    ctx = partial_contexts(rec, 0, [0.2, 1.0, 1.0, 1.0])
    assert [b for _, b in ctx] == [0.2]
    # solved at turn 1 but regressing at turn 2: contexts 2 and 3 kept, prev_best 1.0
    ctx = partial_contexts(rec, 0, [0.2, 1.0, 0.5, 0.5])
    assert [b for _, b in ctx] == [0.2, 1.0, 1.0]


def test_skip_all_solved_problem() -> None:
    assert problem_rows(data([[1.0, 1.0, 1.0], [1.0, 0.5, 1.0]])) == []


def test_problem_rows_train_and_test() -> None:
    # sample 0: diff 1 - 0 = 1, best 1; sample 1: diff .5, best .5; sample 2: diff 0
    d = data([[0.0, 0.5, 1.0, 1.0], [0.0, 0.5, 0.5, 0.5], [0.25] * 4])
    rows = problem_rows(d, "train")
    # turn 0 (prev 0) + sample 0: context 1 (prev 0), context 2 (prev .5); context 3 stops since
    # turns 2 and 3 are both 1.0
    assert [(len(r["prompt"]), r["prev_best_pass_rate"]) for r in rows] == [
        (2, 0.0),
        (4, 0.0),
        (6, 0.5),
    ]
    assert rows[1]["prompt"][2]["content"] == "a00"
    assert all(
        r["test_cases"] == {"tests": "all"}
        and r["difficulty"] == "hard"
        and r["example_id"] == "p/1"
        for r in rows
    )
    # test mode: smallest positive diff is sample 1 (0.5): contexts 1..3, prev 0, .5, .5
    rows = problem_rows(d, "test")
    assert [(r["prompt"][-2:], r["prev_best_pass_rate"]) for r in rows[1:]] == [
        ([{"role": "assistant", "content": "a10"}, {"role": "user", "content": "f10"}], 0.0),
        ([{"role": "assistant", "content": "a11"}, {"role": "user", "content": "f11"}], 0.5),
        ([{"role": "assistant", "content": "a12"}, {"role": "user", "content": "f12"}], 0.5),
    ]


def test_bandit_rows_seeded_shuffle() -> None:
    problems = [data([[0.0, 0.5, 0.75, 1.0]] * 2), data([[1.0] * 4] * 2)]  # second skipped
    a = bandit_rows(problems, seed=3)
    b = bandit_rows(problems, seed=3)
    assert a == b
    # 1 turn-0 row + 2 samples x 3 contexts (no stop rule fires)
    assert len(a) == 7
    assert sorted(len(r["prompt"]) for r in a) == [2, 4, 4, 6, 6, 8, 8]
