"""What the trajectory steps pass around: the content address of a step (`StageSpec`), how it
runs (`Runtime`, never part of a key), a slice of its problems (`Shard`, the unit a worker runs)
and the small refs of finished shards and steps."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cobalt.judging import SandboxRuntime
from cobalt.storage import StorageConfig, recipe_key
from cobalt.trajectories.batching import BatchConfig
from cobalt.trajectories.collect import CollectConfig
from cobalt.trajectories.problemsets import ProblemSource
from engines import EngineConfig
from sandbox import Limits

RECORDS = "records.jsonl"
FORMAT = "cobalt-jsonl/1"


class Runtime(BaseModel):
    """How stages run: never part of a cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig
    sandbox: SandboxRuntime
    batch: BatchConfig
    storage: StorageConfig
    llm_limit: str | None = None
    sandbox_limit: str | None = None
    work_dir: str
    checkpoint_s: float = 60
    refresh: bool = False


class StageSpec(BaseModel):
    """What determines a stage's content (its cache key and storage key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Literal["initial", "multiturn", "evaluation"]
    key: str
    problems: ProblemSource
    collect: CollectConfig
    limits: Limits
    engine: dict[str, Any] = Field(description="What of the engine decides its output.")
    upstream: TrajectoryRef | None = None


class TrajectoryRef(BaseModel):
    """A finished stage: what tasks pass on (small)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    key: str
    uri: str = Field(description="The stage directory (MANIFEST.json, records.jsonl).")
    rows: int
    fingerprint: str = Field(description="sha256 of records.jsonl.")
    stats: dict[str, Any] = Field(default_factory=dict)

    @property
    def records_uri(self) -> str:
        return f"{self.uri}/{RECORDS}"


StageSpec.model_rebuild()


class Shard(BaseModel):
    """Problems [start, stop) of a step: one task, on this machine or a cluster's worker. Its
    records are the same whatever the shard size (generation is seeded per chunk, and shard
    bounds fall on chunk bounds), so a sharded step equals an unsharded one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: StageSpec
    index: int = Field(ge=0)
    start: int = Field(ge=0)
    stop: int = Field(ge=0)

    @property
    def key(self) -> str:
        return recipe_key(step=self.spec.key, start=self.start, stop=self.stop)

    @property
    def name(self) -> str:
        return f"{self.spec.stage}-{self.spec.key}-{self.index:03d}"


class ShardRef(BaseModel):
    """A finished shard."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    index: int
    uri: str = Field(description="The shard directory (MANIFEST.json, records.jsonl).")
    rows: int
    fingerprint: str = Field(description="sha256 of the shard's records.jsonl.")
    stats: dict[str, Any] = Field(default_factory=dict)

    @property
    def records_uri(self) -> str:
        return f"{self.uri}/{RECORDS}"
