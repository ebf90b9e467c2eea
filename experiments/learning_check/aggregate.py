"""The learning check's verdict: seed results (one JSON per run, `results.SeedResult`)
merged into cells with 95% intervals over seeds and problems, paired differences between models
with a verdict, per-seed and per-kind tables, the cost per mode, the repair transitions, and the
same-seed spread of repeated seeds. Plain Python and numpy (`cobalt.analysis.intervals`).

Pass@1 of a problem at turn t is c[t] / n of its `results.ProblemResult` (`c`: METHOD §1.2,
`c_stop`: each sample stopped at its first program that passed every public test). Which run of a
seed counts (primary, continuation, repeat): `runs`.

    runs = load_runs([Path("out1"), Path("out2")])
    summary = aggregate(runs)       # JSON-ready; report.render renders it
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from cobalt.analysis.intervals import bootstrap_difference, bootstrap_mean, verdict
from cobalt.analysis.transitions import merge, summarize
from experiments.learning_check.results import PROTOCOLS
from experiments.learning_check.run_stats import (
    curve_stability,
    offline_diagnostics,
    phases,
    spread_of,
)
from experiments.learning_check.runs import run_where, split_runs

MODEL_ORDER = (
    "sft",
    "single_turn",
    "cobalt",
    "offline",
    "offline_rloo",
    "offline_awr",
    "offline_clipped",
    "offline_rloo_low_lr",
    "offline_grpo",
    "multi_turn",
    "multi_turn_dense",
    "cobalt_dense",
    "cobalt_async",
    "cobalt_bf16",
)
COMPARISONS = (
    ("cobalt", "single_turn"),
    ("offline", "single_turn"),
    ("offline_awr", "offline_rloo"),  # the offline objectives side by side
    ("offline_clipped", "offline_rloo"),
    ("offline_awr", "offline_clipped"),
    ("offline_rloo_low_lr", "offline_rloo"),
    ("offline_grpo", "cobalt"),
    # the paper's comparison: cobalt against the multi-turn online baselines
    ("cobalt", "multi_turn"),
    ("cobalt", "multi_turn_dense"),
    ("multi_turn", "single_turn"),
    ("multi_turn_dense", "multi_turn"),
    ("cobalt_dense", "cobalt"),
    ("cobalt_async", "cobalt"),  # one step off against synchronous
    ("cobalt_bf16", "cobalt"),
)


def models_of(runs: Iterable[dict[str, Any]]) -> list[str]:
    seen = {m for r in runs for m in r["evaluation"]}
    return [m for m in MODEL_ORDER if m in seen] + sorted(seen - set(MODEL_ORDER))


def scores(
    run: dict[str, Any], model: str, protocol: str, group: str, turn: int
) -> dict[str, float]:
    """Pass@1 of every problem of `group` at `turn` for one run's `model` (empty if absent)."""
    key = PROTOCOLS[protocol]
    problems = run["evaluation"].get(model, {}).get("problems", {})
    return {
        pid: p[key][turn] / p["n"]
        for pid, p in problems.items()
        if p["group"] == group and turn < len(p[key]) and p["n"]
    }


def aggregate(runs: Sequence[dict[str, Any]], iterations: int = 2000) -> dict[str, Any]:
    if not runs:
        raise ValueError("no seed results to aggregate")
    primary, repeats = split_runs(runs)
    first = next(iter(primary.values()))
    groups: dict[str, str] = first.get("groups", {})
    turns = int(first["settings"]["turns"])
    models = models_of(primary.values())
    comparisons = comparisons_of(primary, models)
    cells, differences = [], []
    for protocol in PROTOCOLS:
        for group in groups:
            for t in range(turns + 1):
                by_model = {
                    m: {s: scores(r, m, protocol, group, t) for s, r in primary.items()}
                    for m in models
                }
                for m in models:
                    values = {s: list(v.values()) for s, v in by_model[m].items() if v}
                    if values:
                        interval = bootstrap_mean(values, iterations)
                        cells.append(_row(protocol, group, t, interval) | {"model": m})
                pairs = [*comparisons]
                pairs += [(m, "sft") for m in models if m != "sft" and "sft" in models]
                for a, b in pairs:
                    ok = [s for s in primary if by_model[a][s] and by_model[b][s]]
                    if not ok:
                        continue
                    d = bootstrap_difference(
                        {s: by_model[a][s] for s in ok}, {s: by_model[b][s] for s in ok}, iterations
                    )
                    row = _row(protocol, group, t, d) | {"a": a, "b": b}
                    differences.append(row | {"verdict": verdict(d, a, b)})
    trained = training(primary)
    return {
        "check": "learning_check",
        "runs": [_run_info(r, primary) for r in runs],
        "seeds": list(primary),
        "settings": first["settings"],
        "machine": first.get("machine", {}),
        "groups": groups,
        "kinds": first.get("kinds", {}),
        "models": models,
        "turns": turns,
        "cells": cells,
        "comparisons": comparisons,
        "differences": differences,
        "gain_per_cost": gain_per_cost(differences, trained, turns),
        "per_seed": per_seed(primary, models, groups, turns),
        "per_kind": per_kind(primary, models, turns),
        "training": trained,
        "transitions": {
            m: summarize(
                merge(
                    r["evaluation"][m].get("transitions", [])
                    for r in primary.values()
                    if m in r["evaluation"]
                )
            )
            for m in models
        },
        "new_programs": new_programs(primary, models),
        "spread": [spread(primary[r["seed"]], r, models, groups, turns) for r in repeats],
        "repeat_hint": None if repeats else repeat_hint(primary),
        "phases": phases(runs),
        "bandit": [{"seed": s, **r.get("bandit", {})} for s, r in primary.items()],
    }


