"""The normalised problem record shared by every stage, and its parquet schema.

A `Problem` is one programming task with the model-facing instruction (METHOD §1.1), its public
tests (feedback is built from them) and hidden tests (Pass@1 and rewards count public + hidden),
and where it came from. Perturbed problem sets (METHOD §1.7) carry `perturbed_public_tests` (shown
to the model instead of the public tests) and `modified_tests` (the two wrong pairs inside them);
the true tests stay untouched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox import TestSuite

SourceKind = Literal["taco", "cobalt", "lcb", "codecontests"]
Verification = Literal["passed", "no_reference", "not_run"]


class Provenance(BaseModel):
    """Where a problem came from: enough to find the original row again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(description="Hub dataset name, or the local file / URL it was read from.")
    revision: str = Field(description="Hub commit, or 'sha256:<hex>' of the local file.")
    split: str | None = None
    row: int = Field(ge=0, description="Row index in the loaded split / file.")
    kind: SourceKind | Literal["synthetic"] = Field(
        description="The source schema the row was parsed as ('synthetic': tasks/synthetic.py)."
    )


class Problem(BaseModel):
    """One programming problem, as every later stage reads it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="'<source>/<id in the source>', unique across sources.")
    source: str = Field(description="Name of the configured source (e.g. 'taco', 'lcb').")
    difficulty: str = Field(description="The source's own label, lower-cased; 'unknown' if none.")
    statement: str = Field(description="The problem text as the source has it (stripped).")
    instruction: str = Field(description="The model-facing prompt (METHOD §1.1).")
    starter_code: str = ""
    fn_name: str | None = Field(None, description="Call-based problems: the function to call.")
    public_tests: TestSuite
    hidden_tests: TestSuite
    solutions: list[str] = Field(
        default_factory=list, description="Reference programs (seeded shuffle, capped); may be []."
    )
    verification: Verification = "not_run"
    contest_date: str | None = None
    perturbed_public_tests: TestSuite | None = None
    modified_tests: TestSuite | None = None
    provenance: Provenance

    @model_validator(mode="after")
    def _consistent(self) -> Problem:
        suites = [
            self.public_tests,
            self.hidden_tests,
            self.perturbed_public_tests,
            self.modified_tests,
        ]
        if any(s is not None and s.fn_name != self.fn_name for s in suites):
            raise ValueError(f"{self.id}: every test suite must have fn_name={self.fn_name!r}")
        return self

    @property
    def tests(self) -> TestSuite:
        """All true tests, public first (what Pass@1 and rewards count)."""
        return TestSuite(
            inputs=self.public_tests.inputs + self.hidden_tests.inputs,
            outputs=self.public_tests.outputs + self.hidden_tests.outputs,
            fn_name=self.fn_name,
        )

    @property
    def feedback_tests(self) -> TestSuite:
        """The tests whose results the model sees: perturbed public tests when there are any."""
        return self.perturbed_public_tests or self.public_tests


def split_tests(tests: TestSuite, n_public: int) -> tuple[TestSuite, TestSuite]:
    """The first `n_public` tests are public, the rest hidden."""
    head = TestSuite(
        inputs=tests.inputs[:n_public], outputs=tests.outputs[:n_public], fn_name=tests.fn_name
    )
    tail = TestSuite(
        inputs=tests.inputs[n_public:], outputs=tests.outputs[n_public:], fn_name=tests.fn_name
    )
    return head, tail


# --- the model-facing instruction (METHOD §1.1; our own wording) ---

_ASK = (
    "Solve the programming problem below in Python.\n\n"
    "Reason about it step by step first. Then give your final answer as one complete Python "
    "program in a single ```python code block."
)
_STDIO = (
    " The program must read its input from standard input and print its answer to standard output."
)
_CALL = (
    " Implement the function `{fn}`{where}: the tests call it with each test's arguments and check "
    "the value it returns, so the program should neither read standard input nor print the answer."
)
_EXAMPLE_MARKERS = ("\nExample 1:\n\n", "\nSample Input 1\n\n")


def cut_before_examples(statement: str) -> str:
    """LiveCodeBench statements are cut before their first example (METHOD §1.1)."""
    cuts = [i for m in _EXAMPLE_MARKERS if (i := statement.find(m)) >= 0]
    return statement[: min(cuts)].strip() if cuts else statement.strip()


def instruction(statement: str, fn_name: str | None = None, starter_code: str = "") -> str:
    """The prompt: reason step by step, then one complete program in one fenced block."""
    if fn_name is None:
        text = _ASK + _STDIO
    else:
        where = " of the starter code below" if starter_code.strip() else ""
        text = _ASK + _CALL.format(fn=fn_name, where=where)
    text += f"\n\nProblem:\n{statement.strip()}"
    if starter_code.strip():
        text += f"\n\nStarter code:\n```python\n{starter_code.rstrip()}\n```"
    return text


# --- parquet: one row per problem, tests as struct columns ---

_SUITE = pa.struct(
    [
        ("inputs", pa.list_(pa.large_string())),
        ("outputs", pa.list_(pa.large_string())),
        ("fn_name", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("difficulty", pa.string()),
        ("statement", pa.large_string()),
        ("instruction", pa.large_string()),
        ("starter_code", pa.large_string()),
        ("fn_name", pa.string()),
        ("public_tests", _SUITE),
        ("hidden_tests", _SUITE),
        ("solutions", pa.list_(pa.large_string())),
        ("verification", pa.string()),
        ("contest_date", pa.string()),
        ("perturbed_public_tests", _SUITE),
        ("modified_tests", _SUITE),
        (
            "provenance",
            pa.struct(
                [
                    ("dataset", pa.string()),
                    ("revision", pa.string()),
                    ("split", pa.string()),
                    ("row", pa.int64()),
                    ("kind", pa.string()),
                ]
            ),
        ),
    ]
)


def _row(problem: Problem) -> dict:
    return problem.model_dump()


def to_table(problems: Iterable[Problem]) -> pa.Table:
    return pa.Table.from_pylist([_row(p) for p in problems], schema=SCHEMA)


def from_table(table: pa.Table) -> list[Problem]:
    return [Problem.model_validate(row) for row in table.to_pylist()]


def fingerprint(problems: Iterable[Problem]) -> str:
    """Content hash of problems in order (equal content -> equal fingerprint, on any storage)."""
    digest = hashlib.sha256()
    for p in problems:
        digest.update(json.dumps(_row(p), sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()
