"""How a trajectory step is cut into shards, how one shard is written to storage, and how the
shards become the step's one JSONL.

Layout, under `<storage>/trajectories/<stage>/<step key>/`:

    shards/<index>-<shard key>/records.jsonl   one shard's records (appended and fsynced per
                                               problem)
    shards/<index>-<shard key>/MANIFEST.json   written last: the shard is finished
    records.jsonl, MANIFEST.json   the step: shards concatenated in order (MANIFEST last)

A shard runs anywhere its storage is reachable: a killed shard resumes from the records it had
written (local storage: the file itself; S3: the copy uploaded every `checkpoint_s`), so a task
retried on another worker loses nothing and writes no record twice.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cobalt.problems import Problem
from cobalt.storage import (
    MANIFEST,
    Logger,
    Spool,
    Storage,
    content_hash,
    from_manifest,
    open_storage,
)
from cobalt.trajectories.problemsets import load_problems
from cobalt.trajectories.specs import (
    FORMAT,
    RECORDS,
    Runtime,
    Shard,
    ShardRef,
    StageSpec,
    TrajectoryRef,
)

log = logging.getLogger(__name__)


def shards_of(spec: StageSpec, runtime: Runtime) -> list[Shard]:
    """The step's problems cut into `runtime.batch.shard_size` slices (a multiple of the chunk
    size, so chunks, and with them the records, do not depend on the cut)."""
    size, count = runtime.batch.problems_per_shard, spec.problems.count
    return [
        Shard(spec=spec, index=i, start=start, stop=min(start + size, count))
        for i, start in enumerate(range(0, count, size))
    ] or [Shard(spec=spec, index=0, start=0, stop=0)]


def shard_problems(shard: Shard, runtime: Runtime) -> list[Problem]:
    return load_problems(shard.spec.problems, runtime.storage)[shard.start : shard.stop]


def step_dir(st: Storage, spec: StageSpec) -> str:
    return st.path("trajectories", spec.stage, spec.key)


def run_shard(
    shard: Shard,
    runtime: Runtime,
    body: Callable[[Path, Logger], dict[str, Any]],
    logger: Logger = log,
) -> ShardRef:
    """Run `body(local_jsonl, logger)` for one shard and commit the shard's manifest.

    Local storage: the JSONL is written in place. S3: in `work_dir` (resumed from the uploaded
    copy when the local one is missing), uploaded every `checkpoint_s` and at the end. A shard
    whose manifest exists is finished: returned as is (unless refresh).
    """
    st = open_storage(runtime.storage)
    # the key (its problem range) in the name: a rerun with another shard size never takes a
    # finished shard of other problems for its own
    directory = f"{step_dir(st, shard.spec)}/shards/{shard.index:04d}-{shard.key}"
    spool_dir = Path(runtime.work_dir, "spool", shard.spec.stage, shard.key)
    spool = Spool(
        st, directory, RECORDS, spool_dir, refresh=runtime.refresh, name=shard.name, logger=logger
    )
    if spool.finished is not None:
        return from_manifest(spool.finished, ShardRef)
    stop = threading.Event()
    uploader = None
    if not spool.is_local:

        def upload_periodically() -> None:
            while not stop.wait(runtime.checkpoint_s):
                spool.upload()

        uploader = threading.Thread(target=upload_periodically, daemon=True)
        uploader.start()
    try:
        stats = body(spool.local, logger)
    finally:
        stop.set()
        if uploader is not None:
            uploader.join()
    data = spool.close()
    ref = ShardRef(
        key=shard.key,
        index=shard.index,
        uri=st.protocol + directory,
        rows=data.count(b"\n"),
        fingerprint=content_hash(data),
        stats=stats,
    )
    st.commit(spool.manifest, ref, shard, format=FORMAT)
    logger.info(
        "%s: %d records (%s)",
        shard.name,
        ref.rows,
        ", ".join(f"{k} {v}" for k, v in stats.items() if k != "outcomes"),
    )
    return ref


def merge_shards(
    spec: StageSpec, shards: Sequence[ShardRef], runtime: Runtime, *, logger: Logger = log
) -> TrajectoryRef:
    """The step's records.jsonl: its shards in order (a problem found twice is kept once), and
    its manifest with the shards' stats added up."""
    st = open_storage(runtime.storage)
    directory = step_dir(st, spec)
    manifest_path = f"{directory}/{MANIFEST}"
    if not runtime.refresh and st.fs.exists(manifest_path):
        return from_manifest(st.read_json(manifest_path), TrajectoryRef)
    seen: set[str] = set()
    lines: list[bytes] = []
    for ref in sorted(shards, key=lambda r: r.index):
        with st.fs.open(ref.records_uri.removeprefix("s3://"), "rb") as f:
            data = f.read()
        for line in data.splitlines():
            problem_id = json.loads(line)["problem_id"] if line.strip() else None
            if problem_id is not None and problem_id not in seen:
                seen.add(problem_id)
                lines.append(line + b"\n")
    data = b"".join(lines)
    st.write_atomic(f"{directory}/{RECORDS}", data)
    ref = TrajectoryRef(
        stage=spec.stage,
        key=spec.key,
        uri=st.protocol + directory,
        rows=len(lines),
        fingerprint=content_hash(data),
        stats={**add_stats([r.stats for r in shards]), "shards": len(shards)},
    )
    st.commit(manifest_path, ref, spec, format=FORMAT)
    logger.info("%s: %d records from %d shards at %s", spec.stage, ref.rows, len(shards), ref.uri)
    return ref


def add_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Numbers summed (seconds are summed work, not wall time), counts per outcome summed."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                bucket = total.setdefault(key, {})
                for k, v in value.items():
                    bucket[k] = bucket.get(k, 0) + v
            elif isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = round(total.get(key, 0) + value, 3)
    return total
