"""Prefect layer of the reward-hacking analysis: the local models as a task, the errors and judged
steps of `cobalt.analysis.stages` as cached tasks bound to the run's storage, API keys from
Prefect Secret blocks, and the report as artifacts (tables, markdown with the examples' diffs,
the PNG). The multi-turn inference is the trajectories flow, called by the flow as a subflow."""

from __future__ import annotations

from typing import Any

from prefect import Task, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_table_artifact,
)

from cobalt.analysis import stages as lib
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
from tasks.trajectories import load_api_key


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
    return lib.resolve_engine(engine, params, get_run_logger())


@task(
    name="errors",
    task_run_name="errors-{key}",
    cache_policy=stage_policy(*ERRORS_CODE),
    retries=1,
    retry_delay_seconds=5,
)
def errors_task(key: str, spec: ErrorsSpec, runtime: Runtime) -> AnalysisRef:
    """Turn-level errors: changed code that now passes a wrong test (SPEC §1.7)."""
    return lib.errors_stage(spec, runtime.storage, refresh=runtime.refresh, logger=get_run_logger())


@task(
    name="judge",
    task_run_name="judge-{key}",
    cache_policy=stage_policy(*JUDGE_CODE),
    retries=1,
    retry_delay_seconds=10,
)
def judge_task(key: str, spec: JudgedSpec, runtime: Runtime) -> AnalysisRef:
    """The LLM judge's label of every error (resumes a killed run)."""
    return lib.judged_stage(spec, runtime, logger=get_run_logger())


class Stages:
    """The two steps after the inference, bound to the run's storage (results, cache records,
    --refresh)."""

    def __init__(self, params: HackingParams, judge: EngineConfig):
        st = open_storage(params.storage)
        self.params = params
        self.runtime = Runtime(
            storage=params.storage,
            judge=params.judge.model_copy(update={"engine": judge}),
            judge_chunk=params.judge_chunk,
            work_dir=params.work_dir,
            refresh=params.refresh,
        )
        self.tasks: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (("errors", errors_task), ("judge", judge_task))
        }

    def errors(self, collected: TrajectorySummary) -> tuple[ErrorsSpec, AnalysisRef]:
        found = find_trajectories(collected.evaluation.uri, self.params.storage)
        spec = errors_spec(found, self.params.collect.turns)
        return spec, self.tasks["errors"](spec.key, spec, self.runtime)

    def judged(self, errors: AnalysisRef) -> AnalysisRef:
        spec = judged_spec(errors, self.runtime.judge)
        return self.tasks["judge"](spec.key, spec, self.runtime)


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
