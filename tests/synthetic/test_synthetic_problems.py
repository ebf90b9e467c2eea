"""The synthetic problem family: deterministic, distinct statements, reference programs that pass."""

from __future__ import annotations

import pytest

from sandbox import JudgeRequest, SandboxConfig, SyncJudge
from tasks import synthetic
from tasks.problems import instruction


@pytest.fixture(scope="module")
def judge():
    with SyncJudge(SandboxConfig(backend="namespace", concurrency=2)) as j:
        yield j


def test_kinds_and_held_out():
    assert len(synthetic.KINDS) == 30
    assert set(synthetic.HELD_OUT) <= set(synthetic.KINDS)
    seen = synthetic.seen_kinds()
    assert len(seen) == 30 - len(synthetic.HELD_OUT)
    # every operation and every format still appears among the seen kinds
    assert {k.split("/")[0] for k in seen} == set(synthetic.OPERATIONS)
    assert {k.split("/")[1] for k in seen} == set(synthetic.FORMATS)
    with pytest.raises(ValueError):
        synthetic.reference_solution("median/count")


def test_problem_records():
    problems = synthetic.make_problems(synthetic.KINDS, 30, seed=1)
    assert len({p.statement for p in problems}) == 30
    assert len({p.id for p in problems}) == 30
    for p in problems:
        kind = synthetic.kind_of(p)
        assert p.source == "synthetic" and p.provenance.dataset == "synthetic"
        assert p.difficulty == ("held_out" if kind in synthetic.HELD_OUT else "seen")
        assert p.instruction == instruction(p.statement)
        assert len(p.public_tests.inputs) == 2 and len(p.hidden_tests.inputs) == 6
        assert p.solutions == [synthetic.reference_solution(kind)]


def test_deterministic_per_seed():
    a = synthetic.make_problems(synthetic.seen_kinds(), 40, seed=7)
    b = synthetic.make_problems(synthetic.seen_kinds(), 40, seed=7)
    c = synthetic.make_problems(synthetic.seen_kinds(), 40, seed=8)
    assert [p.model_dump() for p in a] == [p.model_dump() for p in b]
    assert [p.tests for p in a] != [p.tests for p in c]


def test_reference_solutions_pass_in_sandbox(judge):
    problems = synthetic.make_problems(synthetic.KINDS, 60, seed=3)
    requests = [
        JudgeRequest(
            id=p.id, code=synthetic.reference_solution(synthetic.kind_of(p)), tests=p.tests
        )
        for p in problems
    ]
    verdicts = judge.judge_many(requests)
    failed = [(v.id, v.status, v.feedback) for v in verdicts if not v.accepted]
    assert not failed, failed
    # and a wrong program (another kind's solution) fails
    wrong = JudgeRequest(
        id="wrong", code=synthetic.reference_solution("max/count"), tests=problems[0].tests
    )
    assert synthetic.kind_of(problems[0]) == "sum/count"
    assert not judge.judge_many([wrong])[0].accepted
