"""S3 storage for training: each saved checkpoint is uploaded (marked COMPLETE last) in the
background, surviving the trainer's deletion of it, and a run resumed on another machine downloads
the newest complete one (moto's S3 server)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cobalt.storage import StorageConfig, open_storage
from cobalt.training.machinery.checkpoints import download_last_checkpoint, uploader


def test_checkpoints_go_to_s3_and_come_back(tmp_path, s3_endpoint, s3_bucket):
    st = open_storage(StorageConfig(url=f"s3://{s3_bucket}/runs", endpoint_url=s3_endpoint))
    directory = st.path("training", "k1")
    local = tmp_path / "machine-a"
    for step in (2, 4):
        ckpt = local / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        (ckpt / "model.safetensors").write_bytes(b"w" * step)
        main = SimpleNamespace(global_step=step, is_local_process_zero=True)
        other = SimpleNamespace(global_step=step, is_local_process_zero=False)
        callback = uploader(st, local, directory)
        callback.on_save(None, other, None)  # only a node's first process uploads
        callback.on_train_end(None, other, None)
        assert not st.fs.exists(f"{directory}/checkpoint-{step}")
        callback.on_save(None, main, None)
        callback.on_train_end(None, main, None)
    # an upload cut short (no COMPLETE marker) is never resumed from
    st.fs.pipe_file(f"{directory}/checkpoint-6/trainer_state.json", b"{}")

    elsewhere = tmp_path / "machine-b"
    download_last_checkpoint(st, directory, elsewhere, logging.getLogger("test"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["checkpoint-4"]
    assert (elsewhere / "checkpoint-4" / "model.safetensors").read_bytes() == b"wwww"

    # a machine that has its own checkpoint keeps it
    download_last_checkpoint(st, directory, local, logging.getLogger("test"))
    assert sorted(p.name for p in local.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def saved_checkpoint(local: Path, step: int) -> Path:
    """A checkpoint as the trainer leaves it: its state and 1,000 bytes of weights."""
    ckpt = local / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"w" * 1000)
    return ckpt


def test_an_upload_runs_beside_training_and_outlives_the_checkpoints_deletion(
    tmp_path, monkeypatch
) -> None:
    """on_save returns at once while a slow upload goes on; the trainer deleting the checkpoint
    (save_total_limit) does not cut the upload short; the end of training waits for it."""
    st = open_storage(StorageConfig(url=str(tmp_path / "store")))
    local = tmp_path / "out"
    ckpt = saved_checkpoint(local, 3)
    release = threading.Event()
    put = st.fs.put

    def slow_put(*args, **kwargs):
        release.wait(30)
        return put(*args, **kwargs)

    monkeypatch.setattr(st.fs, "put", slow_put)  # fsspec shares the instance: restored after
    callback = uploader(st, local, st.path("training", "k"))
    started = time.perf_counter()
    callback.on_save(None, SimpleNamespace(global_step=3, is_local_process_zero=True), None)
    assert time.perf_counter() - started < 1.0  # training goes on
    shutil.rmtree(ckpt)  # rotated away by the trainer
    release.set()
    callback.on_train_end(None, None, None)
    uploaded = st.path("training", "k", "checkpoint-3")
    assert st.fs.cat_file(f"{uploaded}/model.safetensors") == b"w" * 1000
    assert st.fs.exists(f"{uploaded}/COMPLETE") and not (local / ".uploads").exists()


def test_a_failed_upload_fails_the_end_of_training(tmp_path, monkeypatch) -> None:
    st = open_storage(StorageConfig(url=str(tmp_path / "store")))
    (tmp_path / "out" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-1" / "trainer_state.json").write_text("{}")

    def refused(*args, **kwargs):
        raise PermissionError("AccessDenied")

    monkeypatch.setattr(st.fs, "put", refused)
    callback = uploader(st, tmp_path / "out", "bucket/training/k")
    callback.on_save(None, SimpleNamespace(global_step=1, is_local_process_zero=True), None)
    with pytest.raises(RuntimeError, match="checkpoint upload to bucket/training/k failed: Access"):
        callback.on_train_end(None, None, None)


def test_two_nodes_sharing_one_output_directory_upload_apart(tmp_path, monkeypatch) -> None:
    """Two nodes whose output directories are one (one host standing in for two, or a shared
    mount) snapshot and upload the same checkpoint at once: one node's finished upload must not
    remove the other's snapshot (it did: the pipeline's two-node deployment test failed in CI
    with the other node's files gone mid-upload)."""
    st = open_storage(StorageConfig(url=str(tmp_path / "store")))
    local = tmp_path / "out"
    saved_checkpoint(local, 2)
    release = threading.Event()
    put = st.fs.put

    def node_1_slowly(source, *args, **kwargs):
        if "node1" in str(source):
            release.wait(30)
        return put(source, *args, **kwargs)

    monkeypatch.setattr(st.fs, "put", node_1_slowly)
    directory = st.path("training", "k")
    nodes = [uploader(st, local, directory, node_rank=rank, nodes=2) for rank in (0, 1)]
    for callback in nodes:
        callback.on_save(None, SimpleNamespace(global_step=2, is_local_process_zero=True), None)
    nodes[0].on_train_end(None, None, None)  # node 0 done first: its snapshots removed
    release.set()
    nodes[1].on_train_end(None, None, None)  # node 1's upload still had its files
    for rank in (0, 1):
        assert st.fs.exists(f"{directory}/checkpoint-2/COMPLETE-node{rank}")
    assert st.fs.cat_file(f"{directory}/checkpoint-2/model.safetensors") == b"w" * 1000
    assert not (local / ".uploads").exists()


def test_a_checkpoint_of_two_nodes_is_complete_when_both_parts_are(tmp_path) -> None:
    """Each node uploads its processes' part (node 0 also the trainer's state) into one
    checkpoint directory; a resume takes only a checkpoint whose parts are all there, and gets
    all of them."""
    st = open_storage(StorageConfig(url=str(tmp_path / "store")))
    directory = st.path("training", "k")
    for node in (0, 1):
        local = tmp_path / f"node{node}"
        for step in (2, 4):
            ckpt = local / f"checkpoint-{step}"
            ckpt.mkdir(parents=True)
            (ckpt / f"rng_state_{node}.pth").write_bytes(b"r")
            if node == 0:
                (ckpt / "trainer_state.json").write_text("{}")
        callback = uploader(st, local, directory, node_rank=node, nodes=2)
        for step in (2, 4) if node == 0 else (2,):  # node 1's step-4 part never arrived
            callback.on_save(None, SimpleNamespace(global_step=step, is_local_process_zero=True),
                             None)  # fmt: skip
        callback.on_train_end(None, None, None)
    fresh = tmp_path / "replacement"
    download_last_checkpoint(st, directory, fresh, logging.getLogger("test"), nodes=2)
    assert sorted(p.name for p in (fresh / "checkpoint-2").iterdir()) == [
        "COMPLETE-node0", "COMPLETE-node1", "rng_state_0.pth", "rng_state_1.pth",
        "trainer_state.json",
    ]  # fmt: skip
    assert not (fresh / "checkpoint-4").exists()
