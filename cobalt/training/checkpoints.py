"""Checkpoints in storage: each one uploaded as the trainer saves it (COMPLETE marks a finished
upload), and the newest complete one downloaded by a resumed run on another machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cobalt.storage import Logger, Storage
from cobalt.training.grpo import last_checkpoint


def uploader(st: Storage, local: Path, directory: str) -> Any:
    """A TrainerCallback that uploads each saved checkpoint to `directory` in storage (from the
    main process only, when training runs on several)."""
    from transformers import TrainerCallback

    class Uploader(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            name = f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and (local / name).is_dir():
                st.fs.put(str(local / name), f"{directory}/{name}", recursive=True)
                st.write_atomic(f"{directory}/{name}/COMPLETE", b"")

    return Uploader()


def download_last_checkpoint(st: Storage, directory: str, local: Path, logger: Logger) -> None:
    """The newest complete checkpoint of `directory` into `local`, unless `local` has one."""
    if last_checkpoint(local) is not None or not st.fs.exists(directory):
        return
    names = [
        p.rstrip("/").rsplit("/", 1)[-1]
        for p in st.fs.ls(directory, detail=False)
        if p.rstrip("/").rsplit("/", 1)[-1].startswith("checkpoint-")
        and st.fs.exists(f"{p.rstrip('/')}/COMPLETE")
    ]
    if not names:
        return
    name = max(names, key=lambda n: int(n.split("-")[-1]))
    local.mkdir(parents=True, exist_ok=True)
    st.fs.get(f"{directory}/{name}", str(local / name), recursive=True)
    logger.info("training: downloaded %s from %s", name, st.url())
