"""Checkpoints: the newest complete one in a trainer's output directory (what every trainer
resumes from), and checkpoints in storage: each one uploaded as the trainer saves it (COMPLETE
marks a finished upload), and the newest complete one downloaded by a resumed run on another
machine.

Uploads run off the training's critical path: the main process snapshots a saved checkpoint
(hard links, no copy: the trainer may delete the checkpoint when a later one replaces it) and
uploads it on a thread of its own while training goes on; the other processes never wait for it
in their next collective (an 8B full fine-tuning checkpoint is 131 GB). The end of training waits
for the uploads still running and raises the first one that failed.

On several nodes each node writes its own processes' part of a checkpoint (their shards, their
random states; node 0 also the trainer's state), so each node's first process uploads its part
into the same directory and marks it `COMPLETE-node<R>`; a checkpoint is complete when every
node's part is, and a resumed run (on the same nodes, or after one was replaced) downloads all
of it on every node. A local directory every node mounts (storage.shared) is written in place by
every node's processes, once `shared_directory_check` has seen each node's file in it."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cobalt.storage import Logger, Storage, StorageError


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete `checkpoint-N` directory in `output_dir` (what a killed run resumes
    from). The trainer writes a checkpoint's `trainer_state.json` after its weights, optimizer
    and RNG states, and only then deletes older ones: a process killed while saving leaves a
    newer directory without it, which is skipped (transformers' own `get_last_checkpoint`
    would pick it and the resumed run would fail)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    complete = [
        p
        for p in folder.glob("checkpoint-*")
        if p.name.removeprefix("checkpoint-").isdigit() and (p / "trainer_state.json").is_file()
    ]
    if not complete:
        return None
    return str(max(complete, key=lambda p: int(p.name.removeprefix("checkpoint-"))))


UPLOADS = ".uploads"  # in the output directory: snapshots of checkpoints being uploaded


def complete_markers(nodes: int) -> list[str]:
    """The files that mark a checkpoint's upload complete: one per node (one node: COMPLETE)."""
    return ["COMPLETE"] if nodes == 1 else [f"COMPLETE-node{r}" for r in range(nodes)]


def uploader(st: Storage, local: Path, directory: str, node_rank: int = 0, nodes: int = 1) -> Any:
    """A TrainerCallback that uploads each saved checkpoint to `directory` in storage, from each
    node's first process (the main process on one node), in the background (the module
    docstring); `on_train_end` waits for them."""
    marker = complete_markers(nodes)[node_rank]
    # each node's snapshots apart: nodes whose output directories are one (a shared mount, or
    # one host standing in for several) must not remove each other's while they upload
    uploads = local / UPLOADS / f"node{node_rank}"
    from transformers import TrainerCallback

    class Uploader(TrainerCallback):
        def __init__(self) -> None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-upload")
            self.pending: list[Future] = []

        def on_save(self, args, state, control, **kwargs):
            name = f"checkpoint-{state.global_step}"
            if state.is_local_process_zero and (local / name).is_dir():
                snapshot = _snapshot(local / name, uploads / name)
                self.pending.append(self.pool.submit(self._upload, snapshot, name))

        def _upload(self, snapshot: Path, name: str) -> None:
            # the snapshot's contents into the directory, which another node may have made
            st.fs.put(f"{snapshot}/", f"{directory}/{name}/", recursive=True)
            st.write_atomic(f"{directory}/{name}/{marker}", b"")
            shutil.rmtree(snapshot, ignore_errors=True)

        def on_train_end(self, args, state, control, **kwargs):
            self.wait()

        def wait(self) -> None:
            """Every upload finished; the first failure raised."""
            pending, self.pending = self.pending, []
            errors = [f.exception() for f in pending]
            shutil.rmtree(uploads, ignore_errors=True)
            if local.joinpath(UPLOADS).is_dir() and not any(local.joinpath(UPLOADS).iterdir()):
                local.joinpath(UPLOADS).rmdir()
            failed = next((e for e in errors if e is not None), None)
            if failed is not None:
                raise RuntimeError(
                    f"a checkpoint upload to {directory} failed: {failed}"
                ) from failed

    return Uploader()


SHARED_WAIT_S = 90  # NFS caches a directory's entries for up to 60 s (acdirmax)


def shared_directory_check(output: Path, node_rank: int, nodes: int, wait_s: float) -> Any:
    """A TrainerCallback that, before the first step, proves every node sees one `output`
    directory (storage.shared): each node's first process writes a file named for its node in
    a probe directory of this run, then every process waits up to `wait_s` for all of them.
    Every process reaches the same verdict (a collective), so a directory that is not shared
    stops the job on every node with StorageError naming what each node saw, rather than
    checkpoints landing on each node's own disk."""
    from transformers import TrainerCallback

    class SharedDirectoryCheck(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            import time
            import uuid

            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            token = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(token, src=0)
            probe = output / ".nodes" / str(token[0])
            if state.is_local_process_zero:
                probe.mkdir(parents=True, exist_ok=True)
                (probe / f"node{node_rank}").touch()
            dist.barrier()
            deadline = time.monotonic() + wait_s
            while (seen := _nodes_seen(probe, nodes)) != list(range(nodes)):
                if time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            views: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(views, (node_rank, seen))
            dist.barrier()
            if dist.get_rank() == 0:
                shutil.rmtree(probe, ignore_errors=True)
            blind = sorted({(r, tuple(v)) for r, v in views if list(v) != list(range(nodes))})
            if blind:
                what = "; ".join(f"node {r} sees the files of nodes {list(v)}" for r, v in blind)
                raise StorageError(
                    f"storage.shared: {output} is not one directory for all {nodes} nodes "
                    f"({what} only): use a directory every node mounts (NFS, Lustre) or "
                    "--storage s3://bucket/prefix"
                )

    return SharedDirectoryCheck()


def _nodes_seen(probe: Path, nodes: int) -> list[int]:
    """The node ranks whose probe files this process sees."""
    return [r for r in range(nodes) if (probe / f"node{r}").exists()]


def _snapshot(source: Path, target: Path) -> Path:
    """`source`'s files hard-linked under `target` (copied where links are refused)."""
    shutil.rmtree(target, ignore_errors=True)
    for path in sorted(source.rglob("*")):
        there = target / path.relative_to(source)
        if path.is_dir():
            there.mkdir(parents=True, exist_ok=True)
            continue
        there.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, there)
        except OSError:
            shutil.copy2(path, there)
    return target


def download_last_checkpoint(
    st: Storage, directory: str, local: Path, logger: Logger, nodes: int = 1
) -> None:
    """The newest complete checkpoint of `directory` (every node's part uploaded) into `local`,
    unless `local` has one."""
    if last_checkpoint(local) is not None or not st.fs.exists(directory):
        return
    markers = complete_markers(nodes)
    names = [
        p.rstrip("/").rsplit("/", 1)[-1]
        for p in st.fs.ls(directory, detail=False)
        if p.rstrip("/").rsplit("/", 1)[-1].startswith("checkpoint-")
        and all(st.fs.exists(f"{p.rstrip('/')}/{m}") for m in markers)
    ]
    if not names:
        return
    name = max(names, key=lambda n: int(n.split("-")[-1]))
    local.mkdir(parents=True, exist_ok=True)
    st.fs.get(f"{directory}/{name}", str(local / name), recursive=True)
    logger.info("training: downloaded %s from %s", name, st.url())
