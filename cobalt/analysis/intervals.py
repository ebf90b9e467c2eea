"""Intervals for a verdict across seeds: a two-level bootstrap (seeds, then problems within each
drawn seed) of a mean, and of a paired difference between two models evaluated on the same
problems of each seed. Plain Python and the standard library; deterministic for a given `seed`.

    interval = bootstrap_mean({0: [1.0, 0.0, 0.5], 1: [1.0, 1.0]})
    diff = bootstrap_difference({0: {"p1": 1.0}}, {0: {"p1": 0.0}})
    verdict(diff, "cobalt", "single_turn")   # "cobalt ahead" when the interval is above 0
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ITERATIONS = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """The observed mean and a percentile bootstrap interval around it."""

    mean: float
    low: float
    high: float
    seeds: int
    values: int

    def covers(self, x: float) -> bool:
        return self.low <= x <= self.high

    def as_dict(self, scale: float = 1.0, digits: int = 2) -> dict[str, float | int]:
        return {
            "mean": round(self.mean * scale, digits),
            "low": round(self.low * scale, digits),
            "high": round(self.high * scale, digits),
            "seeds": self.seeds,
            "values": self.values,
        }


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def bootstrap_mean(
    by_seed: Mapping[int, Sequence[float]],
    iterations: int = ITERATIONS,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """Mean over all values (problems of all seeds), with a two-level percentile bootstrap: each
    draw picks as many seeds as there are, with replacement, then that many problems of each
    picked seed, with replacement. One seed: problems only."""
    groups = [list(v) for _, v in sorted(by_seed.items()) if len(v)]
    if not groups:
        raise ValueError("bootstrap_mean needs at least one seed with values")
    observed = _mean([x for g in groups for x in g])
    rng = random.Random(seed)
    means = []
    for _ in range(iterations):
        drawn = [groups[rng.randrange(len(groups))] for _ in groups] if len(groups) > 1 else groups
        values = [g[rng.randrange(len(g))] for g in drawn for _ in g]
        means.append(_mean(values))
    means.sort()
    tail = (1 - level) / 2
    low = means[int(tail * (iterations - 1))]
    high = means[int((1 - tail) * (iterations - 1))]
    return Interval(observed, low, high, len(groups), sum(len(g) for g in groups))


def bootstrap_difference(
    a: Mapping[int, Mapping[str, float]],
    b: Mapping[int, Mapping[str, float]],
    iterations: int = ITERATIONS,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """a - b, paired: per seed, over the problems both were evaluated on."""
    paired: dict[int, list[float]] = {}
    for s in sorted(set(a) & set(b)):
        common = sorted(set(a[s]) & set(b[s]))
        if common:
            paired[s] = [a[s][p] - b[s][p] for p in common]
    if not paired:
        raise ValueError("bootstrap_difference: no seed has problems evaluated by both")
    return bootstrap_mean(paired, iterations, level, seed)


def verdict(difference: Interval, a: str, b: str) -> str:
    """'<a> ahead', '<b> ahead', or 'no difference' when the interval covers 0."""
    if difference.covers(0.0):
        return "no difference"
    return f"{a} ahead" if difference.low > 0 else f"{b} ahead"
