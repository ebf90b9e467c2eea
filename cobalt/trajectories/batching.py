"""How the trajectory and evaluation steps batch their work, shared by both: `BatchConfig` (problems
a chunk, lanes, problems a shard), their loop over chunks (`chunks`, `progress_bar`), where the time
went (`Stats`) and the gate a generate call passes (`Gate`). `per_call`: how many problems a
`generate` call covers: `BatchConfig.chunk_size` per copy of the model (`Engine.replicas`: vLLM on
N GPUs takes N chunks' worth of conversations a call), so each GPU has as much to do as one GPU
alone. Records do not depend on the chunks (each conversation is seeded on its own,
docs/ENGINES.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engines import Engine

if TYPE_CHECKING:
    from cobalt.trajectories.records import Turn


class BatchConfig(BaseModel):
    """How work is batched (does not change results beyond the engines' seeding)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_size: int = Field(
        16,
        ge=1,
        le=100_000,
        description="Problems processed together; their records land when the chunk is done.",
    )
    lanes: int = Field(
        2,
        ge=1,
        le=64,
        description="A chunk's problems are split into lanes "
        "that take turns on the engine: one lane's programs are judged while "
        "another generates (1: no overlap). Each generate call covers every live "
        "conversation of one lane.",
    )
    shard_size: int | None = Field(
        None,
        ge=1,
        description="Problems per shard: the unit of work a task (on this machine or a cluster "
        "worker) runs and commits; a multiple of chunk_size, so the records do not depend on "
        "it. Default: 16 chunks.",
    )

    @model_validator(mode="after")
    def _whole_chunks(self) -> BatchConfig:
        if self.shard_size is not None and self.shard_size % self.chunk_size:
            whole = self.chunk_size * max(1, round(self.shard_size / self.chunk_size))
            raise ValueError(
                f"batch.shard_size ({self.shard_size}) must be a multiple of batch.chunk_size "
                f"({self.chunk_size}): e.g. {whole}"
            )
        return self

    @property
    def problems_per_shard(self) -> int:
        return self.shard_size or 16 * self.chunk_size


@dataclass
class Stats:
    """Where the time went (the benchmark and the flow's log read it)."""

    problems: int = 0
    skipped: int = 0  # already in the file
    completions: int = 0
    programs_judged: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    generate_s: float = 0.0
    sandbox_s: float = 0.0  # blocked waiting on the sandbox
    sandbox_busy_s: float = 0.0  # judging, overlapped with generation or not
    wall_s: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, turn: Turn) -> None:
        self.completions += 1
        self.prompt_tokens += turn.usage.prompt_tokens
        self.completion_tokens += turn.usage.completion_tokens
        self.cost_usd += turn.usage.cost_usd
        self.outcomes[turn.outcome] = self.outcomes.get(turn.outcome, 0) + 1

    def merge(self, other: Stats) -> Stats:
        for name in (
            "problems",
            "skipped",
            "completions",
            "programs_judged",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "generate_s",
            "sandbox_s",
            "sandbox_busy_s",
            "wall_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for key, value in other.outcomes.items():
            self.outcomes[key] = self.outcomes.get(key, 0) + value
        return self

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


Gate = Callable[[], AbstractContextManager[Any]]  # e.g. a Prefect global concurrency slot


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """`items` in consecutive slices of `size` (the last one shorter)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar over `total` problems, or a context that shows nothing."""
    if not enabled:
        return nullcontext(None)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return nullcontext(None)
    return tqdm(total=total, desc=desc, unit="problem")


def per_call(batch: BatchConfig, engine: Engine) -> BatchConfig:
    """`batch` with `chunk_size` times the engine's copies of the model."""
    if engine.replicas == 1:
        return batch
    return batch.model_copy(update={"chunk_size": batch.chunk_size * engine.replicas})
