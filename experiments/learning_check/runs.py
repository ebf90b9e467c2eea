"""The learning check's seed results as runs: loaded from the output directories
(`<dir>/runs/*.json`, one per seed run, `results.SeedResult`) and sorted into one primary
run per seed and its repeats. The first run of a seed given is its primary run; a later one is a
repeat (it measures the same-seed spread and enters no interval), except a continuation: a later
run of the seed from the same SFT model (equal `sft_weights` fingerprint) that trained only modes
the primary lacks adds those modes to it, so one seed's modes spread over several device calls
stay paired on the same SFT model and problems."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from experiments.learning_check import results


def load_runs(dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Every seed result under `<dir>/runs/*.json`, directories in the order given, each run
    tagged with its `source` directory (other JSON there is passed over; a broken seed result
    raises `results.SeedResultError`)."""
    runs = []
    for d in dirs:
        for path in sorted(results.result_files(d), key=_run_order):
            doc = results.read(path)
            if doc is not None:
                runs.append(dict(doc) | {"source": str(d)})
    return runs


def _run_order(path: Path) -> tuple[int, int, str]:
    """seed0 before seed0-r1 before seed1; other names after, by name."""
    stem = path.stem.removeprefix("seed")
    head, _, repeat = stem.partition("-r")
    if head.isdigit() and (not repeat or repeat.isdigit()):
        return int(head), int(repeat or 0), ""
    return 1 << 30, 0, path.stem


def split_runs(runs: Sequence[dict[str, Any]]) -> tuple[dict[int, dict], list[dict]]:
    """The primary run per seed (the first given with an evaluation, else the first, with its
    continuations merged in: `continues`) and the repeats."""
    primary: dict[int, dict] = {}
    for run in runs:
        seed = run["seed"]
        if seed not in primary or (not primary[seed]["evaluation"] and run["evaluation"]):
            primary[seed] = run
    repeats = []
    for run in runs:
        first = primary[run["seed"]]
        if first is run:
            continue
        if continues(first, run):
            primary[run["seed"]] = first = _with_modes_of(first, run)
        else:
            repeats.append(run)
    return dict(sorted(primary.items())), repeats


def run_where(run: dict[str, Any]) -> str:
    return f"{run.get('source')}/{run.get('label')}"


def _trained(run: dict[str, Any]) -> set[str]:
    return set(run["evaluation"]) - {"sft"}


def continues(first: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether `run` continues `first` (same seed and SFT model, only modes `first` lacks)."""
    sft = first.get("fingerprints", {}).get("sft_weights")
    return (
        bool(sft)
        and run.get("fingerprints", {}).get("sft_weights") == sft
        and bool(_trained(run))
        and not _trained(run) & _trained(first)
    )


def _with_modes_of(first: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """`first` with the trained modes of its continuation `run` (a new dict): the continuation's
    entries for its modes (also over the primary's record of a failed attempt at one), the
    primary's for the rest."""
    added = _trained(run)
    keys = {k for m in added for k in (m, f"{m}_weights", f"eval_{m}_texts", f"train_{m}",
                                       f"evaluate_{m}")}  # fmt: skip

    def of_added(key: str) -> bool:
        return key in keys

    merged = dict(first)
    for key in ("training", "evaluation", "fingerprints", "phases_s", "gpu_memory_gib"):
        mine, theirs = first.get(key) or {}, run.get(key) or {}
        kept = {k: v for k, v in mine.items() if not of_added(k)}
        merged[key] = {**kept, **{k: v for k, v in theirs.items() if of_added(k) or k not in kept}}
    merged["modes"] = [*first.get("modes", []), *sorted(added - set(first.get("modes", [])))]
    merged["continued_by"] = [*first.get("continued_by", []), run_where(run)]
    merged["source"] = first.get("source")
    return merged
