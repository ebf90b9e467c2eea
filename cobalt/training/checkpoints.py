"""Checkpoints: the newest complete one in a trainer's output directory (what every trainer
resumes from), and checkpoints in storage: each one uploaded as the trainer saves it (COMPLETE
marks a finished upload), and the newest complete one downloaded by a resumed run on another
machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cobalt.storage import Logger, Storage


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
