"""How a flow runs, beside what it computes: the settings every flow's parameters share, declared
once here. They never enter a stage's key (they do not change results), and a flow that runs
another (the pipeline runs all of them, the reward-hacking flow the trajectories flow) passes
its own on as they are (`passed_to`). Each flow takes the level it uses:

    RunSettings            sandbox, storage, refresh                   DataParams
    ModelRunSettings       + work_dir                                  TrainingParams
    ShardedRunSettings     + cluster                                   PipelineParams
    InferenceRunSettings   + limits, llm_limit, sandbox_limit          TrajectoryParams,
                                                                       HackingParams
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cobalt.judging import SandboxRuntime
from cobalt.storage import StorageConfig, default_work_dir
from sandbox import Limits


class RunSettings(BaseModel):
    """Every flow: how programs are judged, where results go, whether finished stages count."""

    model_config = ConfigDict(extra="forbid")

    sandbox: SandboxRuntime = Field(default_factory=SandboxRuntime)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    refresh: bool = Field(False, description="Recompute every stage, ignoring finished ones.")

    def passed_to(self, params: type[BaseModel]) -> dict[str, Any]:
        """This run's settings that the flow parameters `params` take, as they are (a chained
        flow runs as its caller does)."""
        return {
            name: getattr(self, name)
            for name in type(self).model_fields
            if name in RUN_FIELDS and name in params.model_fields
        }


class ModelRunSettings(RunSettings):
    """A flow that loads models: where their local copies go."""

    work_dir: str = Field(
        default_factory=default_work_dir,
        description="Local directory for what a run keeps on this machine when storage is S3: "
        "models (fitted, tiny, downloaded), the JSONL being written, checkpoints (default: env "
        "COBALT_WORK_DIR, else ~/.cache/cobalt).",
    )


class ShardedRunSettings(ModelRunSettings):
    """A flow whose shards (trajectories, evaluation, the judge) may run on a Dask cluster."""

    cluster: str | None = Field(
        None,
        description="Run the shards as Prefect tasks on a Dask cluster (prefect-dask): a "
        "scheduler address (tcp://host:8786), or 'local:N' for N worker processes on this "
        "machine. Each worker loads its own engine and opens its own sandbox pool "
        "(docs/SCALING.md). None: the shards run one after another in the flow's process.",
    )

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str | None) -> str | None:
        if value is None or "://" in value or value.rpartition(":")[2].isdigit():
            if value and value.startswith("local:") and int(value[6:]) < 1:
                raise ValueError("cluster 'local:N' needs N >= 1 worker")
            return value
        raise ValueError(
            f"cluster {value!r}: give a Dask scheduler address (tcp://host:8786) or 'local:N'"
        )


class InferenceRunSettings(ShardedRunSettings):
    """A flow that generates and judges: per-test limits, and the Prefect concurrency limits that
    flow runs sharing an endpoint or a sandbox host take."""

    limits: Limits = Field(default_factory=Limits, description="Per-test sandbox limits.")
    llm_limit: str | None = Field(
        None,
        description="Name of a Prefect global concurrency limit that flow runs sharing an "
        "LLM endpoint take one slot of while they generate (requests in flight per run: "
        "engine.concurrency).",
    )
    sandbox_limit: str | None = Field(
        None,
        description="Name of a Prefect global concurrency limit taken while judging "
        "(flow runs sharing a sandbox host).",
    )


RUN_FIELDS = frozenset(InferenceRunSettings.model_fields)
