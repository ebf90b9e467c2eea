"""Prefect layer of the trajectory stage: each step of `cobalt.trajectories.stages` as one cached
task per shard (run here or on a Dask cluster, tasks/cluster.py) and a merge task, bound to the
run's storage; API keys from a Prefect Secret block; Prefect global concurrency limits as the
gates around generation and judging; the report as artifacts."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.blocks.system import Secret
from prefect.concurrency.sync import concurrency
from prefect.task_runners import TaskRunner

from cobalt.storage import open_storage
from cobalt.tables import markdown_table
from cobalt.trajectories import stages as lib
from cobalt.trajectories.problemsets import ProblemSetError
from cobalt.trajectories.runs import TrajectorySummary, summarize
from cobalt.trajectories.shards import merge_shards, shards_of
from cobalt.trajectories.specs import Runtime, Shard, ShardRef, StageSpec, TrajectoryRef
from cobalt.trajectories.stages import (
    EVALUATION_CODE,
    INITIAL_CODE,
    MULTITURN_CODE,
    Ready,
    TrajectoryParams,
    chained,
    runtime_of,
    stage_specs,
)
from engines import EngineConfig
from tasks.caching import bind, stage_policy
from tasks.cluster import run_all
from tasks.retry import transient


def preflight(params: TrajectoryParams) -> Ready:
    """The library's preflight, after putting a Secret block's API key into the environment."""
    if params.api_key_block:
        load_api_key(params.api_key_block, params.engine)
    return lib.preflight(params)


def load_api_key(block: str, engine: EngineConfig) -> None:
    """Put the key of Prefect Secret block `block` into the variable the engine reads."""
    if not engine.api_key_env:
        raise ProblemSetError(
            f"api_key_block {block!r} needs engine.api_key_env (--api-key-env VAR): the name of "
            "the environment variable the engine reads the key from"
        )
    try:
        secret = Secret.load(block)
    except ValueError as e:
        raise ProblemSetError(
            f"Prefect Secret block {block!r} not found: create it with "
            f"`Secret(value=...).save({block!r})` or in the UI (Blocks > Secret)"
        ) from e
    os.environ[engine.api_key_env] = secret.get()


def gate(name: str | None) -> Callable[[], AbstractContextManager[Any]] | None:
    """A slot of the Prefect global concurrency limit `name`, held around a batch of work."""
    if not name:
        return None
    return lambda: concurrency(name, occupy=1)


@task(
    name="initial",
    task_run_name="{spec.name}",
    cache_policy=stage_policy(*INITIAL_CODE),
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=transient,
)
def initial_task(key: str, spec: Shard, runtime: Runtime) -> ShardRef:
    """Turn 0 of a shard: n samples per problem (the cached first programs)."""
    return lib.initial_shard(spec, runtime, logger=get_run_logger(), gate=gate(runtime.llm_limit))


@task(
    name="multiturn",
    task_run_name="{spec.name}",
    cache_policy=stage_policy(*MULTITURN_CODE),
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=transient,
)
def multiturn_task(key: str, spec: Shard, runtime: Runtime) -> ShardRef:
    """Feedback turns of a shard: public-test feedback, repair, repeat (resumes a killed run)."""
    return lib.multiturn_shard(
        spec,
        runtime,
        logger=get_run_logger(),
        gate=gate(runtime.llm_limit),
        sandbox_gate=gate(runtime.sandbox_limit),
    )


@task(
    name="evaluation",
    task_run_name="{spec.name}",
    cache_policy=stage_policy(*EVALUATION_CODE),
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=transient,
)
def evaluation_task(key: str, spec: Shard, runtime: Runtime) -> ShardRef:
    """Every turn's program of a shard on all true tests."""
    return lib.evaluation_shard(
        spec, runtime, logger=get_run_logger(), sandbox_gate=gate(runtime.sandbox_limit)
    )


@task(
    name="merge",
    task_run_name="{spec.stage}-merge-{key}",
    cache_policy=stage_policy("cobalt.trajectories.shards"),
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=transient,
)
def merge_task(
    key: str, spec: StageSpec, shards: list[ShardRef], runtime: Runtime
) -> TrajectoryRef:
    """The step's records: its shards in order."""
    return merge_shards(spec, shards, runtime, logger=get_run_logger())


class Stages:
    """The steps, each as shard tasks (in this process, or on the cluster's workers) and a merge
    task, bound to the run's storage (results, cache records, --refresh)."""

    def __init__(self, params: TrajectoryParams, ready: Ready, runner: TaskRunner | None = None):
        st = open_storage(params.storage)
        self.specs = stage_specs(params, ready)
        self.runtime = runtime_of(params, ready)
        self.runner = runner
        self.tasks: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (
                ("initial", initial_task),
                ("multiturn", multiturn_task),
                ("evaluation", evaluation_task),
                ("merge", merge_task),
            )
        }

    def _run(self, spec: StageSpec) -> TrajectoryRef:
        calls = [
            {"key": shard.key, "spec": shard, "runtime": self.runtime}
            for shard in shards_of(spec, self.runtime)
        ]
        shards = run_all(self.tasks[spec.stage], calls, self.runner)
        return self.tasks["merge"](spec.key, spec, shards, self.runtime)

    def initial(self) -> TrajectoryRef:
        return self._run(self.specs["initial"])

    def multiturn(self, initial: TrajectoryRef) -> TrajectoryRef:
        return self._run(chained(self.specs["multiturn"], initial))

    def evaluation(self, multiturn: TrajectoryRef) -> TrajectoryRef:
        return self._run(chained(self.specs["evaluation"], multiturn))


def report(
    params: TrajectoryParams,
    ready: Ready,
    initial: TrajectoryRef,
    multiturn: TrajectoryRef,
    evaluation: TrajectoryRef,
) -> TrajectorySummary:
    """Per-turn Pass@1 table and plot as Prefect artifacts (files in storage), a log line."""
    logger = get_run_logger()
    summary = summarize(params, ready, initial, multiturn, evaluation, logger)
    create_table_artifact(
        table=summary.table,
        key="trajectories-pass-at-1",
        description="Pass@1 (%) per turn and difficulty, relative change to "
        "turn 0 (%), mean test pass rate, turns without a program",
    )
    create_image_artifact(
        image_url=summary.plot,
        key="trajectories-plot",
        description="Pass@1 per turn (PNG in storage)",
    )
    create_markdown_artifact(
        key="trajectories-summary",
        markdown=(
            f"# Trajectories\n\n{summary.line}\n\n{markdown_table(summary.table)}\n\n"
            f"Plot: [{summary.plot}]({summary.plot})\n\nStages: initial `{initial.uri}`, "
            f"multiturn `{multiturn.uri}`, evaluation `{evaluation.uri}`\n"
        ),
    )
    logger.info(summary.line)
    return summary
