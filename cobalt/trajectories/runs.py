"""A finished trajectories run: its summary (per-turn Pass@1 table, plot, one line; written to
storage beside the evaluation step), how later stages find it again ('latest' or the
evaluation step's directory), and two evaluations' per-turn tables side by side (`before_after`,
the pipeline's before/after table; `compare_evaluations`, `python -m flows.trajectories
--compare A B`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cobalt.models import display_name, stable_name
from cobalt.storage import MANIFEST, Logger, StorageConfig, from_manifest, open_storage
from cobalt.tables import markdown_table
from cobalt.trajectories.evaluation import EvalRecord, plot_before_after, plot_pass_at_1, turn_table
from cobalt.trajectories.problemsets import ProblemSetError, ProblemSource
from cobalt.trajectories.stages import (
    Ready,
    TrajectoryParams,
    TrajectoryRef,
    read_stage,
)


class TrajectorySummary(BaseModel):
    initial: TrajectoryRef
    multiturn: TrajectoryRef
    evaluation: TrajectoryRef
    table: list[dict[str, Any]]
    plot: str
    line: str
    engine: str = Field("", description="The engine that generated (auto resolved).")


def summarize(
    params: TrajectoryParams,
    ready: Ready,
    initial: TrajectoryRef,
    multiturn: TrajectoryRef,
    evaluation: TrajectoryRef,
    logger: Logger | None = None,
) -> TrajectorySummary:
    """Per-turn Pass@1 table (JSON and markdown in storage), PNG plot in storage, the summary
    line; the LATEST pointer (what `--trajectories latest` reads) now names this run."""
    st = open_storage(params.storage)
    evals = read_stage(evaluation, params.storage, EvalRecord, logger)
    table = turn_table(evals.values(), params.collect.turns)
    directory = evaluation.uri.removeprefix("s3://")
    source = ready.problems
    what = f"{source.uri}{' [' + source.table + ']' if source.table else ''}" + (
        " (perturbed feedback)" if source.perturbed else ""
    )
    title = f"Pass@1 per turn: {display_name(ready.engine.model)}, {source.count} problems"
    plot_path = f"{directory}/pass_at_1.png"
    st.write_atomic(plot_path, plot_pass_at_1(table, title))
    st.write_atomic(f"{directory}/table.json", json.dumps(table, indent=1).encode())
    st.write_atomic(f"{directory}/table.md", (markdown_table(table) + "\n").encode())
    plot_url = Path(plot_path).as_uri() if params.storage.is_local else st.protocol + plot_path
    all_rows = [r for r in table if r["difficulty"] == "all"]
    first, last = all_rows[0], all_rows[-1]
    change = last["change_vs_turn0"]
    model = stable_name(ready.engine.model)
    line = (
        f"trajectories ({ready.engine.kind}): {source.count} problems x "
        f"{params.collect.sampling.n} samples, "
        f"{params.collect.turns} feedback turns; Pass@1 {first['pass@1']}% at turn 0 -> "
        f"{last['pass@1']}% at turn {last['turn']}"
        f"{'' if change is None else f' ({change:+.1f}%)'}; model {model}; "
        f"problems from {what}; records at {multiturn.uri}"
    )
    st.point_latest("trajectories", evaluation=evaluation.uri, multiturn=multiturn.uri)
    return TrajectorySummary(
        initial=initial,
        multiturn=multiturn,
        evaluation=evaluation,
        table=table,
        plot=plot_url,
        line=line,
        engine=ready.engine.kind,
    )


class Trajectories(BaseModel):
    """A finished trajectories run (evaluation step and its upstream), as later stages need it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    evaluation: TrajectoryRef
    multiturn: TrajectoryRef
    problems: ProblemSource
    engine: dict[str, Any] = Field(description="Identity of the engine that collected them.")


def find_trajectories(where: str, storage_config: StorageConfig) -> Trajectories:
    """The evaluation stage named by `where` ('latest' or its directory) and its upstream."""
    st = open_storage(storage_config)
    if where == "latest":
        where = st.latest("trajectories", "evaluation")
        if where is None:
            raise ProblemSetError(
                f"no trajectories in {st.url()} yet: run `python -m flows.trajectories` with the "
                "same --storage first, or pass --trajectories DIR (an evaluation stage directory)"
            )
    manifest_path = f"{where.removeprefix('s3://').rstrip('/')}/{MANIFEST}"
    if not st.fs.exists(manifest_path):
        raise ProblemSetError(
            f"{where} is not a finished evaluation stage (no {MANIFEST}): pass "
            "<storage>/trajectories/evaluation/<key> of a completed trajectories run"
        )
    manifest = st.read_json(manifest_path)
    spec = manifest.get("spec") or {}
    if spec.get("stage") != "evaluation" or not spec.get("upstream"):
        raise ProblemSetError(f"{where} holds a {spec.get('stage')!r} stage, not 'evaluation'")
    evaluation = from_manifest(manifest, TrajectoryRef)
    return Trajectories(
        evaluation=evaluation,
        multiturn=TrajectoryRef.model_validate(spec["upstream"]),
        problems=ProblemSource.model_validate(spec["problems"]),
        engine=spec.get("engine") or {},
    )


