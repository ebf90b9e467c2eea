"""The Cobalt bandit dataset (METHOD §1.4): training contexts from trajectories evaluated per turn.

Plain functions, no Prefect and no `datasets`: `bandit_rows` returns a list of dicts
(`datasets.Dataset.from_list` is the caller's job). Per problem the inputs are its trajectory
`Record`, `hidden[sample][turn]` (pass rate on the hidden tests), `public[sample][turn]` (on the
`n_public` public tests) and `n_tests` (`problem_data_from_eval` derives them from an `EvalRecord`).

Choices where METHOD §1.4 is open:

- A turn that was not run (the sample ended) counts with pass rate 0.
- Ties in diff are broken by sample index (stable sort); max-variance keeps the earliest
  candidate on equal variance (population variance); test/validation keeps the lowest-index
  sample among those with the smallest diff.
- "Feedback says the public tests pass" = the turn's recorded public verdict has pass rate 1.0
  (`Turn.public`); the feedback text itself is not parsed.
- Context t (ends after feedback t, built from the answers of turns 0..t-1) is not emitted, and
  neither is any later one, when: turn t-1 has no feedback (the sample ended), the feedbacks of
  turns t-2 and t-1 both say the public tests pass, `prompt_tokens(messages) > max_prompt_tokens`,
  or the sample is already solved before and at that turn: combined[t-1] == 1.0 and
  combined[t] == 1.0 (only combined[t-1] when turn t was not recorded).
- The turn-0 context is added once per (non-skipped) problem, with prev_best 0, whatever its
  length and whether or not any sample is kept.
- A problem is skipped when every sample's turn-0 program passes every test (combined == 1.0).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cobalt.trajectories.records import Record

Mode = Literal["train", "test", "validation"]
MAX_PROMPT_TOKENS = 10_000
M_SAMPLES = 4
N_FIRST = 16
FEEDBACK_TURNS = 3


def combined_pass_rate(hidden: float, public: float, n_tests: int, n_public: int = 4) -> float:
    """(hidden * (n_tests - n_public) + public * n_public) / n_tests."""
    if n_tests <= 0:
        return 0.0
    n_public = min(n_public, n_tests)
    return (hidden * (n_tests - n_public) + public * n_public) / n_tests


def max_variance_subset(
    indices: Sequence[int], diffs: Sequence[float], m: int = M_SAMPLES
) -> list[int]:
    """Max-variance down-sampling (arXiv 2504.13818) of `indices` to `m` by their diffs."""
    order = sorted(indices, key=lambda i: (diffs[i], i))
    if len(order) <= m:
        return order
    first = order[: min(N_FIRST, len(order))]
    best = first[:m]
    best_var = statistics.pvariance([diffs[i] for i in best])
    for k in range(1, m):
        cand = first[: m - k] + first[len(first) - k :]
        var = statistics.pvariance([diffs[i] for i in cand])
        if var > best_var:
            best, best_var = cand, var
    return best


def select_samples(diffs: Sequence[float], best: Sequence[float], mode: Mode) -> list[int]:
    """Dynamic sampling (+ max-variance down-sampling for training); returns sample indices."""
    if mode == "train":
        keep = [i for i, d in enumerate(diffs) if d > 0 and best[i] >= 1.0]
        return sorted(max_variance_subset(keep, diffs)) if len(keep) > M_SAMPLES else keep
    keep = [i for i, d in enumerate(diffs) if d > 0]
    return [min(keep, key=lambda i: (diffs[i], i))] if keep else []


def _public_passed(record: Record, sample: int, turn: int) -> bool:
    public = record.samples[sample].turns[turn].public
    return public is not None and public.pass_rate >= 1.0


def partial_contexts(
    record: Record,
    sample: int,
    rates: Sequence[float],
    prompt_tokens: Callable[[list[dict[str, str]]], int] | None = None,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    feedback_turns: int = FEEDBACK_TURNS,
) -> list[tuple[list[dict[str, str]], float]]:
    """(messages, prev_best_pass_rate) for the contexts ending after feedback 1..`feedback_turns`
    of one sample; `rates[t]` = combined pass rate of turn t's program."""
    turns = record.samples[sample].turns
    out: list[tuple[list[dict[str, str]], float]] = []
    for t in range(1, feedback_turns + 1):
        if t - 1 >= len(turns) or turns[t - 1].feedback is None:
            break
        if (
            t >= 2
            and _public_passed(record, sample, t - 2)
            and _public_passed(record, sample, t - 1)
        ):
            break
        if rates[t - 1] >= 1.0 and (t >= len(rates) or rates[t] >= 1.0):
            break
        messages = record.conversation(sample, t - 1)
        if prompt_tokens is not None and prompt_tokens(messages) > max_prompt_tokens:
            break
        out.append((messages, max(rates[:t])))
    return out


