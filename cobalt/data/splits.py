"""Problem sets: seeded train/dev split and the public-test perturbation (METHOD §1.7)."""

from __future__ import annotations

import hashlib
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cobalt.data.tally import Rejected, Tally
from cobalt.problems import Problem
from sandbox import TestSuite
from sandbox.compare import call_result_matches, stdout_matches

SetName = Literal["train", "dev", "test"]


class SplitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dev_fraction: float = Field(0.1, ge=0, le=1, description="Share of train-role problems in dev.")
    seed: int = Field(0, description="Seed of the split and of the perturbation.")
    perturb: tuple[SetName, ...] = Field(
        ("train", "dev"), description="Sets that also get a perturbed copy ('<set>_perturbed')."
    )


def in_dev(problem_id: str, config: SplitConfig) -> bool:
    """Seeded, per-problem assignment: stable when other problems come or go."""
    digest = hashlib.sha256(f"{config.seed}:split:{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < config.dev_fraction


def same_output(a: str, b: str, fn_name: str | None) -> bool:
    """Would the judge accept one expected output for the other?"""
    if fn_name:
        return call_result_matches(a, b) or call_result_matches(b, a)
    return stdout_matches(a, b)


def perturb_tests(tests: TestSuite, rng: random.Random) -> tuple[TestSuite, TestSuite]:
    """(modified, perturbed public) tests: shuffle the pairs, collect those with distinct
    outputs, swap the outputs of the first two. The perturbed public tests are the two wrong pairs,
    then the other distinct pairs, then the duplicates. Outputs count as distinct only when the
    judge would tell them apart, so both swapped pairs are really wrong."""
    pairs = list(zip(tests.inputs, tests.outputs, strict=True))
    rng.shuffle(pairs)
    distinct: list[tuple[str, str]] = []
    duplicates: list[tuple[str, str]] = []
    for pair in pairs:
        seen = any(same_output(pair[1], d[1], tests.fn_name) for d in distinct)
        (duplicates if seen else distinct).append(pair)
    if len(distinct) < 2:
        raise Rejected("few_distinct_outputs", f"{len(distinct)} distinct public output(s)")
    (a_in, a_out), (b_in, b_out) = distinct[0], distinct[1]
    wrong = [(a_in, b_out), (b_in, a_out)]

    def suite(ps: list[tuple[str, str]]) -> TestSuite:
        return TestSuite(
            inputs=[i for i, _ in ps], outputs=[o for _, o in ps], fn_name=tests.fn_name
        )

    return suite(wrong), suite(wrong + distinct[2:] + duplicates)


def perturb_problem(problem: Problem, seed: int) -> Problem:
    if problem.perturbed_public_tests is not None:  # the source already perturbed it
        return problem
    rng = random.Random(f"{seed}:perturb:{problem.id}")
    modified, public = perturb_tests(problem.public_tests, rng)
    return problem.model_copy(update={"perturbed_public_tests": public, "modified_tests": modified})


def build_sets(
    pools: dict[str, list[Problem]], config: SplitConfig
) -> tuple[dict[str, list[Problem]], Tally]:
    """`pools` by role (train/dev/test) -> problem sets train, dev, test and '<set>_perturbed'."""
    sets: dict[str, list[Problem]] = {"train": [], "dev": [], "test": []}
    for p in pools.get("train", []):
        sets["dev" if in_dev(p.id, config) else "train"].append(p)
    sets["dev"] += pools.get("dev", [])
    sets["test"] += pools.get("test", [])
    tally = Tally()
    for name in list(sets):
        sets[name].sort(key=lambda p: p.id)
        for p in sets[name]:
            tally.keep(p.source, p.difficulty, name)
            tally.keep(p.source, p.difficulty, f"verification:{p.verification}")
    for name in config.perturb:
        perturbed = []
        for p in sets[name]:
            try:
                perturbed.append(perturb_problem(p, config.seed))
                tally.keep(p.source, p.difficulty, "perturbed")
            except Rejected as rejected:
                tally.drop(
                    p.source,
                    p.difficulty,
                    Rejected(f"perturb_skipped:{rejected.reason}", rejected.detail),
                    p.id,
                )
        sets[f"{name}_perturbed"] = perturbed
    return sets, tally
