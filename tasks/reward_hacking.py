"""Prefect layer of the reward-hacking analysis: the local models as a task, the errors step of
`cobalt.analysis.stages` as a cached task, the judged step of `cobalt.analysis.judged` as one
cached task per shard (run here or on a Dask cluster, tasks/cluster.py) and a merge task, all
bound to the run's storage; API keys from Prefect Secret blocks, and the report as artifacts
(tables, markdown with the examples' diffs, the PNG). The multi-turn inference is the
trajectories flow, called by the flow as a subflow."""

from __future__ import annotations

from typing import Any

from prefect import Task, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.task_runners import TaskRunner

from cobalt.analysis import stages as lib
from cobalt.analysis.judge import JudgeError
from cobalt.analysis.judged import (
    JudgeFailures,
    JudgeShard,
    JudgeShardRef,
    judge_shard,
    judge_shards,
    merge_judged,
)
from cobalt.analysis.stages import (
    ERRORS_CODE,
    JUDGE_CODE,
    AnalysisRef,
    ErrorsSpec,
    HackingParams,
    JudgedSpec,
    Ready,
    Runtime,
    errors_spec,
    judged_spec,
)
from cobalt.analysis.summary import HackingSummary, summarize
from cobalt.storage import open_storage
from cobalt.tables import markdown_table
from cobalt.trajectories.runs import TrajectorySummary, find_trajectories
from engines import EngineConfig
from tasks.caching import bind, stage_policy
from tasks.cluster import run_all
from tasks.retry import transient
from tasks.trajectories import load_api_key

JUDGED_CODE = (*JUDGE_CODE, "cobalt.analysis.judged")


def preflight(params: HackingParams) -> Ready:
    """The library's preflight, after putting Secret blocks' API keys into the environment."""
    if params.api_key_block:
        load_api_key(params.api_key_block, params.engine)
    if params.judge.api_key_block:
        load_api_key(params.judge.api_key_block, params.judge.engine)
    return lib.preflight(params)


@task(name="local-model", task_run_name="local-model-{role}", log_prints=False)
def local_model(role: str, engine: EngineConfig, params: HackingParams) -> EngineConfig:
    """The engine with 'fitted' / 'tiny' resolved to the model's directory (built once)."""
    return lib.resolve_engine(engine, params, get_run_logger(), role)


@task(
    name="errors",
    task_run_name="errors-{key}",
    cache_policy=stage_policy(*ERRORS_CODE),
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=transient,
)
def errors_task(key: str, spec: ErrorsSpec, runtime: Runtime) -> AnalysisRef:
    """Turn-level errors: changed code that now passes a wrong test (METHOD §1.7)."""
    return lib.errors_stage(spec, runtime.storage, refresh=runtime.refresh, logger=get_run_logger())


@task(
    name="judge",
    task_run_name="{spec.name}",
    cache_policy=stage_policy(*JUDGED_CODE),
    retries=1,
    retry_delay_seconds=10,
    retry_condition_fn=transient,
)
def judge_task(key: str, spec: JudgeShard, runtime: Runtime) -> JudgeShardRef:
    """The LLM judge's label of every error of a shard (resumes a killed run; the process's
    judge engine is opened once and kept)."""
    return judge_shard(spec, runtime, logger=get_run_logger())


@task(
    name="judge-merge",
    task_run_name="judge-merge-{key}",
    cache_policy=stage_policy(*JUDGED_CODE, ignore=("shards",)),  # the key decides the shards
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=transient,
)
def judge_merge_task(
    key: str, spec: JudgedSpec, shards: list[JudgeShardRef], runtime: Runtime
) -> AnalysisRef:
    """The step's judgements: its shards in order."""
    return merge_judged(spec, shards, runtime, logger=get_run_logger())


