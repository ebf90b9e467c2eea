"""A finished trajectories run: its summary (per-turn Pass@1 table, plot, one line; written to
storage beside the evaluation step) and how later stages find it again ('latest' or the
evaluation step's directory)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cobalt.evaluation import EvalRecord, plot_pass_at_1, turn_table
from cobalt.storage import MANIFEST, Logger, StorageConfig, from_manifest, open_storage
from cobalt.tables import markdown_table
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
    title = f"Pass@1 per turn: {ready.engine.model.rsplit('/', 1)[-1]}, {source.count} problems"
    plot_path = f"{directory}/pass_at_1.png"
    st.write_atomic(plot_path, plot_pass_at_1(table, title))
    st.write_atomic(f"{directory}/table.json", json.dumps(table, indent=1).encode())
    st.write_atomic(f"{directory}/table.md", (markdown_table(table) + "\n").encode())
    plot_url = Path(plot_path).as_uri() if params.storage.is_local else st.protocol + plot_path
    all_rows = [r for r in table if r["difficulty"] == "all"]
    first, last = all_rows[0], all_rows[-1]
    change = last["change_vs_turn0"]
    line = (
        f"trajectories ({ready.engine.kind}): {source.count} problems x "
        f"{params.collect.sampling.n} samples, "
        f"{params.collect.turns} feedback turns; Pass@1 {first['pass@1']}% at turn 0 -> "
        f"{last['pass@1']}% at turn {last['turn']}"
        f"{'' if change is None else f' ({change:+.1f}%)'}; problems from {what}; "
        f"records at {multiturn.uri}"
    )
    st.write_atomic(
        st.path("trajectories", "LATEST.json"),
        json.dumps(
            {
                "evaluation": evaluation.uri,
                "multiturn": multiturn.uri,
                "at": datetime.now(UTC).isoformat(),
            }
        ).encode(),
    )
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
        pointer = st.path("trajectories", "LATEST.json")
        if not st.fs.exists(pointer):
            raise ProblemSetError(
                f"no trajectories in {st.url()} yet: run `python -m flows.trajectories` with the "
                "same --storage first, or pass --trajectories DIR (an evaluation stage directory)"
            )
        where = st.read_json(pointer)["evaluation"]
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
