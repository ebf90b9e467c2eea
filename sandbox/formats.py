"""Test suites from the datasets' own schemas (TACO/APPS `input_output`)."""

from __future__ import annotations

import json
from typing import Any

from sandbox.models import TestSuite


def taco_tests(input_output: str | dict[str, Any]) -> TestSuite:
    """A TACO/APPS `input_output` field as a TestSuite.

    Standard-input problems keep their strings (a list item is joined with spaces). Call-based
    problems (`fn_name`) get one JSON value per line for each argument, and the JSON text of the
    expected value (TACO's one-element list wrapping is handled when comparing).
    """
    io = json.loads(input_output) if isinstance(input_output, str) else input_output
    fn_name = io.get("fn_name") or None
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("input_output.inputs and .outputs must be lists")
    if fn_name:
        return TestSuite(
            inputs=[_call_args(x) for x in inputs],
            outputs=[json.dumps(y) for y in outputs],
            fn_name=fn_name,
        )
    return TestSuite(inputs=[_text(x) for x in inputs], outputs=[_text(y) for y in outputs])


def _call_args(args: Any) -> str:
    if not isinstance(args, list):
        args = [args]
    return "\n".join(json.dumps(a) for a in args)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ValueError(f"test item {value!r} is a {type(value).__name__}, not a string")
    return value
