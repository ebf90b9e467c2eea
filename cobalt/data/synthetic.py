"""A generated family of small stdin/stdout problems: list operations x input formats.

Each *kind* is `"<operation>/<format>"` (10 operations x 3 formats = 30 kinds, `KINDS`: the
embedded default's family). `HELD_OUT` names combinations kept out of fitting, so a model fitted on
the others can be checked on unseen pairs of known pieces. Everything is plain Python and
deterministic given the seed.

`ALL_KINDS` extends the family with 3 more operations and a 4th input format (13 x 4 = 52 kinds,
`KINDS` first and unchanged, so the bundled samples and the default's fitted model do not move);
the GPU learning check splits it (`experiments.learning_check.kinds`).

    from cobalt.data.synthetic import HELD_OUT, make_problems, seen_kinds
    problems = make_problems(seen_kinds(), count=100, seed=0)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from cobalt.problems import Problem, Provenance, instruction
from sandbox import TestSuite

# operation -> (what to print, short reasoning, program lines after the reader, function)
_OPS: dict[str, tuple[str, str, str, Callable[[list[int]], str]]] = {
    "sum": ("the sum of the integers", "add all values", "print(sum(a))", lambda a: str(sum(a))),
    "max": ("the largest integer", "take the maximum", "print(max(a))", lambda a: str(max(a))),
    "min": ("the smallest integer", "take the minimum", "print(min(a))", lambda a: str(min(a))),
    "sorted": (
        "the integers in increasing order, separated by spaces",
        "sort the values",
        "print(*sorted(a))",
        lambda a: " ".join(map(str, sorted(a))),
    ),
    "reversed": (
        "the integers in reverse order, separated by spaces",
        "reverse the values",
        "print(*a[::-1])",
        lambda a: " ".join(map(str, a[::-1])),
    ),
    "evens": (
        "how many of the integers are even",
        "count the even values",
        "print(sum(1 for x in a if x % 2 == 0))",
        lambda a: str(sum(1 for x in a if x % 2 == 0)),
    ),
    "product": (
        "the product of the integers modulo 1000",
        "multiply modulo 1000",
        "p = 1\nfor x in a:\n    p = p * x % 1000\nprint(p)",
        lambda a: str(_product_mod(a)),
    ),
    "unique": (
        "the number of distinct integers",
        "count distinct values with a set",
        "print(len(set(a)))",
        lambda a: str(len(set(a))),
    ),
    "second": (
        "the second largest distinct integer",
        "sort the distinct values and take the second from the end",
        "print(sorted(set(a))[-2])",
        lambda a: str(sorted(set(a))[-2]),
    ),
    "prefix": (
        "the prefix sums of the integers, separated by spaces",
        "keep a running total",
        "s = 0\nout = []\nfor x in a:\n    s += x\n    out.append(s)\nprint(*out)",
        lambda a: " ".join(str(sum(a[: i + 1])) for i in range(len(a))),
    ),
    # the extension (ALL_KINDS only)
    "odds": (
        "how many of the integers are odd",
        "count the odd values",
        "print(sum(1 for x in a if x % 2 == 1))",
        lambda a: str(sum(1 for x in a if x % 2 == 1)),
    ),
    "range": (
        "the largest integer minus the smallest integer",
        "subtract the minimum from the maximum",
        "print(max(a) - min(a))",
        lambda a: str(max(a) - min(a)),
    ),
    "desc": (
        "the integers in decreasing order, separated by spaces",
        "sort the values in reverse",
        "print(*sorted(a, reverse=True))",
        lambda a: " ".join(map(str, sorted(a, reverse=True))),
    ),
}

# format -> (input description, reader lines, input text from the list)
_FORMATS: dict[str, tuple[str, str, Callable[[list[int]], str]]] = {
    "count": (
        "The first line holds n; the second line holds n integers separated by spaces.",
        "n = int(input())\na = list(map(int, input().split()))",
        lambda a: f"{len(a)}\n{' '.join(map(str, a))}\n",
    ),
    "lines": (
        "The input holds one integer per line until the end of the input.",
        "import sys\na = [int(x) for x in sys.stdin.read().split()]",
        lambda a: "".join(f"{x}\n" for x in a),
    ),
    "comma": (
        "The input is one line of integers separated by commas.",
        'a = [int(x) for x in input().split(",")]',
        lambda a: ",".join(map(str, a)) + "\n",
    ),
    # the extension (ALL_KINDS only)
    "space": (
        "The input is one line of integers separated by spaces.",
        "a = list(map(int, input().split()))",
        lambda a: " ".join(map(str, a)) + "\n",
    ),
}

EXTRA_OPERATIONS: tuple[str, ...] = ("odds", "range", "desc")
EXTRA_FORMATS: tuple[str, ...] = ("space",)
OPERATIONS: tuple[str, ...] = tuple(op for op in _OPS if op not in EXTRA_OPERATIONS)
FORMATS: tuple[str, ...] = tuple(f for f in _FORMATS if f not in EXTRA_FORMATS)
KINDS: tuple[str, ...] = tuple(f"{op}/{fmt}" for op in OPERATIONS for fmt in FORMATS)
# the 30 kinds first, then every kind with a new operation or format (52 in all)
ALL_KINDS: tuple[str, ...] = KINDS + tuple(
    f"{op}/{fmt}"
    for op in _OPS
    for fmt in _FORMATS
    if op in EXTRA_OPERATIONS or fmt in EXTRA_FORMATS
)
# each format twice, each held-out operation once, every piece still seen in other kinds
HELD_OUT: tuple[str, ...] = (
    "sum/comma",
    "max/lines",
    "sorted/count",
    "evens/comma",
    "unique/lines",
    "prefix/count",
)
N_PUBLIC = 2
N_HIDDEN = 6


def _product_mod(a: list[int]) -> int:
    p = 1
    for x in a:
        p = p * x % 1000
    return p


def seen_kinds(held_out: Sequence[str] = HELD_OUT, kinds: Sequence[str] = KINDS) -> list[str]:
    """`kinds` (default: the 30) without `held_out`, in order."""
    return [k for k in kinds if k not in set(held_out)]


def _split(kind: str) -> tuple[str, str]:
    op, _, fmt = kind.partition("/")
    if op not in _OPS or fmt not in _FORMATS:
        raise ValueError(f"unknown synthetic kind {kind!r}; known: {', '.join(ALL_KINDS)}")
    return op, fmt


def statement(kind: str) -> str:
    op, fmt = _split(kind)
    return f"Read a list of integers and print {_OPS[op][0]}.\nInput: {_FORMATS[fmt][0]}"


def reference_solution(kind: str) -> str:
    """The canonical program: the format's reader, then the operation."""
    op, fmt = _split(kind)
    return f"{_FORMATS[fmt][1]}\n{_OPS[op][2]}\n"


