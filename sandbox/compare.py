"""Output comparison, run in the trusted parent (LiveCodeBench's rules, METHOD §3).

Nothing here ever calls into an object the program made: call-based results arrive as JSON text
and are parsed into plain data before they are compared.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any


def stdout_matches(actual: str, expected: str) -> bool:
    """Strip the whole output, split into lines, strip each line; the line counts must agree, and
    a line that differs as text still matches if its tokens are numbers equal as Decimals."""
    got = [line.strip() for line in actual.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return False
    return all(g == w or _numbers_equal(g, w) for g, w in zip(got, want, strict=True))


def _numbers_equal(got: str, want: str) -> bool:
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    try:
        return all(Decimal(x) == Decimal(y) for x, y in zip(a, b, strict=True))
    except (InvalidOperation, ValueError):
        return False


def parse_json(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return False, None


def call_result_matches(result: str | None, expected: str) -> bool:
    """Compare a call-based return value (JSON text from the sandbox) with the expected JSON value.

    Tuples were serialised as lists, so they compare as lists. TACO's Codewars outputs are often
    wrapped in a one-element list, so `[value]` as expected also accepts `value`.
    """
    if result is None:
        return False
    ok_got, got = parse_json(result)
    ok_want, want = parse_json(expected)
    if not (ok_got and ok_want):
        return False
    if got == want:
        return True
    return isinstance(want, list) and len(want) == 1 and got == want[0]
