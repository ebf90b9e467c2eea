"""TACO cleaning rules and test capping (METHOD §1.1), for problems that are trained on."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cobalt.data.tally import Rejected, Tally
from cobalt.problems import Problem, split_tests
from sandbox import TestSuite

_MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(")


class CleanRules(BaseModel):
    """Defaults are the paper's. The bundled APPS sample has only 1-8 tests per problem, so runs on
    `samples/` set `min_tests=1` explicitly (see docs/DATA.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_tests: int = Field(8, ge=0, description="Drop problems with fewer tests.")
    max_tests: int = Field(20, ge=1, description="Keep at most this many tests ...")
    shortest_tests: int = Field(5, ge=0, description="... the shortest inputs, the rest longest.")
    min_statement_alnum: int = Field(100, ge=0, description="Alphanumeric characters required.")
    drop_images: bool = Field(True, description="Drop statements that mention or embed an image.")

    @model_validator(mode="after")
    def _fits(self) -> CleanRules:
        if self.shortest_tests > self.max_tests:
            raise ValueError("shortest_tests cannot exceed max_tests")
        return self


def has_image(statement: str) -> bool:
    """METHOD §1.1: the word 'image' anywhere, or a markdown image."""
    return "image" in statement.lower() or bool(_MARKDOWN_IMAGE.search(statement))


def cap_tests(tests: TestSuite, rules: CleanRules) -> TestSuite:
    """At most `max_tests`: the `shortest_tests` shortest and the rest longest inputs, ordered by
    input length (so the public tests, which come first, are the shortest)."""
    n = len(tests.inputs)
    if n <= rules.max_tests:
        return tests
    by_length = sorted(range(n), key=lambda i: len(tests.inputs[i]))
    longest = rules.max_tests - rules.shortest_tests
    kept = by_length[: rules.shortest_tests] + by_length[n - longest :]
    return TestSuite(
        inputs=[tests.inputs[i] for i in kept],
        outputs=[tests.outputs[i] for i in kept],
        fn_name=tests.fn_name,
    )


def clean_problem(problem: Problem, rules: CleanRules) -> Problem:
    """The problem with capped tests, or `Rejected` with the rule it breaks."""
    tests = problem.tests
    if len(tests.inputs) < rules.min_tests:
        raise Rejected("too_few_tests", f"{len(tests.inputs)} < {rules.min_tests}")
    if rules.drop_images and has_image(problem.statement):
        raise Rejected("has_image", "statement mentions an image")
    alnum = sum(c.isalnum() for c in problem.statement)
    if alnum < rules.min_statement_alnum:
        raise Rejected("short_statement", f"{alnum} alphanumeric characters")
    if problem.perturbed_public_tests is not None:  # already perturbed (Cobalt-PTB): keep as is
        return problem
    public, hidden = split_tests(cap_tests(tests, rules), len(problem.public_tests.inputs))
    return problem.model_copy(update={"public_tests": public, "hidden_tests": hidden})


def clean_problems(problems: list[Problem], rules: CleanRules) -> tuple[list[Problem], Tally]:
    kept, tally = [], Tally()
    for problem in problems:
        try:
            kept.append(clean_problem(problem, rules))
            tally.keep(problem.source, problem.difficulty)
        except Rejected as rejected:
            tally.drop(problem.source, problem.difficulty, rejected, problem.id)
    return kept, tally
