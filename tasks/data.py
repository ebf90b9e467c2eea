"""Prefect layer of the data stage: each step of `cobalt.data.stages` as a cached task, bound to
the run's storage, and the report as artifacts."""

from __future__ import annotations

from datetime import timedelta

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from cobalt.data.cleaning import CleanRules
from cobalt.data.schemas import LoadConfig
from cobalt.data.source_spec import SourceSpec
from cobalt.data.splits import SplitConfig
from cobalt.data.stages import (
    CLEAN_CODE,
    LOAD_CODE,
    SETS_CODE,
    VERIFY_CODE,
    DataParams,
    DataSummary,
    clean_stage,
    drop_examples,
    load_stage,
    sets_stage,
    summarize,
    verify_stage,
)
from cobalt.data.verify import VerifyConfig
from cobalt.judging import SandboxRuntime
from cobalt.storage import DatasetRef, StorageConfig, open_storage
from cobalt.tables import markdown_table
from tasks.caching import bind, content_policy
from tasks.retry import transient


@task(
    name="load",
    task_run_name="load-{spec.name}",
    cache_policy=content_policy(*LOAD_CODE),
    retries=2,
    retry_delay_seconds=3,
    retry_condition_fn=transient,
)
def load_task(
    spec: SourceSpec, revision: str, config: LoadConfig, storage: StorageConfig
) -> DatasetRef:
    """Read one source and normalise its rows (IO: retried)."""
    return load_stage(spec, revision, config, storage)


@task(
    name="clean",
    task_run_name="clean-{ref.name}",
    cache_policy=content_policy(*CLEAN_CODE),
    retries=1,
    retry_delay_seconds=3,
    retry_condition_fn=transient,
)
def clean_task(ref: DatasetRef, rules: CleanRules, storage: StorageConfig) -> DatasetRef:
    """Apply the cleaning rules and cap the tests."""
    return clean_stage(ref, rules, storage)


@task(name="verify", task_run_name="verify-{ref.name}", cache_policy=content_policy(*VERIFY_CODE))
def verify_task(
    ref: DatasetRef, config: VerifyConfig, sandbox: SandboxRuntime, storage: StorageConfig
) -> DatasetRef:
    """Keep problems whose reference solutions pass in the sandbox."""
    return verify_stage(ref, config, sandbox, storage)


@task(
    name="sets",
    task_run_name="sets",
    cache_policy=content_policy(*SETS_CODE),
    retries=1,
    retry_delay_seconds=3,
    retry_condition_fn=transient,
)
def sets_task(
    pools: dict[str, list[DatasetRef]], config: SplitConfig, storage: StorageConfig
) -> DatasetRef:
    """Split into train/dev/test and add perturbed copies."""
    return sets_stage(pools, config, storage)


class Stages:
    """The stage tasks bound to a run's storage (results + cache records there, `--refresh`)."""

    def __init__(self, params: DataParams):
        st = open_storage(params.storage)
        self.params = params
        self.clean = bind(clean_task, st, params.refresh)
        self.verify = bind(verify_task, st, params.refresh)
        self.sets = bind(sets_task, st, params.refresh)
        self._load_local = bind(load_task, st, params.refresh)
        self._load_hub = bind(
            load_task, st, params.refresh, expires=timedelta(days=params.hub_cache_days)
        )

    def load(self, spec: SourceSpec, revision: str) -> DatasetRef:
        run = self._load_hub if spec.is_hub else self._load_local
        return run(spec, revision, self.params.load, self.params.storage)

    def prepare(self, spec: SourceSpec, revision: str) -> list[DatasetRef]:
        """load -> clean (unless a test set, kept as published) -> verify; every stage's ref."""
        p = self.params
        refs = [self.load(spec, revision)]
        verify = p.verify
        if spec.role != "test":
            refs.append(self.clean(refs[-1], p.rules, p.storage))
        else:  # test sets are kept as published (LiveCodeBench has no reference solutions)
            verify = verify.model_copy(update={"require_reference": False})
        refs.append(self.verify(refs[-1], verify, p.sandbox, p.storage))
        return refs


def report(params: DataParams, stage_refs: list[DatasetRef], sets: DatasetRef) -> DataSummary:
    """Counts table + summary line as Prefect artifacts and in the log; LATEST pointer updated."""
    summary = summarize(params, stage_refs, sets)
    create_table_artifact(
        table=summary.table,
        key="data-counts",
        description="Data stage: rows read, dropped by reason, kept per set",
    )
    create_markdown_artifact(
        key="data-summary",
        markdown=(
            f"# Data stage\n\n{summary.line}\n\n{markdown_table(summary.table)}\n\n"
            f"First example of each drop reason:\n\n{drop_examples(stage_refs) or '- none'}\n"
        ),
    )
    get_run_logger().info(summary.line)
    return summary
