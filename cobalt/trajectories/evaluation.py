"""Evaluation of trajectories (METHOD §1.3): every turn's program judged on all true tests, per-turn
Pass@1 with the unbiased pass@k estimator over a problem's samples, its relative change to turn 0,
by difficulty, as a table and a plot.

Plain functions (no Prefect; matplotlib imported only to draw). Results go to a JSONL file, one
`EvalRecord` per problem, with the same durability and resume rules as the trajectories
(`cobalt.trajectories.records.RecordLog`). `stop_on_public_pass` gives the same evaluation under the
protocol variant where a sample stops at its first program that passes every public test;
`problem_scores` the per-problem pass@k a bootstrap interval is drawn from
(`cobalt.analysis.intervals`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from math import comb
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from cobalt.plots import figure, png
from cobalt.trajectories.batching import BatchConfig, Gate, Stats, chunks, progress_bar
from cobalt.trajectories.records import ENDING_OUTCOMES, Record, RecordLog
from sandbox import JudgeRequest, SyncJudge, TestSuite

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator: the chance that at least one of k samples drawn without
    replacement from n (c of them correct) is correct, 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


class ProgramResult(BaseModel):
    """One turn's program on all tests (public + hidden)."""

    model_config = ConfigDict(extra="forbid")

    status: str = Field(
        description="accepted, a test status, or no_code / engine_error / "
        "context_overflow / missing (the sample had ended) when nothing ran."
    )
    pass_rate: float = 0.0
    passed: str = Field("", description="One character per test, '1' passed, '0' failed.")
    modified_passed: str | None = Field(
        None, description="Perturbed problems: the same over the deliberately wrong tests."
    )

    @property
    def correct(self) -> bool:
        return self.status == "accepted"


