"""Fixtures of the data-stage tests."""

from __future__ import annotations

import json

import pytest
from data_helpers import SAMPLES


@pytest.fixture
def lcb_native() -> dict:
    return json.loads((SAMPLES / "lcb_native_record.json").read_text())


@pytest.fixture
def taco_row() -> dict:
    """A valid TACO-schema row with 10 stdin tests and two reference solutions."""
    inputs = [f"{i}\n" for i in range(10)]
    return {
        "id": "double",
        "question": "Read an integer n from standard input and print twice its value. " * 3,
        "input_output": json.dumps(
            {"inputs": inputs, "outputs": [f"{2 * i}\n" for i in range(10)]}
        ),
        "solutions": json.dumps(["print(int(input()) * 3)", "print(int(input()) * 2)"]),
        "starter_code": "",
        "difficulty": "EASY",
    }
