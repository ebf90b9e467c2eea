"""How many problems a `generate` call of the trajectory stage covers: `BatchConfig.chunk_size`
per copy of the model (`Engine.replicas`: vLLM on N GPUs takes N chunks' worth of
conversations a call), so each GPU has as much to do as one GPU alone. Records do not depend on
the chunks (each conversation is seeded on its own, docs/ENGINES.md). Imports nothing heavier
than the collection itself (the benchmarks use it on GPU machines without the storage layer)."""

from __future__ import annotations

from cobalt.trajectories.collect import BatchConfig
from engines import Engine


def per_call(batch: BatchConfig, engine: Engine) -> BatchConfig:
    """`batch` with `chunk_size` times the engine's copies of the model."""
    if engine.replicas == 1:
        return batch
    return batch.model_copy(update={"chunk_size": batch.chunk_size * engine.replicas})