@dataclass
class ProblemData:
    """One problem's trajectories and per-turn evaluation."""

    record: Record
    hidden: list[list[float]]  # [sample][turn], hidden tests
    public: list[list[float]]  # [sample][turn], public tests
    n_tests: int
    test_cases: Any  # all tests, as the reward function wants them
    n_public: int = 4

    def combined(self) -> list[list[float]]:
        return [
            [
                combined_pass_rate(h, p, self.n_tests, self.n_public)
                for h, p in zip(hs, ps, strict=True)
            ]
            for hs, ps in zip(self.hidden, self.public, strict=True)
        ]


def problem_data_from_eval(record: Record, evaluation: Any, test_cases: Any) -> ProblemData:
    """Split an `EvalRecord`'s per-test `passed` strings (public tests first) into hidden and
    public pass rates; a turn with nothing judged counts 0 on both."""
    n, n_pub = evaluation.n_tests, evaluation.n_public
    hidden, public = [], []
    for turns in evaluation.results:
        hs, ps = [], []
        for r in turns:
            bits = r.passed[:n]
            ps.append(bits[:n_pub].count("1") / n_pub if n_pub else 0.0)
            hs.append(bits[n_pub:].count("1") / (n - n_pub) if n > n_pub else 0.0)
        hidden.append(hs)
        public.append(ps)
    return ProblemData(record, hidden, public, n, test_cases, n_pub)


def problem_rows(
    data: ProblemData,
    mode: Mode = "train",
    prompt_tokens: Callable[[list[dict[str, str]]], int] | None = None,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    feedback_turns: int = FEEDBACK_TURNS,
) -> list[dict[str, Any]]:
    """The bandit rows of one problem (unshuffled): turn 0, then the kept samples' contexts."""
    rec = data.record
    rates = data.combined()
    if not rates or all(r and r[0] >= 1.0 for r in rates):
        return []

    def row(messages: list[dict[str, str]], prev_best: float) -> dict[str, Any]:
        return {
            "prompt": messages,
            "test_cases": data.test_cases,
            "prev_best_pass_rate": prev_best,
            "difficulty": rec.difficulty,
            "example_id": rec.problem_id,
        }

    rows = [row(rec.first_messages(), 0.0)]
    diffs = [max(r) - min(r) if r else 0.0 for r in rates]
    best = [max(r) if r else 0.0 for r in rates]
    for s in select_samples(diffs, best, mode):
        for messages, prev_best in partial_contexts(
            rec, s, rates[s], prompt_tokens, max_prompt_tokens, feedback_turns
        ):
            rows.append(row(messages, prev_best))
    return rows


def bandit_rows(
    problems: Sequence[ProblemData],
    mode: Mode = "train",
    prompt_tokens: Callable[[list[dict[str, str]]], int] | None = None,
    seed: int = 0,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    feedback_turns: int = FEEDBACK_TURNS,
) -> list[dict[str, Any]]:
    """All problems' rows, shuffled with `random.Random(seed)`."""
    rows = [
        r
        for p in problems
        for r in problem_rows(p, mode, prompt_tokens, max_prompt_tokens, feedback_turns)
    ]
    random.Random(seed).shuffle(rows)
    return rows