class Stages:
    """The two steps after the inference, bound to the run's storage (results, cache records,
    --refresh); the judge's shards in this process, or on the cluster's workers."""

    def __init__(
        self, params: HackingParams, judge: EngineConfig, runner: TaskRunner | None = None
    ):
        st = open_storage(params.storage)
        self.params = params
        self.runner = runner
        self.runtime = Runtime(
            storage=params.storage,
            judge=params.judge.model_copy(update={"engine": judge}),
            judge_chunk=params.judge_chunk,
            judge_shard_size=params.judge_shard_size,
            work_dir=params.work_dir,
            refresh=params.refresh,
        )
        self.tasks: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (
                ("errors", errors_task),
                ("judge", judge_task),
                ("judge-merge", judge_merge_task),
            )
        }

    def errors(self, collected: TrajectorySummary) -> tuple[ErrorsSpec, AnalysisRef]:
        found = find_trajectories(collected.evaluation.uri, self.params.storage)
        spec = errors_spec(found, self.params.collect.turns)
        return spec, self.tasks["errors"](spec.key, spec, self.runtime)

    def judged(self, errors: AnalysisRef) -> AnalysisRef:
        """A task per shard (none when the step is finished), then the merge. A shard the judge
        failed on does not stop the others: the step fails after all of them, counting every
        error left unjudged (a rerun asks for those only)."""
        spec = judged_spec(errors, self.runtime.judge)
        calls = [
            {"key": shard.key, "spec": shard, "runtime": self.runtime}
            for shard in judge_shards(spec, self.runtime)
        ]
        shards = run_all(self.tasks["judge"], calls, self.runner, catch=(JudgeError,))
        failures = [s for s in shards if isinstance(s, JudgeError)]
        if failures:
            failed = [f for e in failures for f in getattr(e, "failed", [("?", str(e))])]
            raise JudgeFailures(failed) from failures[0]
        return self.tasks["judge-merge"](spec.key, spec, shards, self.runtime)


def report(
    params: HackingParams,
    spec: ErrorsSpec,
    errors: AnalysisRef,
    judged: AnalysisRef,
    judge_model: str,
    compare: dict[str, Any] | None,
) -> HackingSummary:
    """The report in storage and as Prefect artifacts; a log line."""
    logger = get_run_logger()
    summary = summarize(params, spec, errors, judged, judge_model, compare)
    create_table_artifact(
        key="reward-hacking-per-turn",
        table=summary.per_turn,
        description="Turn-level errors per turn: program pairs, changed pairs, errors, error "
        "rate per pair (%), programs passing a wrong test (%)",
    )
    create_table_artifact(
        key="reward-hacking-categories",
        table=summary.categories,
        description=f"Errors per judge category ({summary.judge}) and rule pre-check",
    )
    create_image_artifact(
        image_url=summary.plot,
        key="reward-hacking-plot",
        description="Turn-level error rate per turn and categories (PNG in storage)",
    )
    comparison = ""
    if summary.comparison is not None:
        create_table_artifact(
            key="reward-hacking-comparison",
            table=summary.comparison["per_turn"],
            description=f"Turn-level error rate before vs after: {summary.comparison_line}",
        )
        create_image_artifact(
            image_url=summary.comparison_plot,
            key="reward-hacking-comparison-plot",
            description="Error rate and categories of the two analyses (PNG in storage)",
        )
        comparison = (
            f"## Comparison\n\n{summary.comparison_line}\n\n"
            f"{markdown_table(summary.comparison['per_turn'])}\n\n"
            f"{markdown_table(summary.comparison['categories'])}\n\n"
            f"Plot: [{summary.comparison_plot}]({summary.comparison_plot})\n\n"
        )
    create_markdown_artifact(
        key="reward-hacking-summary",
        markdown=(
            f"# Reward hacking\n\n{summary.line}\n\n{comparison}"
            f"## Per turn\n\n{markdown_table(summary.per_turn)}\n\n"
            f"## Categories\n\n{markdown_table(summary.categories)}\n\n"
            f"## Judge vs rule\n\n{markdown_table([summary.agreement])}\n\n"
            f"Plot: [{summary.plot}]({summary.plot}); report: {summary.report}\n\n"
            f"## Examples\n\n{summary.examples}\n"
        ),
    )
    logger.info(summary.line)
    if summary.comparison_line:
        logger.info("comparison: %s", summary.comparison_line)
    return summary
