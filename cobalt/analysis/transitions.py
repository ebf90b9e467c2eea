"""What feedback turns do to programs: for every sample and feedback turn t >= 1, the step from the
program of turn t-1 to the program of turn t, judged on all tests (right / wrong), split by the
feedback the model was given after turn t-1:

- `passed`: the program passed every public test (METHOD §1.2's "look for edge cases" turn);
- `failed`: a failure report of the first failing public test;
- `no_code`: the answer had no fenced code block.

Each step is `kept` (right -> right), `broken` (right -> wrong), `repaired` (wrong -> right) or
`still_wrong`. For every step it also counts whether the program text changed and whether the new
program passes the public tests (a broken program that still passes them was caught by the hidden
tests only). An optional `classify(problem_id, code)` names what a rewritten program is (e.g. the
reference program of another synthetic kind). Plain Python; the records are those of
`cobalt.trajectories.records` and `cobalt.trajectories.evaluation`.

    rows = transitions(evals, records, group_of=lambda e: e.difficulty)
    table = summarize(rows)   # per group, turn and feedback: counts and shares
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cobalt.trajectories.evaluation import EvalRecord, ProgramResult
from cobalt.trajectories.records import Record, Turn

FEEDBACK = ("passed", "failed", "no_code")
STEPS = ("kept", "broken", "repaired", "still_wrong")
_ENDED = ("missing", "engine_error", "context_overflow")


def feedback_kind(turn: Turn) -> str | None:
    """Which feedback followed this turn: passed, failed, no_code, or None (none was given)."""
    if turn.code is None:
        return "no_code" if turn.feedback is not None else None
    if turn.public is None:
        return None
    return "passed" if turn.public.status == "accepted" else "failed"


def step_name(before: bool, after: bool) -> str:
    if before:
        return "kept" if after else "broken"
    return "repaired" if after else "still_wrong"


def _passes_public(result: ProgramResult, n_public: int) -> bool:
    bits = result.passed[:n_public]
    return bool(n_public) and len(bits) == n_public and "0" not in bits


def transitions(
    evals: Mapping[str, EvalRecord],
    records: Mapping[str, Record],
    group_of: Callable[[EvalRecord], str] | None = None,
    classify: Callable[[str, str | None], str] | None = None,
) -> list[dict[str, Any]]:
    """Counted steps, one row per (group, turn, feedback, step) that occurred: `count`, `changed`
    (program text differs from the previous turn's), `passes_public` (the new program passes every
    public test) and, with `classify`, `new_program` {class: count} over the steps whose program
    changed. Samples that ended (no turn t) and turns without feedback are not counted."""
    counts: dict[tuple[str, int, str, str], Counter] = {}
    classes: dict[tuple[str, int, str, str], Counter] = {}
    for pid, e in evals.items():
        record = records.get(pid)
        if record is None:
            continue
        group = group_of(e) if group_of else e.difficulty
        for index, row in enumerate(e.results):
            if index >= len(record.samples):
                continue
            turns = {t.turn: t for t in record.samples[index].turns}
            for t in range(1, len(row)):
                prev_turn, cur_turn = turns.get(t - 1), turns.get(t)
                if prev_turn is None or cur_turn is None or row[t].status in _ENDED:
                    continue
                kind = feedback_kind(prev_turn)
                if kind is None:
                    continue
                step = step_name(row[t - 1].correct, row[t].correct)
                key = (group, t, kind, step)
                c = counts.setdefault(key, Counter())
                c["count"] += 1
                changed = (cur_turn.code or "") != (prev_turn.code or "")
                c["changed"] += changed
                c["passes_public"] += _passes_public(row[t], e.n_public)
                if classify is not None and changed:
                    classes.setdefault(key, Counter())[classify(pid, cur_turn.code)] += 1
    rows = []
    for key in sorted(counts, key=_order):
        group, t, kind, step = key
        row_ = {"group": group, "turn": t, "feedback": kind, "step": step, **counts[key]}
        row_.setdefault("changed", 0)
        row_.setdefault("passes_public", 0)
        if classify is not None:
            row_["new_program"] = dict(sorted(classes.get(key, Counter()).items()))
        rows.append(row_)
    return rows


def _order(key: tuple[str, int, str, str]) -> tuple:
    group, t, kind, step = key
    return (group, t, FEEDBACK.index(kind), STEPS.index(step))


def merge(runs: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several runs (seeds) summed per (group, turn, feedback, step)."""
    total: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    for rows in runs:
        for r in rows:
            key = (r["group"], r["turn"], r["feedback"], r["step"])
            into = total.setdefault(
                key, {"group": key[0], "turn": key[1], "feedback": key[2], "step": key[3]}
            )
            for name in ("count", "changed", "passes_public"):
                into[name] = into.get(name, 0) + r.get(name, 0)
            if "new_program" in r:
                programs = into.setdefault("new_program", {})
                for cls, n in r["new_program"].items():
                    programs[cls] = programs.get(cls, 0) + n
    return [total[k] for k in sorted(total, key=_order)]


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (group, turn, feedback): how many programs were right before (`right_before`) and how
    many of those broke (`broken`, `broken_pct`), were rewritten (`right_rewritten_pct`), and of
    the broken ones still passed the public tests (`broken_passing_public_pct`); how many were
    wrong before and were repaired (`repaired`, `repaired_pct`)."""
    cells: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["group"], r["turn"], r["feedback"]), {})[r["step"]] = r
    out = []
    for (group, t, kind), steps in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1], FEEDBACK.index(kv[0][2]))
    ):

        def n(step: str, field: str = "count", steps=steps) -> int:
            return steps.get(step, {}).get(field, 0)

        right = n("kept") + n("broken")
        wrong = n("repaired") + n("still_wrong")
        out.append(
            {
                "group": group,
                "turn": t,
                "feedback": kind,
                "steps": right + wrong,
                "right_before": right,
                "broken": n("broken"),
                "broken_pct": _pct(n("broken"), right),
                "right_rewritten_pct": _pct(n("kept", "changed") + n("broken", "changed"), right),
                "broken_passing_public_pct": _pct(n("broken", "passes_public"), n("broken")),
                "wrong_before": wrong,
                "repaired": n("repaired"),
                "repaired_pct": _pct(n("repaired"), wrong),
            }
        )
    return out


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 1) if whole else None