def comparisons_of(primary: dict[int, dict], models: list[str]) -> list[tuple[str, str]]:
    """The fixed comparisons whose two models ran, and offline_grpo against the offline mode of
    its own objective (what the short GRPO phase adds)."""
    pairs = [p for p in COMPARISONS if p[0] in models and p[1] in models]
    phases = {
        t.get("offline_phase_mode")
        for r in primary.values()
        if isinstance(t := r["training"].get("offline_grpo"), dict)
    }
    for phase in sorted(p for p in phases if p):
        pair = ("offline_grpo", phase if phase in models else "offline")
        if pair[1] in models and pair not in pairs:
            pairs.append(pair)
    return pairs


def gain_per_cost(
    differences: Sequence[dict[str, Any]], trained: dict[str, Any], turns: int
) -> list[dict[str, Any]]:
    """Per trained mode: Pass@1 gain over the SFT model on the RL kinds (METHOD §1.2, turn 0 and
    the last turn, 95% interval paired over seeds and problems) and the same per 100 seconds of
    its training cost: GPU seconds when the runs had a GPU (wall x GPUs, `CostMeter`), else wall
    seconds (unit says which). The cost is the mean over the mode's completed seeds and is taken
    as fixed (its spread is beside it); the interval is the gain's."""
    gains = {
        (d["a"], d["turn"]): d
        for d in differences
        if d["b"] == "sft" and d["protocol"] == "spec" and d["group"] == "rl_kinds"
    }
    out = []
    for mode, t in trained.items():
        cost, unit = t.get("gpu_s"), "GPU s"
        if not cost:
            cost, unit = t.get("wall_s"), "wall s"
        for turn in sorted({0, turns}):
            d = gains.get((mode, turn))
            if d is None or not cost or not cost["mean"]:
                continue
            scale = 100.0 / cost["mean"]
            out.append(
                {
                    "mode": mode,
                    "turn": turn,
                    "seeds": d["seeds"],
                    "gain": {k: d[k] for k in ("mean", "low", "high")},
                    "cost_s": cost,
                    "cost_unit": unit,
                    "per_100_s": {k: round(d[k] * scale, 3) for k in ("mean", "low", "high")},
                }
            )
    return out


def repeat_hint(primary: dict[int, dict]) -> str:
    """What to run for a same-seed repeat when there is none."""
    seed = next(iter(primary), 0)
    return (
        f"no seed ran twice here, so these results say nothing about run-to-run variation: run "
        f"one seed again with `--repeat {seed}` (same settings, same code) and aggregate both"
    )


def _row(protocol: str, group: str, turn: int, interval: Any) -> dict[str, Any]:
    return {"protocol": protocol, "group": group, "turn": turn, **interval.as_dict(100.0)}


def _run_info(run: dict[str, Any], primary: dict[int, dict]) -> dict[str, Any]:
    first = primary.get(run["seed"], {})
    return {
        "label": run.get("label"),
        "seed": run["seed"],
        "source": run.get("source"),
        "primary": run_where(first) == run_where(run),
        "continues_primary": run_where(run) in first.get("continued_by", []),
        "status": run.get("status"),
        "wall_s": run.get("wall_s"),
        "models": list(run["evaluation"]),
        "training": {
            m: t.get("outcome") for m, t in run["training"].items() if isinstance(t, dict)
        },
    }


def _mean(xs: Sequence[float]) -> float | None:
    return round(statistics.fmean(xs), 2) if xs else None


def per_seed(
    primary: dict[int, dict], models: list[str], groups: dict[str, str], turns: int
) -> list[dict[str, Any]]:
    """Pass@1 (%) of every primary run's model per group and turn, both protocols."""
    rows = []
    for s, run in primary.items():
        for m in models:
            for group in groups:
                for t in range(turns + 1):
                    row: dict[str, Any] = {"seed": s, "model": m, "group": group, "turn": t}
                    for protocol in PROTOCOLS:
                        values = list(scores(run, m, protocol, group, t).values())
                        row[protocol] = _mean([100 * v for v in values])
                    if row["spec"] is not None:
                        rows.append(row)
    return rows