def reference_answer(kind: str) -> str:
    """A short assistant answer: one line of reasoning and the program in a python block."""
    op, _ = _split(kind)
    return f"Read the integers, then {_OPS[op][1]}.\n```python\n{reference_solution(kind)}```"


def parse_input(fmt: str, text: str) -> list[int]:
    """The list of integers in an input of format `fmt` (the inverse of its writer)."""
    if fmt == "comma":
        return [int(x) for x in text.strip().split(",")]
    values = [int(x) for x in text.split()]
    return values[1:] if fmt == "count" else values


def output_of(kind: str, text: str) -> str:
    """What the reference program of `kind` prints for the input `text` ('' if it would fail)."""
    op, fmt = _split(kind)
    try:
        return _OPS[op][3](parse_input(fmt, text)) + "\n"
    except (ValueError, IndexError):
        return ""


def _values(rng: random.Random, op: str) -> list[int]:
    while True:
        a = [rng.randint(0, 99) for _ in range(rng.randint(2, 8))]
        if op != "second" or len(set(a)) >= 2:
            return a


def make_problem(kind: str, rng: random.Random, *, row: int = 0, seed: int = 0) -> Problem:
    op, fmt = _split(kind)
    lists = [_values(rng, op) for _ in range(N_PUBLIC + N_HIDDEN)]
    inputs = [_FORMATS[fmt][2](a) for a in lists]
    outputs = [_OPS[op][3](a) + "\n" for a in lists]
    text = statement(kind)
    return Problem(
        id=f"synthetic/{op}-{fmt}-s{seed}-{row}",
        source="synthetic",
        difficulty="held_out" if kind in HELD_OUT else "seen",
        statement=text,
        instruction=instruction(text),
        public_tests=TestSuite(inputs=inputs[:N_PUBLIC], outputs=outputs[:N_PUBLIC]),
        hidden_tests=TestSuite(inputs=inputs[N_PUBLIC:], outputs=outputs[N_PUBLIC:]),
        solutions=[reference_solution(kind)],
        verification="passed",
        provenance=Provenance(
            dataset="synthetic", revision=f"seed:{seed}", split=kind, row=row, kind="synthetic"
        ),
    )


def make_problems(kinds: Sequence[str], count: int, seed: int = 0) -> list[Problem]:
    """`count` problems cycling through `kinds` (in order), tests drawn from `seed`."""
    kinds = list(kinds)
    if not kinds:
        raise ValueError("make_problems needs at least one kind")
    rng = random.Random(seed)
    return [make_problem(kinds[i % len(kinds)], rng, row=i, seed=seed) for i in range(count)]


def kind_of(problem: Problem) -> str:
    """The kind a synthetic problem was generated from."""
    return problem.provenance.split or ""


def taco_row(problem: Problem) -> dict:
    """The problem as a TACO-schema row (what the data stage loads with `:taco`)."""
    import json

    tests = problem.tests
    return {
        "id": problem.id.removeprefix("synthetic/"),
        "question": problem.statement,
        "solutions": json.dumps(problem.solutions),
        "input_output": json.dumps({"inputs": tests.inputs, "outputs": tests.outputs}),
        "difficulty": problem.difficulty,
    }
