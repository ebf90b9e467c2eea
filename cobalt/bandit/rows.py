"""The bandit rows' format, as the bandit dataset stores them and a trainer's dataset takes them:
`prompt` (messages), `test_cases` (JSON text), `prev_best_pass_rate`, `difficulty`, `example_id`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sandbox import TestSuite


def is_turn0(row: dict[str, Any]) -> bool:
    """A turn-0 context: the prompt holds no earlier assistant answer."""
    return not any(m.get("role") == "assistant" for m in row["prompt"])


def prepare_rows(
    rows: Sequence[dict[str, Any]],
    mode: str,
    prompt_tokens: Callable[[list[dict[str, str]]], int] | None = None,
    max_prompt_length: int | None = None,
) -> list[dict[str, Any]]:
    """Rows for `Dataset.from_list`: filtered by the training mode (single_turn and multi_turn
    keep the turn-0 contexts) and prompt length, test_cases as JSON text."""
    out = []
    for row in rows:
        if mode in ("single_turn", "multi_turn") and not is_turn0(row):
            continue
        too_long = max_prompt_length is not None and prompt_tokens is not None
        if too_long and prompt_tokens(row["prompt"]) > max_prompt_length:
            continue
        tc = row["test_cases"]
        if isinstance(tc, TestSuite):
            tc = tc.model_dump_json()
        elif not isinstance(tc, str):
            tc = json.dumps(tc)
        out.append(
            {
                "prompt": [dict(m) for m in row["prompt"]],
                "test_cases": tc,
                "prev_best_pass_rate": float(row.get("prev_best_pass_rate") or 0.0),
                "difficulty": str(row.get("difficulty") or ""),
                "example_id": str(row.get("example_id") or ""),
            }
        )
    return out
