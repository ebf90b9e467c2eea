"""Shards of a trajectory step in storage: a finished shard is reused only for its own problems."""

from __future__ import annotations

from pathlib import Path

from cobalt.judging import SandboxRuntime
from cobalt.storage import StorageConfig
from cobalt.trajectories.collect import BatchConfig, CollectConfig
from cobalt.trajectories.problemsets import ProblemSource
from cobalt.trajectories.shards import run_shard, shards_of
from cobalt.trajectories.specs import Runtime, StageSpec
from engines import EngineConfig
from sandbox import Limits


def setup(tmp_path: Path, shard_size: int) -> tuple[StageSpec, Runtime]:
    source = ProblemSource(kind="file", uri="x", count=8, fingerprint="f", instructions="i")
    spec = StageSpec(
        stage="initial",
        key="step",
        problems=source,
        collect=CollectConfig(),
        limits=Limits(),
        engine={},
    )
    runtime = Runtime(
        engine=EngineConfig(kind="transformers", model="m"),
        sandbox=SandboxRuntime(concurrency=1),
        batch=BatchConfig(chunk_size=2, shard_size=shard_size),
        storage=StorageConfig(url=str(tmp_path / "runs")),
        work_dir=str(tmp_path / "work"),
    )
    return spec, runtime


def test_a_rerun_with_another_shard_size_reruns_shards_of_other_problems(tmp_path: Path) -> None:
    ran: list[tuple[int, int]] = []

    def body_for(shard):
        def body(local: Path, logger) -> dict:
            ran.append((shard.start, shard.stop))
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text("".join(f'{{"p": {i}}}\n' for i in range(shard.start, shard.stop)))
            return {"problems": shard.stop - shard.start}

        return body

    spec, small = setup(tmp_path, shard_size=2)
    first = shards_of(spec, small)[0]
    assert (first.start, first.stop) == (0, 2)
    run_shard(first, small, body_for(first))
    # the same shard again: finished, not run
    again = run_shard(first, small, body_for(first))
    assert ran == [(0, 2)] and again.rows == 2
    # shard 0 of a larger size holds problems 0-3: the finished 0-1 shard is not it
    spec, large = setup(tmp_path, shard_size=4)
    wider = shards_of(spec, large)[0]
    assert (wider.index, wider.start, wider.stop) == (0, 0, 4)
    ref = run_shard(wider, large, body_for(wider))
    assert ran == [(0, 2), (0, 4)] and ref.rows == 4
