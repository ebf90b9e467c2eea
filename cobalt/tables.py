"""Rows of dicts as a markdown table: run summaries in logs, artifacts and the CLI."""

from __future__ import annotations

from typing import Any


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table with the first row's keys as columns; None shows as an empty cell."""
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append(
            "| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in columns) + " |"
        )
    return "\n".join(lines)