class EvalRecord(BaseModel):
    """One problem: results[sample][turn]."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str
    source: str = ""
    difficulty: str = "unknown"
    n_tests: int
    n_public: int
    n_modified: int = 0
    results: list[list[ProgramResult]]


class EvalProblem(Protocol):
    id: str
    difficulty: str

    @property
    def tests(self) -> TestSuite: ...


def _suite(problem: EvalProblem) -> tuple[TestSuite, int, int]:
    """The judged suite: all true tests, then the wrong (modified) tests if the problem has any."""
    tests = problem.tests
    modified: TestSuite | None = getattr(problem, "modified_tests", None)
    if not modified or not modified.inputs:
        return tests, len(tests.inputs), 0
    suite = TestSuite(
        inputs=tests.inputs + modified.inputs,
        outputs=tests.outputs + modified.outputs,
        fn_name=tests.fn_name,
    )
    return suite, len(tests.inputs), len(modified.inputs)


def evaluate(
    problems: Sequence[EvalProblem],
    records: dict[str, Record],
    judge: SyncJudge,
    turns: int,
    path: str | Path,
    batch: BatchConfig | None = None,
    *,
    gate: Gate | None = None,
    progress: bool = False,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> tuple[dict[str, EvalRecord], Stats]:
    """Judge the program of every turn 0..`turns` of every sample on all tests of its problem
    (identical programs of a problem once); one `EvalRecord` per problem appended to `path`."""
    batch = batch or BatchConfig()
    stats, started = Stats(), time.perf_counter()
    missing = [p.id for p in problems if p.id not in records]
    if missing:
        raise ValueError(f"{len(missing)} problems have no trajectory record (first: {missing[0]})")
    with RecordLog(path, EvalRecord, logger) as store:
        done = store.open()
        todo = [p for p in problems if p.id not in done]
        stats.skipped = len(problems) - len(todo)
        with progress_bar(len(todo), "evaluate", progress) as bar:
            for chunk in chunks(todo, batch.chunk_size):
                requests: dict[tuple[str, str], JudgeRequest] = {}
                suites = {p.id: _suite(p) for p in chunk}
                for p in chunk:
                    for sample in records[p.id].samples:
                        for turn in sample.turns:
                            key = (p.id, turn.code or "")
                            if turn.code is not None and key not in requests:
                                requests[key] = JudgeRequest(
                                    id=f"{p.id}#{len(requests)}",
                                    code=turn.code,
                                    tests=suites[p.id][0],
                                )
                verdicts = {}
                if requests:
                    t0 = time.perf_counter()
                    with (gate or nullcontext)():
                        verdicts = dict(
                            zip(requests, judge.judge_many(list(requests.values())), strict=True)
                        )
                    stats.sandbox_s += time.perf_counter() - t0
                    stats.sandbox_busy_s = stats.sandbox_s
                    stats.programs_judged += len(requests)
                for p in chunk:
                    suite, n_tests, n_modified = suites[p.id]
                    record = records[p.id]
                    results = []
                    for sample in record.samples:
                        row = []
                        by_turn = {t.turn: t for t in sample.turns}
                        for t in range(turns + 1):
                            turn = by_turn.get(t)
                            if turn is None:
                                row.append(ProgramResult(status="missing"))
                            elif turn.code is None:
                                row.append(
                                    ProgramResult(
                                        status=turn.outcome
                                        if turn.outcome in ENDING_OUTCOMES
                                        else "no_code"
                                    )
                                )
                            else:
                                v = verdicts[(p.id, turn.code)]
                                bits = "".join("1" if ok else "0" for ok in v.passed)
                                true_bits = bits[:n_tests]
                                status = (
                                    "accepted"
                                    if n_tests and "0" not in true_bits
                                    else next(
                                        (s for s in v.outcomes[:n_tests] if s != "passed"),
                                        "wrong_answer",
                                    )
                                )
                                row.append(
                                    ProgramResult(
                                        status=status,
                                        pass_rate=true_bits.count("1") / n_tests
                                        if n_tests
                                        else 0.0,
                                        passed=true_bits,
                                        modified_passed=bits[n_tests:] if n_modified else None,
                                    )
                                )
                        results.append(row)
                    n_public = len(getattr(p, "public_tests", suite).inputs)
                    out = EvalRecord(
                        problem_id=p.id,
                        source=record.source,
                        difficulty=p.difficulty,
                        n_tests=n_tests,
                        n_public=n_public,
                        n_modified=n_modified,
                        results=results,
                    )
                    store.append(out)
                    done[p.id] = out
                    stats.problems += 1
                if bar is not None:
                    bar.update(len(chunk))
    stats.wall_s = time.perf_counter() - started
    return done, stats


# --- tables ----------------------------------------------------------------------------------


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def turn_table(
    evals: Iterable[EvalRecord], turns: int | None = None, k: int = 1
) -> list[dict[str, Any]]:
    """Per difficulty ('all' first, then each label) and turn: problems, samples, pass@k (%)
    averaged over problems, its relative change to turn 0 (%), the mean test pass rate (%), the
    share of turns without a program (%), and, for perturbed problems, the share of programs
    that pass a deliberately wrong test (%)."""
    evals = list(evals)
    if not evals:
        return []
    if turns is None:
        turns = max(len(row) for e in evals for row in e.results) - 1
    groups: dict[str, list[EvalRecord]] = defaultdict(list)
    for e in evals:
        groups["all"].append(e)
        groups[e.difficulty].append(e)
    order = ["all", *sorted(g for g in groups if g != "all")]
    rows = []
    for group in order:
        members = [e for e in groups[group] if e.results]
        base = None
        for t in range(turns + 1):
            scores, rates, no_code, wrong, programs = [], [], 0, 0, 0
            perturbed = any(e.n_modified for e in members)
            for e in members:
                cells = [_cell(row, t) for row in e.results]
                n = len(cells)
                c = sum(cell.correct for cell in cells)
                scores.append(pass_at_k(n, c, k) if n >= k else float(c > 0))
                rates.append(sum(cell.pass_rate for cell in cells) / n)
                no_code += sum(
                    cell.status in ("no_code", "engine_error", "context_overflow", "missing")
                    for cell in cells
                )
                wrong += sum("1" in (cell.modified_passed or "") for cell in cells)
                programs += n
            score = sum(scores) / len(scores) if scores else 0.0
            if t == 0:
                base = score
            row: dict[str, Any] = {
                "difficulty": group,
                "turn": t,
                "problems": len(members),
                "samples": programs,
                f"pass@{k}": _pct(score),
                "change_vs_turn0": _pct((score - base) / base) if base else None,
                "test_pass_rate": _pct(sum(rates) / len(rates) if rates else 0.0),
                "no_program": _pct(no_code / programs if programs else 0.0),
            }
            if perturbed:
                row["passes_wrong_test"] = _pct(wrong / programs if programs else 0.0)
            rows.append(row)
    return rows


def _cell(row: list[ProgramResult], turn: int) -> ProgramResult:
    return row[turn] if turn < len(row) else ProgramResult(status="missing")


def problem_scores(evals: Iterable[EvalRecord], turn: int, k: int = 1) -> dict[str, float]:
    """pass@k of every problem at `turn` (a sample that ended earlier counts as failed)."""
    scores = {}
    for e in evals:
        if e.results:
            cells = [_cell(row, turn) for row in e.results]
            n, c = len(cells), sum(cell.correct for cell in cells)
            scores[e.problem_id] = pass_at_k(n, c, k) if n >= k else float(c > 0)
    return scores


def stop_on_public_pass(
    evals: Mapping[str, EvalRecord], records: Mapping[str, Record]
) -> dict[str, EvalRecord]:
    """The evaluation as if each sample had stopped at its first program that passed every public
    test, that program kept for the turns after (METHOD §1.2 instead asks again after a pass). The
    public verdicts are the ones recorded during collection; nothing is judged again."""
    out = {}
    for pid, e in evals.items():
        record = records.get(pid)
        results = []
        for index, row in enumerate(e.results):
            turns = record.samples[index].turns if record and index < len(record.samples) else []
            stop = next(
                (t.turn for t in turns if t.public is not None and t.public.status == "accepted"),
                None,
            )
            results.append(row if stop is None else [row[min(t, stop)] for t in range(len(row))])
        out[pid] = e.model_copy(update={"results": results})
    return out


def plot_pass_at_1(rows: list[dict[str, Any]], title: str = "Pass@1 per turn") -> bytes:
    """A PNG of Pass@1 (%) against the turn, one line per difficulty ('all' bold)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        series[r["difficulty"]].append((r["turn"], r["pass@1"]))
    with figure(figsize=(6.4, 4.0), dpi=100) as (fig, ax):
        for name, points in series.items():
            xs, ys = zip(*points, strict=True)
            problems = next(r["problems"] for r in rows if r["difficulty"] == name)
            ax.plot(
                xs,
                ys,
                marker="o",
                linewidth=2.5 if name == "all" else 1.2,
                label=f"{name} ({problems})",
            )
        ax.set_xlabel("turn (0 = first program)")
        ax.set_ylabel("Pass@1 (%)")
        ax.set_title(title)
        ax.set_xticks(sorted({r["turn"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend(title="difficulty (problems)", fontsize=8)
        return png(fig)


def plot_before_after(rows: list[dict[str, Any]], title: str = "Pass@1 per turn") -> bytes:
    """A PNG of a before/after table (difficulty, turn, problems, before_pass@1, after_pass@1,
    change_points): each difficulty in one colour, before dashed, after solid ('all' bold), the
    change in points written beside each after point."""
    from matplotlib.lines import Line2D

    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["difficulty"]].append(r)
    with figure(figsize=(7.6, 4.2), dpi=100) as (fig, ax):
        handles = []
        placed: dict[int, list[float]] = defaultdict(list)  # per turn: the labels written
        for index, (name, members) in enumerate(groups.items()):
            members.sort(key=lambda r: r["turn"])
            colour, width = f"C{index}", 2.5 if name == "all" else 1.2
            xs = [r["turn"] for r in members]
            after = [r["after_pass@1"] for r in members]
            before = [r["before_pass@1"] for r in members]
            ax.plot(xs, before, color=colour, linestyle="--", marker="o", mfc="white", lw=width)
            ax.plot(xs, after, color=colour, linestyle="-", marker="o", lw=width)
            for r in members:  # the label on the side away from the before point
                up = r["change_points"] >= 0
                # beside, not over, a label already written at about the same height (in Pass@1
                # points: the label sits ~4 above or below its point) at the same turn
                height = r["after_pass@1"] + (4 if up else -4)
                near = sum(abs(y - height) < 5 for y in placed[r["turn"]])
                placed[r["turn"]].append(height)
                ax.annotate(
                    f"{r['change_points']:+.1f}",
                    (r["turn"], r["after_pass@1"]),
                    xytext=(22 * near, 7 if up else -7),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if up else "top",
                    color=colour,
                    fontsize=8,
                    fontweight="bold" if name == "all" else "normal",
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
                )
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colour,
                    linewidth=width,
                    label=f"{name} ({members[0]['problems']})",
                )
            )
        handles += [
            Line2D([], [], color="grey", linestyle="--", marker="o", mfc="white", label="before"),
            Line2D([], [], color="grey", marker="o", label="after (+/- points)"),
        ]
        turns = sorted({r["turn"] for r in rows})
        ax.set_xlabel("turn (0 = first program)")
        ax.set_ylabel("Pass@1 (%)")
        ax.set_title(title)
        ax.set_xticks(turns)
        ax.set_xlim(turns[0] - 0.25, turns[-1] + 0.25)
        ax.margins(y=0.1)  # room for the labels
        ax.grid(alpha=0.3)
        ax.legend(
            handles=handles,
            title="difficulty (problems)",
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
        return png(fig)