# --- two evaluations side by side -----------------------------------------------------------------


def before_after(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict]:
    """Pass@1 (%) per difficulty and turn, before and after (two `turn_table`s), and the change
    in points."""
    later = {(r["difficulty"], r["turn"]): r for r in after}
    rows = []
    for r in before:
        a = later.get((r["difficulty"], r["turn"]))
        if a is None:
            continue
        rows.append(
            {
                "difficulty": r["difficulty"],
                "turn": r["turn"],
                "problems": r["problems"],
                "before_pass@1": r["pass@1"],
                "after_pass@1": a["pass@1"],
                "change_points": round(a["pass@1"] - r["pass@1"], 2),
            }
        )
    return rows


class Comparison(BaseModel):
    """Two finished evaluations' per-turn Pass@1, the first as 'before', the second as 'after'."""

    before: str = Field(description="The first evaluation's directory.")
    after: str = Field(description="The second evaluation's directory.")
    models: tuple[str, str]
    table: list[dict[str, Any]]
    differences: list[str] = Field(
        description="Settings of the protocol (problems, sampling, turns, limits, engine kind) "
        "in which the two differ: each 'field: first vs second'."
    )
    plot: str
    line: str


# what decides an evaluation beside the model: a difference here makes the two incomparable
_PROTOCOL = ("problems", "collect", "limits")


def compare_evaluations(first: str, second: str, storage: StorageConfig) -> Comparison:
    """The per-turn Pass@1 tables of two finished evaluations ('latest' or an evaluation stage's
    directory) side by side (`before_after`), the settings in which their protocols differ, and
    the plot, written to <storage>/trajectories/comparisons/<key>-<key>/."""
    st = open_storage(storage)
    found, specs, tables = [], [], []
    for where in (first, second):
        runs = find_trajectories(where, storage)
        spec = st.read_json(f"{runs.evaluation.uri.removeprefix('s3://')}/{MANIFEST}")["spec"]
        evals = read_stage(runs.evaluation, storage, EvalRecord)
        found.append(runs)
        specs.append(spec)
        tables.append(turn_table(evals.values(), spec["collect"]["turns"]))
    table = before_after(*tables)
    if not table:
        raise ProblemSetError(
            f"{first} and {second} share no turn of any difficulty: compare two evaluations of "
            "the same problem set (the same --problems and --table)"
        )
    differences = _differences(specs[0], specs[1])
    models = (_model(found[0].engine), _model(found[1].engine))
    directory = st.path("trajectories", "comparisons", "-".join(r.evaluation.key for r in found))
    title = f"Pass@1 per turn: {display_name(models[0])} (dashed) vs {display_name(models[1])}"
    st.write_atomic(f"{directory}/before_after.png", plot_before_after(table, title))
    st.write_atomic(f"{directory}/table.json", json.dumps(table, indent=1).encode())
    plot = f"{directory}/before_after.png"
    plot = Path(plot).as_uri() if storage.is_local else st.protocol + plot
    rows = [r for r in table if r["difficulty"] == "all"]
    changes = ", ".join(
        f"turn {r['turn']} {r['before_pass@1']}% -> {r['after_pass@1']}% "
        f"({r['change_points']:+.2f} points)"
        for r in (rows[0], rows[-1])[: 1 if len(rows) == 1 else 2]
    )
    same = "same protocol" if not differences else f"protocols differ: {'; '.join(differences)}"
    line = (
        f"compare: Pass@1 on {rows[0]['problems']} problems, {models[0]} -> {models[1]}: "
        f"{changes} ({same})"
    )
    return Comparison(
        before=found[0].evaluation.uri,
        after=found[1].evaluation.uri,
        models=models,
        table=table,
        differences=differences,
        plot=plot,
        line=line,
    )


def _model(engine: dict[str, Any]) -> str:
    return str(engine.get("model", "?"))


def _differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """'field: a vs b' for each protocol setting in which two evaluation specs differ."""
    out = []
    a, b = _flat({k: first.get(k) for k in _PROTOCOL}), _flat({k: second.get(k) for k in _PROTOCOL})
    for key in sorted(set(a) | set(b)):
        if key.startswith("problems.") and key != "problems.fingerprint":
            continue  # where the problems came from; their content is the fingerprint
        if a.get(key) != b.get(key):
            out.append(f"{key}: {_short(a.get(key))} vs {_short(b.get(key))}")
    for key in ("kind", "dtype"):
        if first["engine"].get(key) != second["engine"].get(key):
            out.append(f"engine.{key}: {first['engine'].get(key)} vs {second['engine'].get(key)}")
    return out


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out |= _flat(v, f"{prefix}.{k}" if prefix else k)
    return out


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