def per_kind(primary: dict[int, dict], models: list[str], turns: int) -> list[dict[str, Any]]:
    """Per kind and model: mean Pass@1 (%) over the primary seeds at every turn (METHOD §1.2), with
    the lowest and highest seed."""
    table: dict[tuple[str, str, str], list[list[float]]] = {}
    for run in primary.values():
        for m in models:
            by_kind: dict[tuple[str, str], list[list[float]]] = {}
            for p in run["evaluation"].get(m, {}).get("problems", {}).values():
                by_kind.setdefault((p["kind"], p["group"]), []).append([c / p["n"] for c in p["c"]])
            for (kind, group), rows in by_kind.items():
                means = [100 * statistics.fmean(r[t] for r in rows) for t in range(turns + 1)]
                table.setdefault((kind, group, m), []).append(means)
    out = []
    for (kind, group, m), seeds in table.items():
        out.append(
            {
                "kind": kind,
                "group": group,
                "model": m,
                "seeds": len(seeds),
                "mean": [_mean([s[t] for s in seeds]) for t in range(turns + 1)],
                "min": [round(min(s[t] for s in seeds), 2) for t in range(turns + 1)],
                "max": [round(max(s[t] for s in seeds), 2) for t in range(turns + 1)],
            }
        )
    return out


def training(primary: dict[int, dict]) -> dict[str, Any]:
    """Per mode over the primary seeds: outcomes, rows, steps, completions, wall / GPU seconds,
    peak memory, step time, reward curve (mean per step) and its stability, non-finite and
    failure messages."""
    out: dict[str, Any] = {}
    modes = [m for r in primary.values() for m in r.get("modes", [])]
    for mode in dict.fromkeys(modes):
        runs = {s: r["training"].get(mode) for s, r in primary.items()}
        runs = {s: t for s, t in runs.items() if isinstance(t, dict)}
        done = {s: t for s, t in runs.items() if t.get("outcome") == "completed"}
        outcomes: dict[str, int] = {}
        for t in runs.values():
            outcomes[t.get("outcome", "?")] = outcomes.get(t.get("outcome", "?"), 0) + 1

        def values(get, done=done) -> list[float]:
            xs = []
            for t in done.values():
                try:
                    x = get(t)
                except (KeyError, TypeError, IndexError):
                    continue
                if isinstance(x, int | float):
                    xs.append(float(x))
            return xs

        step_medians = []
        for t in done.values():
            steps = [s["total"] for s in t.get("step_time_per_step", [])[2:]]
            if steps:
                step_medians.append(statistics.median(steps))
        offline = bool(done) and all(
            "offline_phase" not in t and "objective" in t for t in done.values()
        )
        curve_key = "loss" if offline else "rewards/correctness/mean"
        curves = [
            [c.get(curve_key, c.get("reward")) for c in t.get("curve", [])] for t in done.values()
        ]
        length = min((len(c) for c in curves), default=0)
        stability = [st for c in curves if (st := curve_stability(c))]
        out[mode] = {
            "outcomes": outcomes,
            "seeds_completed": sorted(done),
            "errors": {s: t.get("error") for s, t in runs.items() if t.get("error")},
            "rows": _mean(values(lambda t: t["rows"])),
            "steps": _mean(values(lambda t: t["steps"])),
            "completions_sampled": _mean(values(lambda t: t["completions_sampled"])),
            "completions_trained": _mean(values(lambda t: t["completions_trained"])),
            "wall_s": spread_of(values(lambda t: t["cost"]["wall_s"])),
            "gpu_s": spread_of(values(lambda t: t["cost"]["gpu_s"])),
            "gpu_busy_s": spread_of(values(lambda t: t["cost"]["gpu_busy_s"])),
            "gpu_peak_memory_gib": spread_of(values(lambda t: t["cost"]["gpu_peak_memory_gib"])),
            "step_s_median": spread_of(step_medians),
            # --async: per seed, the batches sampled in the background and in place
            "overlap": {s: t["overlap"] for s, t in done.items() if t.get("overlap")},
            "reward_share": _mean(values(lambda t: t["step_time"]["reward_share"])),
            "objective": next((t.get("objective") for t in done.values()), None),
            "passes_over_rows": _mean(values(lambda t: t["passes_over_rows"])),
            "dropped_zero_advantage_share": _mean(
                values(lambda t: t["dropped_zero_advantage_share"])
            ),
            "diagnostics": offline_diagnostics(done.values()) if offline else {},
            "curve_key": curve_key,
            "curve_mean": [
                _mean([c[i] for c in curves if c[i] is not None]) for i in range(length)
            ],
            # how steady each seed's curve is (mean [min, max] over seeds)
            "curve_std": spread_of([st["std"] for st in stability], 4),
            "curve_jitter": spread_of([st["jitter"] for st in stability], 4),
        }
    return out


