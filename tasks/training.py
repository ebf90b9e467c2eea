"""Prefect layer of the training stage: the training dataset (the bandit dataset, or in offline
mode the offline dataset) and the training (GRPO, or offline) as cached tasks bound to the run's
storage, and the report (dataset stats, curves, step time, cost) as artifacts. The stage itself is
`cobalt/bandit/dataset.py`, `cobalt/training/method/offline_rows.py` and
`cobalt/training/stages.py`."""

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
from cobalt.training.method.offline_rows import (
    OFFLINE_DATA_CODE,
    OfflineDataSpec,
    offline_data_stage,
    turn_rows,
)
from cobalt.training.stages import (
    OFFLINE_TRAINING_CODE,
    TRAINING_CODE,
    PolicyRef,
    Ready,
    Runtime,
    TrainingParams,
    TrainingSpec,
    TrainingSummary,
    bandit_spec_of,
    check_dataset,
    offline_spec_of,
    runtime_of,
    summarize,
    training_spec,
    training_stage,
)
from tasks.caching import bind, stage_policy
from tasks.retry import transient


# log_prints off: dill (under `datasets`) reads globals by capturing `print` output of `dis`,
# which Prefect's print patch would turn into pages of log lines (and empty dill's capture)
@task(
    name="bandit",
    task_run_name="bandit-{key}",
    cache_policy=stage_policy(*BANDIT_CODE),
    log_prints=False,
)
def bandit_task(key: str, spec: BanditSpec, runtime: Runtime) -> BanditRef:
    """Trajectories + per-turn evaluation -> contextual-bandit training rows (METHOD §1.4)."""
    return bandit_stage(
        spec, runtime.storage, runtime.model, refresh=runtime.refresh, logger=get_run_logger()
    )


@task(
    name="offline-dataset",
    task_run_name="offline-dataset-{key}",
    cache_policy=stage_policy(*OFFLINE_DATA_CODE),
    log_prints=False,
)
def offline_dataset_task(key: str, spec: OfflineDataSpec, runtime: Runtime) -> BanditRef:
    """Trajectories + per-turn evaluation -> every logged turn with its reward and
    leave-one-out advantage (METHOD §2)."""
    return offline_data_stage(
        spec, runtime.storage, refresh=runtime.refresh, logger=get_run_logger()
    )


@task(
    name="training",
    task_run_name="training-{key}",
    cache_policy=stage_policy(*TRAINING_CODE),
    retries=1,
    retry_delay_seconds=10,
    retry_condition_fn=transient,
    log_prints=False,
)
def training_task(key: str, spec: TrainingSpec, runtime: Runtime) -> PolicyRef:
    """GRPO on the bandit rows with the sandbox reward (resumes from its last checkpoint)."""
    return training_stage(spec, runtime, logger=get_run_logger())


@task(
    name="offline-training",
    task_run_name="offline-training-{key}",
    cache_policy=stage_policy(*OFFLINE_TRAINING_CODE),
    retries=1,
    retry_delay_seconds=10,
    retry_condition_fn=transient,
    log_prints=False,
)
def offline_training_task(key: str, spec: TrainingSpec, runtime: Runtime) -> PolicyRef:
    """The offline objective on the logged turns, no generation, no sandbox (resumes from its
    last checkpoint)."""
    return training_stage(spec, runtime, logger=get_run_logger())


class Stages:
    """The stage tasks bound to the run's storage (results, cache records, --refresh)."""

    def __init__(self, params: TrainingParams, ready: Ready):
        st = open_storage(params.storage)
        self.params, self.ready = params, ready
        self.offline = params.training.mode == "offline"
        self.runtime = runtime_of(params, ready)
        self.tasks: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (
                ("bandit", bandit_task),
                ("offline-dataset", offline_dataset_task),
                ("training", training_task),
                ("offline-training", offline_training_task),
            )
        }

    def dataset(self) -> BanditRef:
        """The mode's training dataset: the bandit contexts, or the offline rows."""
        if self.offline:
            spec = offline_spec_of(self.ready)
            return self.tasks["offline-dataset"](spec.key, spec, self.runtime)
        return self.bandit()

    def bandit(self) -> BanditRef:
        spec = bandit_spec_of(self.params, self.ready)
        return self.tasks["bandit"](spec.key, spec, self.runtime)

    def training(self, dataset: BanditRef) -> PolicyRef:
        check_dataset(self.params, dataset)
        spec = training_spec(self.params, self.ready, dataset)
        name = "offline-training" if self.offline else "training"
        return self.tasks[name](spec.key, spec, self.runtime)


def report(params: TrainingParams, dataset: BanditRef, policy: PolicyRef) -> TrainingSummary:
    """Dataset stats, curves, step time and cost as Prefect artifacts; a line in the log."""
    summary = summarize(params, dataset, policy)
    stats = dataset.stats
    offline = params.training.mode == "offline"
    if offline:
        depth_rows = turn_rows(stats)
        create_table_artifact(
            key="offline-rows",
            table=depth_rows,
            description=f"Offline rows (logged turns) per turn: mean reward and mean |advantage| "
            f"({stats.get('problems')} problems, {stats.get('nonzero_advantage_rows')} rows "
            "with a nonzero advantage)",
        )
    else:
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
    cost = policy.stats.get("cost") or {}
    if offline:
        create_image_artifact(
            image_url=policy.plot,
            key="training-curves",
            description="Offline training: loss and weighted advantage per step (PNG)",
        )
    else:
        create_image_artifact(
            image_url=policy.plot, key="training-rewards", description="Reward per step (PNG)"
        )
    flat = {k: v for k, v in stats.items() if not isinstance(v, dict)}
    title = "Offline dataset" if offline else "Bandit dataset"
    per = "Rows per turn" if offline else "Contexts per turn depth"
    create_markdown_artifact(
        key="training-summary",
        markdown=(
            f"# Training\n\n{summary.line}\n\n## {title}\n\n{markdown_table([flat])}\n\n"
            f"{per}:\n\n{markdown_table(depth_rows)}\n\n"
            f"## Step time\n\n{markdown_table(time_rows) if time_rows else '-'}\n\n"
            f"## Cost\n\n{markdown_table([cost]) if cost else '-'}\n\n"
            f"Curves: [{policy.plot}]({policy.plot})\n"
        ),
    )
    get_run_logger().info(summary.line)
    return summary
