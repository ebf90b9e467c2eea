"""Intervals for a verdict across seeds: a two-level bootstrap (seeds, then problems within each
drawn seed) of a mean, and of a paired difference between two models evaluated on the same
problems of each seed. Deterministic for a given `seed`. Drawing a seed's problems with replacement
is drawn as multinomial counts over its distinct values (numpy): the same distribution as drawing
them one by one, at a cost that does not grow with the number of problems (a learning-check report
has a few hundred cells of up to a thousand problems each).

    interval = bootstrap_mean({0: [1.0, 0.0, 0.5], 1: [1.0, 1.0]})
    diff = bootstrap_difference({0: {"p1": 1.0}}, {0: {"p1": 0.0}})
    verdict(diff, "cobalt", "single_turn")   # "cobalt ahead" when the interval is above 0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

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


def bootstrap_mean(
    by_seed: Mapping[int, Sequence[float]],
    iterations: int = ITERATIONS,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """Mean over all values (problems of all seeds), with a two-level percentile bootstrap: each
    draw picks as many seeds as there are, with replacement, then that many problems of each
    picked seed, with replacement. One seed: problems only."""
    groups = [np.asarray(v, dtype=float) for _, v in sorted(by_seed.items()) if len(v)]
    if not groups:
        raise ValueError("bootstrap_mean needs at least one seed with values")
    observed = float(np.concatenate(groups).mean())
    rng = np.random.default_rng(seed)
    k = len(groups)
    drawn = rng.integers(0, k, size=(iterations, k)) if k > 1 else np.zeros((iterations, 1), int)
    sizes = np.array([len(g) for g in groups])
    sums = np.zeros(drawn.shape)
    for index, g in enumerate(groups):
        picked = drawn == index
        if picked.any():
            values, counts = np.unique(g, return_counts=True)
            draws = rng.multinomial(len(g), counts / len(g), size=int(picked.sum()))
            sums[picked] = draws @ values
    means = np.sort(sums.sum(axis=1) / sizes[drawn].sum(axis=1))
    tail = (1 - level) / 2
    low = float(means[int(tail * (iterations - 1))])
    high = float(means[int((1 - tail) * (iterations - 1))])
    return Interval(observed, min(low, observed), max(high, observed), k, int(sizes.sum()))


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
