"""Counting what happens to every row: kept, or dropped with a reason."""

from __future__ import annotations

from collections import Counter
from typing import Any

KEPT = "kept"
LINES_KEPT = 20  # line numbers stored per drop reason (the count has them all)


class Rejected(Exception):
    """A row or problem is dropped; `reason` is a short snake_case label counted in reports."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Tally:
    """Counts per (source, difficulty, outcome), plus the first example of each drop reason and
    the first line numbers of rows dropped from a file (a line that is not a JSON object)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.examples: dict[tuple[str, str], str] = {}
        self.lines: dict[tuple[str, str, str], list[int]] = {}

    def keep(self, source: str, difficulty: str, outcome: str = KEPT) -> None:
        self.counts[(source, difficulty, outcome)] += 1

    def drop(
        self,
        source: str,
        difficulty: str,
        rejected: Rejected,
        where: str = "",
        line: int | None = None,
    ) -> None:
        self.counts[(source, difficulty, rejected.reason)] += 1
        example = f"{where}: {rejected.detail}" if where else rejected.detail
        self.examples.setdefault((source, rejected.reason), example[:300])
        if line is not None:
            found = self.lines.setdefault((source, difficulty, rejected.reason), [])
            if len(found) < LINES_KEPT:
                found.append(line)

    def rows(self) -> list[dict[str, Any]]:
        """JSON-able rows (sorted), as stored in manifests."""
        out: list[dict[str, Any]] = [
            {"source": s, "difficulty": d, "outcome": o, "count": n}
            for (s, d, o), n in sorted(self.counts.items())
        ]
        out += [
            {"source": s, "outcome": o, "example": e} for (s, o), e in sorted(self.examples.items())
        ]
        out += [
            {"source": s, "difficulty": d, "outcome": o, "lines": n}
            for (s, d, o), n in sorted(self.lines.items())
        ]
        return out


def counts(rows: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    """The (source, difficulty, outcome) counts of stored tally rows."""
    total: Counter[tuple[str, str, str]] = Counter()
    for r in rows:
        if "count" in r:
            total[(r["source"], r["difficulty"], r["outcome"])] += r["count"]
    return total


def examples(rows: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {(r["source"], r["outcome"]): r["example"] for r in rows if "example" in r}


def lines(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[int]]:
    """(source, difficulty, reason) -> the first line numbers of the rows dropped for it."""
    return {(r["source"], r["difficulty"], r["outcome"]): r["lines"] for r in rows if "lines" in r}