def new_programs(primary: dict[int, dict], models: list[str]) -> dict[str, dict[str, int]]:
    """What the rewritten programs of broken steps (right -> wrong) were, per model, all seeds."""
    out: dict[str, dict[str, int]] = {}
    for m in models:
        counts: dict[str, int] = {}
        for run in primary.values():
            for row in run["evaluation"].get(m, {}).get("transitions", []):
                if row["step"] == "broken":
                    for cls, n in row.get("new_program", {}).items():
                        counts[cls] = counts.get(cls, 0) + n
        out[m] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    return out


def spread(
    a: dict[str, Any], b: dict[str, Any], models: list[str], groups: dict[str, str], turns: int
) -> dict[str, Any]:
    """Two runs of one seed: how far their cells are apart (percentage points), the share of
    problems with identical counts, and which fingerprints agree (where the runs part)."""
    diffs, same_problems, problems = [], 0, 0
    differing: list[dict[str, Any]] = []
    for m in models:
        if m not in a["evaluation"] or m not in b["evaluation"]:
            continue
        pa, pb = a["evaluation"][m]["problems"], b["evaluation"][m]["problems"]
        for pid in pa.keys() & pb.keys():
            problems += 1
            same_problems += pa[pid]["c"] == pb[pid]["c"] and pa[pid]["c_stop"] == pb[pid]["c_stop"]
        for protocol in PROTOCOLS:
            for group in groups:
                for t in range(turns + 1):
                    xa = list(scores(a, m, protocol, group, t).values())
                    xb = list(scores(b, m, protocol, group, t).values())
                    if xa and xb:
                        va, vb = 100 * statistics.fmean(xa), 100 * statistics.fmean(xb)
                        diffs.append(abs(va - vb))
                        if va != vb:
                            differing.append(
                                {
                                    "model": m,
                                    "protocol": protocol,
                                    "group": group,
                                    "turn": t,
                                    "a": round(va, 2),
                                    "b": round(vb, 2),
                                }
                            )
    fa, fb = a.get("fingerprints", {}), b.get("fingerprints", {})
    equal = {k: fa[k] == fb.get(k) for k in fa if k in fb}
    identical = bool(diffs) and not differing and all(equal.values())
    return {
        "seed": a["seed"],
        "runs": [a.get("label"), b.get("label")],
        "sources": [a.get("source"), b.get("source")],
        "cells": len(diffs),
        "cells_identical": sum(d == 0 for d in diffs),
        "max_abs_pp": round(max(diffs), 2) if diffs else None,
        "mean_abs_pp": _mean(diffs),
        "problems_identical_pct": round(100 * same_problems / problems, 1) if problems else None,
        "fingerprints_equal": equal,
        "identical": identical,
        "differing_cells": differing,
        "first_differing_fingerprint": next((k for k, v in equal.items() if not v), None),
        "cause": None if identical else repeat_cause(a, b),
    }


# settings that name the run, not its computation
_RUN_ONLY = {"out", "work", "label", "seed", "seeds", "repeat", "parallel", "deadline_s",
             "deadline_at", "child", "aggregate", "modes", "sandbox_concurrency"}  # fmt: skip


def repeat_cause(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The likely reason two runs of one seed differ, from what they recorded: determinism off
    or not strict, other settings, other code or libraries; else unexplained."""
    da, db = a.get("determinism", {}), b.get("determinism", {})
    loose = [
        r.get("label") or "?"
        for r, d in ((a, da), (b, db))
        if not d.get("deterministic_algorithms") or d.get("warn_only", True)
    ]
    if loose:
        return (
            f"strict determinism off in {', '.join(loose)} (warn_only or no deterministic "
            "algorithms): kernels without a deterministic implementation (on a GPU the SDPA "
            "attention backward) differ from run to run, and every later phase inherits it"
        )
    sa, sb = a.get("settings", {}), b.get("settings", {})
    other = sorted(
        k for k in sa.keys() | sb.keys() if k not in _RUN_ONLY and sa.get(k) != sb.get(k)
    )
    if other:
        return f"different settings: {', '.join(other)}"
    ma, mb = a.get("machine", {}), b.get("machine", {})
    versions = sorted(k for k in ma.keys() | mb.keys() if k != "cpus" and ma.get(k) != mb.get(k))
    if versions:
        return f"different code, libraries or machine: {', '.join(versions)}"
    return (
        "unexplained: same settings, code and libraries under strict determinism; the first "
        "differing fingerprint names the phase (the sandbox's time limit under load can flip a "
        "slow program)"
    )
