"""The models the tests share, built once per machine and reused by every later session.

`fitted_model()` is the embedded default's reference (`cobalt.reference.fit_embedded`, the model
`make run` fits: ~4 minutes of CPU); `tiny_model()` the random tiny model (`engines.tiny`, seed
0). Each lives under `$COBALT_TEST_CACHE` (default `~/.cache/cobalt/tests`) in a folder named by
its key: the recipe, the source files that build it and the versions of the libraries that
compute it, so that a change to any of them builds a new one instead of testing a stale one. A
file lock makes parallel workers (pytest-xdist) and `make test`'s early build (run beside the
Docker install: `python tests/shared_models.py`) build each model once.

The tests only read these folders; a test that changes a model copies it first.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what builds the models besides their recipe: a change here is a new model
SOURCES = (
    "engines/tiny.py",
    "cobalt/reference.py",
    "cobalt/data/synthetic.py",
    "cobalt/trajectories/prompts.py",
    "cobalt/training/weights.py",
    "cobalt/training/precision.py",
)
LIBRARIES = ("torch", "transformers", "trl", "tokenizers", "datasets", "accelerate")


def cache_root() -> Path:
    return Path(os.environ.get("COBALT_TEST_CACHE") or Path.home() / ".cache/cobalt/tests")


def _key(recipe: object) -> str:
    blob = {
        "recipe": recipe,
        "sources": {s: hashlib.sha256((REPO / s).read_bytes()).hexdigest() for s in SOURCES},
        "libraries": {name: metadata.version(name) for name in LIBRARIES},
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _built(name: str, recipe: object, build) -> Path:
    """`build(path)` into the cache folder of (`name`, `recipe`) unless it is there; returns the
    model's directory. A build is complete when its `.done` marker exists."""
    from filelock import FileLock

    folder = cache_root() / f"{name}-{_key(recipe)}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model"
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".done").exists():
            started = time.monotonic()
            build(path)
            (folder / ".done").write_text(f"{time.monotonic() - started:.1f}\n")
    return path


def fitted_model() -> Path:
    """The embedded default's reference model, fitted with the pipeline's recipe."""
    from cobalt.reference import embedded_recipe_hash, fit_embedded

    return _built("fitted", embedded_recipe_hash(), fit_embedded)


def fitted_seconds() -> float:
    """How long the shared fitted model's fit took on the machine that made it."""
    return float((fitted_model().parent / ".done").read_text())


def tiny_model(seed: int = 0) -> Path:
    """The random tiny model of `seed` (engines.tiny.build_tiny_model's defaults)."""
    from engines.tiny import build_tiny_model

    return _built(f"tiny{seed}", {"seed": seed}, lambda path: build_tiny_model(path, seed=seed))


if __name__ == "__main__":
    # `make test` builds both while the Docker engine and the sandbox image install
    sys.path.insert(0, str(REPO))
    print(tiny_model(), flush=True)
    print(fitted_model(), flush=True)
