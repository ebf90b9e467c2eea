"""S3 storage for training: each saved checkpoint is uploaded (marked COMPLETE last) and a run
resumed on another machine downloads the newest complete one (moto's S3 server)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from cobalt.storage import StorageConfig, open_storage
from cobalt.training.checkpoints import download_last_checkpoint, uploader


def test_checkpoints_go_to_s3_and_come_back(tmp_path, s3_endpoint, s3_bucket):
    st = open_storage(StorageConfig(url=f"s3://{s3_bucket}/runs", endpoint_url=s3_endpoint))
    directory = st.path("training", "k1")
    local = tmp_path / "machine-a"
    for step in (2, 4):
        ckpt = local / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        (ckpt / "model.safetensors").write_bytes(b"w" * step)
        main = SimpleNamespace(global_step=step, is_world_process_zero=True)
        other = SimpleNamespace(global_step=step, is_world_process_zero=False)
        uploader(st, local, directory).on_save(None, other, None)  # only the main process uploads
        assert not st.fs.exists(f"{directory}/checkpoint-{step}")
        uploader(st, local, directory).on_save(None, main, None)
    # an upload cut short (no COMPLETE marker) is never resumed from
    st.fs.pipe_file(f"{directory}/checkpoint-6/trainer_state.json", b"{}")

    elsewhere = tmp_path / "machine-b"
    download_last_checkpoint(st, directory, elsewhere, logging.getLogger("test"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["checkpoint-4"]
    assert (elsewhere / "checkpoint-4" / "model.safetensors").read_bytes() == b"wwww"

    # a machine that has its own checkpoint keeps it
    download_last_checkpoint(st, directory, local, logging.getLogger("test"))
    assert sorted(p.name for p in local.iterdir()) == ["checkpoint-2", "checkpoint-4"]
