"""Reference-solution verification in the sandbox (METHOD §1.1: computed upstream, applied here).

A problem is kept only if one of its (seeded-shuffled, at most 16) reference solutions passes
every kept test. Solutions are tried in rounds: round k judges the k-th solution of every problem
still undecided, all in one `judge_many` (bounded by the sandbox's concurrency, `fail_fast`).
A problem without reference solutions cannot be verified: dropped (`no_solution`) when
`require_reference` (training and dev sources: METHOD §1.1 keeps only verified problems), kept and
marked `no_reference` otherwise (test sources: LiveCodeBench publishes no solutions).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from cobalt.data.tally import Rejected, Tally
from cobalt.judging import SandboxRuntime, open_judge
from cobalt.problems import Problem
from sandbox import JudgeRequest, Limits


class VerifyConfig(BaseModel):
    """What decides a verification result (part of the cache key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run reference solutions; off marks problems not_run.")
    limits: Limits = Field(default_factory=Limits, description="Per-test sandbox limits.")
    require_reference: bool = Field(
        True,
        description="Drop problems without a reference solution (their tests cannot be "
        "verified). The data flow turns it off for test-role sources.",
    )


def verify_problems(
    problems: list[Problem], config: VerifyConfig, runtime: SandboxRuntime
) -> tuple[list[Problem], Tally]:
    tally = Tally()
    status: dict[int, str] = {}
    todo = {i: p for i, p in enumerate(problems) if p.solutions and config.enabled}
    unverifiable: set[int] = set()
    for i, problem in enumerate(problems):
        if i not in todo:
            if config.enabled and config.require_reference and not problem.solutions:
                unverifiable.add(i)
            else:
                status[i] = "no_reference" if config.enabled else "not_run"
    failures: dict[int, str] = {}
    if todo:
        with (
            open_judge(runtime, config.limits) as judge,
            tqdm(total=len(todo), desc="verify", unit="problem") as bar,
        ):
            attempt = 0
            while todo:
                batch = [(i, p) for i, p in todo.items() if attempt < len(p.solutions)]
                requests = [
                    JudgeRequest(id=f"{p.id}#{attempt}", code=p.solutions[attempt], tests=p.tests)
                    for _, p in batch
                ]
                for (i, p), verdict in zip(
                    batch, judge.judge_many(requests, fail_fast=True), strict=True
                ):
                    failures.setdefault(i, verdict.status)
                    if verdict.accepted:
                        status[i] = "passed"
                    if verdict.accepted or attempt + 1 >= len(p.solutions):
                        del todo[i]
                        bar.update()
                attempt += 1
    kept = []
    for i, problem in enumerate(problems):
        if i in status:
            kept.append(problem.model_copy(update={"verification": status[i]}))
            tally.keep(problem.source, problem.difficulty, status[i])
        elif i in unverifiable:
            tally.drop(
                problem.source,
                problem.difficulty,
                Rejected("no_solution", "no reference solution to verify its tests with"),
                problem.id,
            )
        else:
            n = len(problem.solutions)
            tally.drop(
                problem.source,
                problem.difficulty,
                Rejected(
                    "no_passing_reference",
                    f"{n} reference solution(s) failed (first: {failures[i]})",
                ),
                problem.id,
            )
    return kept, tally
