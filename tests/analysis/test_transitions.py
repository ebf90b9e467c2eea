"""Counting what feedback turns do to programs, on hand-made trajectories and evaluations."""

from __future__ import annotations

from cobalt.analysis.transitions import feedback_kind, merge, summarize, transitions
from cobalt.trajectories.evaluation import EvalRecord, ProgramResult
from cobalt.trajectories.records import PublicVerdict, Record, Sample, Turn

# 2 public tests then 2 hidden ones; '1' = passed


def result(bits: str) -> ProgramResult:
    status = "accepted" if "0" not in bits else "wrong_answer"
    return ProgramResult(status=status, pass_rate=bits.count("1") / len(bits), passed=bits)


def turn(t: int, code: str | None, public: str | None = None) -> Turn:
    """A turn; `public` = its public verdict ('accepted' or a failure), None: not judged."""
    verdict = (
        None
        if public is None
        else PublicVerdict(status=public, pass_rate=1.0 if public == "accepted" else 0.0, passed=[])
    )
    feedback = None if (code is not None and public is None) else "feedback"
    return Turn(
        turn=t,
        outcome="code" if code is not None else "no_code",
        code=code,
        public=verdict,
        feedback=feedback,
    )


def make(samples: list[list[tuple[str | None, str]]]) -> tuple[dict, dict]:
    """samples[s] = [(code, all-test bits) per turn]; the public verdict follows the bits."""
    results, record_samples = [], []
    for index, turns in enumerate(samples):
        row, made = [], []
        for t, (code, bits) in enumerate(turns):
            if code is None:
                row.append(ProgramResult(status="no_code"))
                made.append(turn(t, None))
            else:
                row.append(result(bits))
                made.append(turn(t, code, "accepted" if bits[:2] == "11" else "wrong_answer"))
        results.append(row)
        record_samples.append(Sample(index=index, turns=made))
    evals = {
        "p": EvalRecord(problem_id="p", difficulty="rl", n_tests=4, n_public=2, results=results)
    }
    record = Record(
        problem_id="p", stage="multiturn", system="", instruction="i", samples=record_samples
    )
    return evals, {"p": record}


def test_feedback_kind() -> None:
    assert feedback_kind(turn(0, "x", "accepted")) == "passed"
    assert feedback_kind(turn(0, "x", "wrong_answer")) == "failed"
    assert feedback_kind(turn(0, None)) == "no_code"
    assert feedback_kind(turn(0, "x")) is None  # not judged: no feedback was given


def test_steps_by_feedback_with_public_pass_and_changes() -> None:
    evals, records = make(
        [
            # right, told 'passed', rewritten into a program that passes public tests only,
            # then told 'passed' again and kept unchanged
            [("a", "1111"), ("b", "1101"), ("b", "1101")],
            # wrong on a public test, told 'failed', repaired; then told 'passed' and kept
            [("c", "0111"), ("a", "1111"), ("a", "1111")],
            # no code, then a right program; then broken after 'passed' (fails a public test)
            [(None, ""), ("a", "1111"), ("d", "0011")],
        ]
    )
    rows = transitions(evals, records, classify=lambda pid, code: f"{pid}-{code}")
    table = {(r["turn"], r["feedback"], r["step"]): r for r in rows}
    assert set(table) == {
        (1, "passed", "broken"),
        (1, "failed", "repaired"),
        (1, "no_code", "repaired"),
        (2, "passed", "still_wrong"),
        (2, "passed", "kept"),
        (2, "passed", "broken"),
    }
    broken = table[(1, "passed", "broken")]
    assert (broken["count"], broken["changed"], broken["passes_public"]) == (1, 1, 1)
    assert broken["new_program"] == {"p-b": 1}
    kept = table[(2, "passed", "kept")]
    assert (kept["count"], kept["changed"], kept["new_program"]) == (1, 0, {})
    assert table[(2, "passed", "broken")]["passes_public"] == 0
    assert table[(2, "passed", "still_wrong")]["changed"] == 0
    assert all(r["group"] == "rl" for r in rows)

    summary = {(s["turn"], s["feedback"]): s for s in summarize(rows)}
    two = summary[(2, "passed")]
    assert (two["steps"], two["right_before"], two["broken"], two["wrong_before"]) == (3, 2, 1, 1)
    assert two["broken_pct"] == 50.0 and two["right_rewritten_pct"] == 50.0
    assert two["broken_passing_public_pct"] == 0.0 and two["repaired_pct"] == 0.0
    assert summary[(1, "failed")]["repaired_pct"] == 100.0
    assert summary[(1, "failed")]["broken_pct"] is None  # nothing was right before


def test_ended_samples_are_not_counted_and_runs_merge() -> None:
    evals, records = make([[("a", "1111"), ("a", "1111")]])
    evals["p"].results[0].append(ProgramResult(status="missing"))  # the sample ended
    rows = transitions(evals, records, group_of=lambda e: "g")
    assert [(r["turn"], r["step"], r["count"]) for r in rows] == [(1, "kept", 1)]
    merged = merge([rows, rows])
    assert merged[0]["count"] == 2 and merged[0]["group"] == "g"
    assert transitions(evals, {}) == []  # no trajectory record: nothing to count
