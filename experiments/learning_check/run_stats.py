"""Figures over the learning check's runs that are not Pass@1: the offline modes' logged
diagnostics (first and last step), how steady a training curve is, and phase times and GPU
memory (mean, min, max)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

# What the offline trainer logs to tell why an objective does not learn (docs/LEARNING.md,
# offline objectives); the aggregate keeps each one's first and last step, mean over seeds.
OFFLINE_DIAGNOSTICS = (
    "loss",
    "grad_norm",
    "advantage_std",
    "negative_weight_share",
    "weight_std",
    "weight_capped",
    "kl_ref",
    "ratio",
    "entropy",
    "logprob_positive",
    "logprob_negative",
)


def offline_diagnostics(done: Iterable[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per logged figure (OFFLINE_DIAGNOSTICS): its first and last step, mean over the seeds."""
    curves = [t.get("curve", []) for t in done]
    out = {}
    for key in OFFLINE_DIAGNOSTICS:
        first = [c[0][key] for c in curves if c and key in c[0]]
        last = [c[-1][key] for c in curves if c and key in c[-1]]
        if first or last:
            out[key] = {"first": _mean4(first), "last": _mean4(last)}
    return out


def curve_stability(curve: Sequence[float | None]) -> dict[str, float] | None:
    """How steady one run's training curve (the reward per step) is: `std`, the
    standard deviation of its values across steps, and `jitter`, the step-to-step noise (root
    mean square of successive differences over sqrt 2: the std of independent steps, blind to a
    slow trend such as learning). None for fewer than 2 steps."""
    xs = [float(x) for x in curve if isinstance(x, int | float)]
    if len(xs) < 2:
        return None
    steps = [b - a for a, b in itertools.pairwise(xs)]
    return {
        "std": round(statistics.stdev(xs), 4),
        "jitter": round(math.sqrt(statistics.fmean(d * d for d in steps) / 2), 4),
    }


def _mean4(xs: Sequence[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def spread_of(xs: Sequence[float], digits: int = 2) -> dict[str, float] | None:
    if not xs:
        return None
    return {
        "mean": round(statistics.fmean(xs), digits),
        "min": round(min(xs), digits),
        "max": round(max(xs), digits),
    }


def phases(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Phase wall seconds and GPU memory (GiB, peak reserved) over every run: mean and max."""
    names = dict.fromkeys(k for r in runs for k in r.get("phases_s", {}))
    return {
        "seconds": {
            k: spread_of([r["phases_s"][k] for r in runs if k in r.get("phases_s", {})])
            for k in names
        },
        "gpu_memory_gib": {
            k: spread_of([r["gpu_memory_gib"][k] for r in runs if k in r.get("gpu_memory_gib", {})])
            for k in names
            if any(k in r.get("gpu_memory_gib", {}) for r in runs)
        },
        "wall_s": spread_of(
            [r["wall_s"] for r in runs if isinstance(r.get("wall_s"), int | float)]
        ),
    }
