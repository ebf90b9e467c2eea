"""A Hugging Face Hub cache laid out as `huggingface_hub.snapshot_download` writes it, from local
model directories, so that Hub ids resolve offline (HF_HUB_OFFLINE=1) in tests and in
scripts/gpu/model_names.sh:

    models--org--name/blobs/<sha256>                     each file's content, once
    models--org--name/snapshots/<commit>/<file>          -> ../../blobs/<sha256> (a symlink)
    models--org--name/refs/<branch or tag>               the commit it points at
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def lay_out(cache: Path, repo: str, snapshots: dict[str, Path], refs: dict[str, str]) -> Path:
    """Put `snapshots` (commit -> a model directory) of `repo` into the Hub cache `cache`, and
    `refs` (name -> commit); returns the repo's folder."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    blobs = folder / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    for commit, source in snapshots.items():
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            data = path.read_bytes()
            blob = blobs / hashlib.sha256(data).hexdigest()
            if not blob.exists():
                blob.write_bytes(data)
            link = snapshot / path.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), link)
    for name, commit in refs.items():
        ref = folder / "refs" / name
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)  # no newline, as huggingface_hub writes it
    return folder
