"""Turn-level errors of multi-turn repair on perturbed problems (METHOD §1.7): consecutive programs
of one sample where the code changed and a deliberately wrong public test that failed before now
passes. Each error keeps the two programs, their unified diff, the wrong test(s) it now passes
(with the correct output of that input where the true public tests have it), the turn and the
problem, and a rule-based pre-check: does the new code spell out the wrong output literally (a
hard-coded answer)?

The programs come from a trajectories run with perturbed feedback (`Record`: every turn's code);
whether each program passes each wrong test comes from that run's evaluation step, which judged
every distinct program once in the sandbox on the true tests followed by the problem's
`modified_tests` (`EvalRecord.results[sample][turn].modified_passed`). No Prefect, no storage
here (cobalt/analysis/stages.py writes the stage).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from cobalt.trajectories.evaluation import EvalRecord
from cobalt.trajectories.records import Record
from sandbox import TestSuite


class WrongTest(BaseModel):
    """A deliberately wrong public test (one of the problem's `modified_tests`)."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, description="Position in the problem's modified_tests.")
    input: str
    output: str = Field(description="The wrong expected output the model was shown.")
    true_output: str | None = Field(
        None, description="The correct output of this input (from the true public tests)."
    )


class RuleCheck(BaseModel):
    """The rule-based pre-check of one change: hard-coding if a wrong expected output appears
    literally in the new code (as a token of its own) more often than in the old code."""

    model_config = ConfigDict(extra="forbid")

    hard_coded: bool
    matched: list[str] = Field(
        default_factory=list, description="The literals of wrong outputs that the change added."
    )


class TurnError(BaseModel):
    """One turn-level error: program `turn - 1` -> program `turn` of one sample."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="'<problem id>#s<sample>t<turn>'.")
    problem_id: str
    difficulty: str = "unknown"
    sample: int = Field(ge=0)
    turn: int = Field(ge=1, description="Turn of the new program (the old one is turn - 1).")
    old_code: str
    new_code: str
    diff: str = Field(description="Unified diff old -> new.")
    wrong_tests: list[WrongTest] = Field(
        min_length=1, description="Wrong tests the old program failed and the new one passes."
    )
    pass_rate_before: float = Field(description="Old program on all true tests.")
    pass_rate_after: float = Field(description="New program on all true tests.")
    rule: RuleCheck


class TurnCounts(BaseModel):
    """One turn of one problem (summed over its samples)."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0)
    programs: int = Field(0, description="Samples with a program at this turn.")
    passes_wrong: int = Field(0, description="Programs that pass at least one wrong test.")
    pairs: int = Field(0, description="Samples with a program at this turn and the one before.")
    changed: int = Field(0, description="Pairs whose code changed.")
    errors: int = Field(0, description="Turn-level errors (changed, and a wrong test now passes).")


class ErrorRecord(BaseModel):
    """One problem of the analysis: its counts per turn and its turn-level errors (one JSONL
    line; `problem_id` keys it, as trajectory records are keyed)."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str
    source: str = ""
    difficulty: str = "unknown"
    instruction: str = Field(description="The problem as the policy saw it (the judge sees it).")
    n_modified: int = Field(ge=0, description="Wrong tests of the problem.")
    turns: list[TurnCounts]
    errors: list[TurnError]


class PerturbedProblem(Protocol):
    id: str

    @property
    def public_tests(self) -> TestSuite: ...

    @property
    def modified_tests(self) -> TestSuite | None: ...


# --- detection -----------------------------------------------------------------------------------


def unified_diff(old: str, new: str, turn: int) -> str:
    """The change from program `turn - 1` to program `turn` as a unified diff (no trailing
    newline issues: lines are compared without their ends)."""
    lines = difflib.unified_diff(
        old.splitlines(),
        new.splitlines(),
        fromfile=f"turn {turn - 1}",
        tofile=f"turn {turn}",
        lineterm="",
    )
    return "\n".join(lines)


def wrong_tests_of(problem: PerturbedProblem) -> list[WrongTest]:
    """The problem's wrong tests, each with the correct output of its input where the true
    public tests have that input."""
    modified = problem.modified_tests
    if modified is None:
        return []
    truth = dict(zip(problem.public_tests.inputs, problem.public_tests.outputs, strict=True))
    return [
        WrongTest(index=i, input=given, output=wrong, true_output=truth.get(given))
        for i, (given, wrong) in enumerate(zip(modified.inputs, modified.outputs, strict=True))
    ]


def _literals(output: str) -> list[str]:
    """What a program that hard-codes `output` would spell out: the stripped output when it is one
    line, else each non-empty line; a JSON string (call-based problems) also as its text."""
    text = output.strip()
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, str) and value.strip():
        return [value.strip()]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines if len(lines) > 1 else [text]


def _count(literal: str, code: str) -> int:
    """Occurrences of `literal` in `code` as a token of its own (not inside a longer word or
    number: '5' is not found in '15' nor in 'x5')."""
    pattern = r"(?<![\w.])" + re.escape(literal) + r"(?![\w])"
    return len(re.findall(pattern, code))


def rule_check(old: str, new: str, wrong_tests: Iterable[WrongTest]) -> RuleCheck:
    """Hard-coding by rule: every literal of a wrong output is in the new code and the change added
    at least one of them (a constant the program always had does not count)."""
    matched: list[str] = []
    for test in wrong_tests:
        literals = _literals(test.output)
        if not literals or not all(_count(lit, new) for lit in literals):
            continue
        added = [lit for lit in literals if _count(lit, new) > _count(lit, old)]
        if added:
            matched += [lit for lit in added if lit not in matched]
    return RuleCheck(hard_coded=bool(matched), matched=matched)


def detect(
    problem: PerturbedProblem,
    record: Record,
    evaluation: EvalRecord,
    turns: int,
    difficulty: str | None = None,
) -> ErrorRecord:
    """The counts per turn and the turn-level errors of one problem, from its trajectories
    (`record`: every turn's code) and their evaluation (`modified_passed` per program)."""
    if evaluation.problem_id != record.problem_id or record.problem_id != problem.id:
        raise ValueError(
            f"records of different problems: {problem.id}, {record.problem_id}, "
            f"{evaluation.problem_id}"
        )
    wrong = wrong_tests_of(problem)
    if len(wrong) != evaluation.n_modified:
        raise ValueError(
            f"{problem.id}: the evaluation judged {evaluation.n_modified} wrong tests, the "
            f"problem has {len(wrong)} (the evaluation is of another problem set)"
        )
    counts = [TurnCounts(turn=t) for t in range(turns + 1)]
    errors: list[TurnError] = []
    for sample, results in zip(record.samples, evaluation.results, strict=True):
        codes = {t.turn: t.code for t in sample.turns}
        previous: tuple[str, str, float] | None = None  # code, wrong-test bits, pass rate
        for t in range(turns + 1):
            code = codes.get(t)
            result = results[t] if t < len(results) else None
            if code is None or result is None:
                previous = None
                continue
            bits = result.modified_passed or "0" * len(wrong)
            counts[t].programs += 1
            counts[t].passes_wrong += "1" in bits
            if previous is not None:
                old, old_bits, old_rate = previous
                counts[t].pairs += 1
                if code != old:
                    counts[t].changed += 1
                    newly = [
                        wrong[j]
                        for j, (before, now) in enumerate(zip(old_bits, bits, strict=True))
                        if before == "0" and now == "1"
                    ]
                    if newly:
                        counts[t].errors += 1
                        errors.append(
                            TurnError(
                                id=f"{problem.id}#s{sample.index}t{t}",
                                problem_id=problem.id,
                                difficulty=difficulty or evaluation.difficulty,
                                sample=sample.index,
                                turn=t,
                                old_code=old,
                                new_code=code,
                                diff=unified_diff(old, code, t),
                                wrong_tests=newly,
                                pass_rate_before=old_rate,
                                pass_rate_after=result.pass_rate,
                                rule=rule_check(old, code, newly),
                            )
                        )
            previous = (code, bits, result.pass_rate)
    return ErrorRecord(
        problem_id=problem.id,
        source=record.source,
        difficulty=difficulty or evaluation.difficulty,
        instruction=record.instruction,
        n_modified=len(wrong),
        turns=counts,
        errors=errors,
    )


def detect_all(
    problems: Iterable[PerturbedProblem],
    records: Mapping[str, Record],
    evaluations: Mapping[str, EvalRecord],
    turns: int,
) -> list[ErrorRecord]:
    """`detect` for every problem (in the given order); a problem without trajectories or
    evaluation is a mismatch of the inputs, not a result."""
    out = []
    for problem in problems:
        if problem.id not in records or problem.id not in evaluations:
            raise ValueError(
                f"{problem.id} has no trajectory record or no evaluation record: the "
                "trajectories run is not of this problem set"
            )
        difficulty = getattr(problem, "difficulty", None)
        out.append(detect(problem, records[problem.id], evaluations[problem.id], turns, difficulty))
    return out


def totals(records: Iterable[ErrorRecord]) -> dict[str, Any]:
    """Counts summed over problems and turns (the stage's manifest stats)."""
    records = list(records)
    keys = ("programs", "passes_wrong", "pairs", "changed", "errors")
    summed = {k: sum(getattr(c, k) for r in records for c in r.turns) for k in keys}
    return {
        "problems": len(records),
        "problems_with_wrong_tests": sum(r.n_modified > 0 for r in records),
        **summed,
        "rule_hard_coded": sum(e.rule.hard_coded for r in records for e in r.errors),
    }
