"""Prefect layer of the pipeline: the reference model as a task, and the closing report (stage
table, before/after Pass@1 table and plot) as artifacts. The parameters and the summary itself
are `cobalt/pipeline/`."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_table_artifact,
)

from cobalt.analysis.summary import HackingSummary
from cobalt.data.stages import DataSummary
from cobalt.models import resolve_model
from cobalt.pipeline import PipelineParams, PipelineSummary, summarize
from cobalt.tables import markdown_table
from cobalt.training.stages import TrainingSummary
from cobalt.trajectories.runs import TrajectorySummary


@task(name="reference-model", log_prints=False)  # dill prints `dis` output (see tasks/training)
def reference_model(params: PipelineParams, resolved: str | None = None) -> str:
    """The reference model's local directory: `resolved` (what the preflight resolved the name
    to), or 'fitted' / 'tiny' fitted (built) once, reused after."""
    if resolved is not None:
        return resolved
    return resolve_model(
        params.reference,
        params.storage,
        params.work_dir,
        fit_steps=params.fit_steps,
        logger=get_run_logger(),
    )


def report(
    params: PipelineParams,
    data: DataSummary,
    collected: TrajectorySummary,
    before: TrajectorySummary,
    trained: TrainingSummary,
    after: TrajectorySummary,
    hacking: tuple[HackingSummary, HackingSummary] | None = None,
) -> PipelineSummary:
    """Stage table, before/after table and plot: Prefect artifacts, files in storage, log line;
    with the reward-hacking analyses, their comparison too."""
    summary = summarize(params, data, collected, before, trained, after, hacking)
    hacking_md = ""
    if summary.reward_hacking:
        create_table_artifact(
            key="pipeline-reward-hacking",
            table=summary.reward_hacking,
            description="Turn-level error rate (%) on the perturbed set, reference vs trained",
        )
        hacking_md = (
            f"\n\n## Reward hacking, reference vs trained\n\n"
            f"{markdown_table(summary.reward_hacking)}\n\n"
            f"Plot: [{summary.reward_hacking_plot}]({summary.reward_hacking_plot})\n"
        )
    create_table_artifact(
        key="pipeline-stages",
        table=summary.stages,
        description="What each stage of the run produced",
    )
    create_table_artifact(
        key="pipeline-before-after",
        table=summary.before_after,
        description="Pass@1 (%) per turn before and after training (change in points)",
    )
    create_image_artifact(
        image_url=summary.plot,
        key="pipeline-plot",
        description="Pass@1 per turn, each group before (dashed) and after (solid), the change "
        "in points at each turn (PNG)",
    )
    create_markdown_artifact(
        key="pipeline-summary",
        markdown=f"# Pipeline\n\n{summary.line}\n\n## Stages\n\n{markdown_table(summary.stages)}"
        f"\n\n## Before / after\n\n{markdown_table(summary.before_after)}\n\n"
        f"Plot: [{summary.plot}]({summary.plot})\n\nTrained policy (a name `--model` takes): "
        f"`{summary.policy}`\n{hacking_md}",
    )
    get_run_logger().info(summary.line)
    return summary
