"""Prefect layer of the training stage: the bandit dataset and GRPO training as cached tasks
bound to the run's storage, and the report (bandit stats, reward curve, step time) as
artifacts. The stage itself is `cobalt/bandit/dataset.py` and `cobalt/training/stages.py`."""

from __future__ import annotations

from prefect import Task, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_table_artifact,
)

from cobalt.bandit.dataset import BANDIT_CODE, BanditRef, BanditSpec, bandit_stage
from cobalt.storage import open_storage
from cobalt.tables import markdown_table
from cobalt.training.stages import (
    TRAINING_CODE,
    PolicyRef,
    Ready,
    Runtime,
    TrainingParams,
    TrainingSpec,
    TrainingSummary,
    bandit_spec_of,
    check_repairs,
    runtime_of,
    summarize,
    training_spec,
    training_stage,
)
from tasks.caching import bind, stage_policy


# log_prints off: dill (under `datasets`) reads globals by capturing `print` output of `dis`,
# which Prefect's print patch would turn into pages of log lines (and empty dill's capture)
@task(
    name="bandit",
    task_run_name="bandit-{key}",
    cache_policy=stage_policy(*BANDIT_CODE),
    log_prints=False,
)
def bandit_task(key: str, spec: BanditSpec, runtime: Runtime) -> BanditRef:
    """Trajectories + per-turn evaluation -> contextual-bandit training rows (SPEC §1.4)."""
    return bandit_stage(
        spec, runtime.storage, runtime.model, refresh=runtime.refresh, logger=get_run_logger()
    )


@task(
    name="training",
    task_run_name="training-{key}",
    cache_policy=stage_policy(*TRAINING_CODE),
    retries=1,
    retry_delay_seconds=10,
    log_prints=False,
)
def training_task(key: str, spec: TrainingSpec, runtime: Runtime) -> PolicyRef:
    """GRPO on the bandit rows with the sandbox reward (resumes from its last checkpoint)."""
    return training_stage(spec, runtime, logger=get_run_logger())


class Stages:
    """The stage tasks bound to the run's storage (results, cache records, --refresh)."""

    def __init__(self, params: TrainingParams, ready: Ready):
        st = open_storage(params.storage)
        self.params, self.ready = params, ready
        self.runtime = runtime_of(params, ready)
        self.tasks: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (("bandit", bandit_task), ("training", training_task))
        }

    def bandit(self) -> BanditRef:
        spec = bandit_spec_of(self.params, self.ready)
        return self.tasks["bandit"](spec.key, spec, self.runtime)

    def training(self, dataset: BanditRef) -> PolicyRef:
        check_repairs(self.params, dataset)
        spec = training_spec(self.params, self.ready, dataset)
        return self.tasks["training"](spec.key, spec, self.runtime)


def report(params: TrainingParams, dataset: BanditRef, policy: PolicyRef) -> TrainingSummary:
    """Bandit stats and reward curve as Prefect artifacts; a summary line in the log."""
    summary = summarize(params, dataset, policy)
    stats = dataset.stats
    depth_rows = [
        {"turn_depth": k, "contexts": v} for k, v in stats.get("contexts_by_depth", {}).items()
    ]
    create_table_artifact(
        key="bandit-contexts",
        table=depth_rows,
        description=f"Bandit contexts per turn depth ({stats.get('problems')} problems, "
        f"{stats.get('skipped_all_solved')} skipped as solved by every first sample)",
    )
    timing = policy.stats.get("timing", {})
    time_rows = [
        {"bucket": k.removesuffix("_s"), "seconds": v, "share": timing.get(k[:-2] + "_share")}
        for k, v in timing.items()
        if k.endswith("_s") and k not in ("total_s", "step_s")
    ]
    create_image_artifact(
        image_url=policy.plot, key="training-rewards", description="Reward per step (PNG)"
    )
    flat = {k: v for k, v in stats.items() if not isinstance(v, dict)}
    create_markdown_artifact(
        key="training-summary",
        markdown=(
            f"# Training\n\n{summary.line}\n\n## Bandit dataset\n\n{markdown_table([flat])}\n\n"
            f"Contexts per turn depth:\n\n{markdown_table(depth_rows)}\n\n"
            f"## Step time\n\n{markdown_table(time_rows) if time_rows else '-'}\n\n"
            f"Reward curve: [{policy.plot}]({policy.plot})\n"
        ),
    )
    get_run_logger().info(summary.line)
    return summary
