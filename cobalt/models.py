"""How a model is named, and the local directory a name resolves to (docs/PIPELINE.md, "Naming a
model"). Every flow's `--model` takes one of:

    fitted | tiny            the embedded default's models (`cobalt.reference`'s fit on CPU; the
                             random `engines.tiny`), built once into the storage (work_dir on S3)
    DIR                      a local directory saved with save_pretrained (config.json)
    s3://bucket/prefix/...   a model directory in storage, such as the policy a training stage
                             saved (<storage>/training/<key>): downloaded once into work_dir/models
    org/name[@revision]      a Hugging Face Hub model at a branch, tag or commit (default main):
                             `huggingface_hub.snapshot_download` into its cache (HF_HOME), the
                             cache alone under HF_HUB_OFFLINE=1 or without a network

A flow resolves the name once, at its preflight (`resolve_model`), and its stages load that
directory; a cache key records `stable_name(directory)`: `org/name@<commit>` for a Hub snapshot
(the same on any machine, and itself a name `resolve_model` takes), else the path. A name that
resolves to nothing raises `ModelNameError`, one line naming the flag and the fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from cobalt.errors import UserError
from cobalt.storage import Logger, StorageConfig, open_storage

log = logging.getLogger(__name__)

FITTED = "fitted"
TINY = "tiny"
EMBEDDED = (FITTED, TINY)
TINY_SEED = 0
RECIPE_FILE = "fitted_recipe.json"  # in a directory the tiny fit made (cobalt.reference)
TINY_MARKER = "tiny_model.json"  # in a directory engines.tiny built
NAMES = (
    "a Hub id (org/name[@revision]), a local model directory, a model directory in storage "
    f"(s3://bucket/prefix/training/<key>, as a training run prints its policy), '{FITTED}' or "
    f"'{TINY}'"
)
# files of a Hub repo that no stage loads (other frameworks' weights, originals beside the
# transformers checkpoint): not downloaded
UNUSED_HUB_FILES = [
    "original/*",
    "*.pth",
    "*.gguf",
    "*.onnx",
    "onnx/*",
    "openvino/*",
    "*.msgpack",
    "*.h5",
    "*.ot",
]


class ModelNameError(UserError, ValueError):
    """A model name that resolves to nothing here; the message names the flag and the fix."""


# how the 'fitted' model is fitted into a directory (with `fit_steps`, None: its default):
# `cobalt.reference`'s fit, which trains with cobalt.training, above the stages that resolve names
# here; the package wires it in (cobalt/__init__.py), so this module imports nothing above it
FitEmbedded = Callable[[Path, int | None], Path]
_fit_embedded: FitEmbedded


def fit_embedded_with(fit: FitEmbedded) -> None:
    """Name the function that fits the 'fitted' model (the package does: cobalt/__init__.py)."""
    global _fit_embedded
    _fit_embedded = fit


def weights_digest(path: str | Path) -> str:
    """The first 16 hex digits of the sha256 of the saved weights in `path` (model*.safetensors,
    in name order): which build a directory holds. For a one-file model, `sha256sum`'s digest."""
    digest = hashlib.sha256()
    for weights in sorted(Path(path).glob("model*.safetensors")):
        with weights.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def build_of(path: str | Path) -> str:
    """'recipe <hash>, weights <digest>' of a directory the tiny fit made: one recipe fits other
    weights on another kind of CPU (cobalt.reference), so a measurement names both."""
    recipe_file = Path(path) / RECIPE_FILE
    recipe = json.loads(recipe_file.read_text())["hash"] if recipe_file.is_file() else "unknown"
    saved = any(Path(path).glob("model*.safetensors"))
    return f"recipe {recipe}, weights {weights_digest(path) if saved else 'not saved'}"


def is_embedded(name: str) -> bool:
    """Whether `name` is the embedded default's model: 'fitted', 'tiny', or a directory either
    was built into (the tiny fit's recipe file or engines.tiny's marker inside). Such a model
    gets the tiny preset; any other is a real model (the paper preset)."""
    return name in EMBEDDED or any((Path(name) / f).is_file() for f in (RECIPE_FILE, TINY_MARKER))


def resolve_model(
    name: str,
    storage: StorageConfig,
    work_dir: str,
    *,
    flag: str = "--model",
    fit_steps: int | None = None,
    logger: Logger | None = None,
) -> str:
    """The local directory of the model named `name` (see the module's doc): fitted or built
    once (fitted, tiny), downloaded once (storage, Hub), or the directory itself."""
    logger = logger or log
    if name == FITTED:
        path = models_dir(storage, work_dir) / "fitted-seed0"
        logger.info("fitting (or reusing) the tiny model in %s", path)
        fitted = _fit_embedded(path, fit_steps)
        logger.info("the fitted model: %s", build_of(fitted))
        return str(fitted)
    if name == TINY:
        return str(tiny_model(storage, work_dir))
    if name.startswith("s3://"):
        return str(storage_model(name, storage, work_dir, flag=flag, logger=logger))
    if "://" in name:
        raise ModelNameError(f"{flag} {name}: unknown scheme: name {NAMES}")
    if Path(name).expanduser().exists() or _looks_like_path(name):
        return local_model(name, flag)
    return hub_model(name, flag, logger)


def _looks_like_path(name: str) -> bool:
    """A name no Hub id can be: absolute, relative to '.' or '~', or with 2+ slashes."""
    return name.startswith(("/", ".", "~")) or name.split("@", 1)[0].count("/") > 1


def local_model(name: str, flag: str = "--model") -> str:
    """A local directory holding a saved model (config.json), as given (`~` expanded)."""
    path = Path(name).expanduser()
    if not path.exists():
        raise ModelNameError(f"{flag} {name}: no such directory: name {NAMES}")
    if not (path / "config.json").is_file():
        raise ModelNameError(
            f"{flag} {name}: the directory has no config.json: pass a directory saved with "
            f"save_pretrained (config.json, weights, tokenizer), or name {NAMES}"
        )
    return name if path == Path(name) else str(path)


def models_dir(storage: StorageConfig, work_dir: str) -> Path:
    """Where built models live: in the storage when it is local, else in `work_dir`."""
    base = Path(open_storage(storage).root) if storage.is_local else Path(work_dir)
    return base / "models"


def tiny_model(storage: StorageConfig, work_dir: str) -> Path:
    """The random tiny model (`engines.tiny`), built once into the storage (or work_dir)."""
    path = models_dir(storage, work_dir) / f"tiny-seed{TINY_SEED}"
    if not (path / TINY_MARKER).exists():
        from engines.tiny import build_tiny_model

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=path.parent))
        build_tiny_model(tmp, seed=TINY_SEED)
        _commit_dir(tmp, path)
    return path


# --- the Hugging Face Hub -----------------------------------------------------------------------


def hub_model(name: str, flag: str = "--model", logger: Logger | None = None) -> str:
    """The Hub model `org/name[@revision]` as a snapshot directory of the Hub cache, downloaded
    there once (`snapshot_download`); offline (HF_HUB_OFFLINE=1, or no network) from the cache."""
    import httpx
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id

    repo, _, revision = name.partition("@")
    at = f" --revision {revision}" if revision else ""
    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise ModelNameError(
            f"{flag} {name}: no such directory here, and not a Hub id: name {NAMES}"
        ) from None
    kwargs = {"revision": revision or None, "ignore_patterns": UNUSED_HUB_FILES}
    offline = constants.is_offline_mode()
    try:
        if offline:
            path = snapshot_download(repo, local_files_only=True, **kwargs)
        else:
            (logger or log).info("resolving %s on the Hub (downloading what is not cached)", name)
            try:
                path = snapshot_download(repo, **kwargs)
            except (httpx.ConnectError, httpx.TimeoutException):  # no network: the cache alone
                offline = True
                path = snapshot_download(repo, local_files_only=True, **kwargs)
    except GatedRepoError:
        raise ModelNameError(
            f"{flag} {name}: {repo} is a gated model and this machine has no access to it: accept "
            f"its terms at https://huggingface.co/{repo} and set HF_TOKEN (or run `hf auth "
            "login`) with that account's token"
        ) from None
    except RevisionNotFoundError:
        raise ModelNameError(
            f"{flag} {name}: {repo} has no revision {revision!r}: name a branch, tag or commit "
            f"of it ({repo}@main), or leave @revision out"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNameError(
            f"{flag} {name}: no model {repo} on the Hub (or it is private: set HF_TOKEN), and no "
            f"directory {name} here: check the name, or name {NAMES}"
        ) from None
    except LocalEntryNotFoundError as exc:
        cause = exc.__cause__ or exc.__context__
        why = (
            "HF_HUB_OFFLINE=1"
            if constants.is_offline_mode()
            else type(cause).__name__
            if cause is not None
            else "no network"
        )
        cached = _cached_refs(repo)
        have = f" (cached: {', '.join(cached)})" if cached else ""
        raise ModelNameError(
            f"{flag} {name}: not in the Hugging Face cache {constants.HF_HUB_CACHE}{have} and "
            f"the Hub cannot be reached ({why}): download it where there is a network (`hf "
            f"download {repo}{at}`) into this cache (HF_HOME), or name a local directory"
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        fix = (
            "set HF_TOKEN to a token with access to it (`hf auth login`)"
            if status in (401, 403)
            else "try again later, or name a local directory"
        )
        raise ModelNameError(
            f"{flag} {name}: the Hub refused {repo} (HTTP {status}): {fix}"
        ) from None
    if not Path(path, "config.json").is_file():
        raise ModelNameError(
            f"{flag} {name}: the Hub snapshot {path} has no config.json: name a transformers "
            "model repository (config.json, weights, tokenizer)"
        )
    if offline:
        (logger or log).info("%s: the cached snapshot %s", name, path)
    return path


def _cached_refs(repo: str) -> list[str]:
    """The branches and tags of `repo` in the Hub cache (empty when it is not cached)."""
    from huggingface_hub import constants

    refs = Path(constants.HF_HUB_CACHE, "models--" + repo.replace("/", "--"), "refs")
    return sorted(str(p.relative_to(refs)) for p in refs.rglob("*") if p.is_file())


def stable_name(path: str) -> str:
    """What a cache key records of a model directory: `org/name@<commit>` for a snapshot of the
    Hub cache (.../models--org--name/snapshots/<commit>; the same on any machine, and a name
    `resolve_model` takes), else `path` as given."""
    p = Path(path)
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
        repo = p.parent.parent.name.removeprefix("models--").replace("--", "/")
        return f"{repo}@{p.name}"
    return path


def display_name(model: str) -> str:
    """A short name of a model (a directory, or a stable name) for titles: `name@<commit[:7]>`
    for a Hub snapshot, else the last part of the path."""
    repo, _, commit = stable_name(model).partition("@")
    if len(commit) == 40 and repo.count("/") <= 1:
        return f"{repo.rsplit('/', 1)[-1]}@{commit[:7]}"
    return model.rstrip("/").rsplit("/", 1)[-1] or model


# --- storage --------------------------------------------------------------------------------------


def storage_model(
    uri: str, storage: StorageConfig, work_dir: str, *, flag: str = "--model", logger: Logger = log
) -> Path:
    """The model directory `uri` (s3://bucket/prefix/...) downloaded once into
    work_dir/models/<its key> (a training stage's policy: <key>, the name the training stage's
    own download uses), reached with the run's storage settings (endpoint, credentials)."""
    remote = uri.removeprefix("s3://").rstrip("/")
    parts = remote.split("/")
    name = parts[-1] if len(parts) > 2 and parts[-2] == "training" else _hashed(parts[-1], uri)
    path = Path(work_dir, "models", name)
    if (path / "config.json").is_file():
        return path
    fs = _s3_fs(storage, parts[0])
    try:
        entries = fs.ls(remote, detail=True, refresh=True)
    except FileNotFoundError:
        entries = []
    except PermissionError:
        raise ModelNameError(
            f"{flag} {uri}: access denied: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or "
            "--storage-block) for that bucket"
        ) from None
    except Exception as exc:  # connection refused, DNS, missing credentials, TLS, ...
        raise ModelNameError(
            f"{flag} {uri}: cannot reach it ({type(exc).__name__}: {str(exc)[:160]}): set "
            "--endpoint-url (or AWS_ENDPOINT_URL) and the AWS_* credentials of that storage"
        ) from None
    files = [e["name"] for e in entries if e.get("type") == "file"]
    if not any(f.rsplit("/", 1)[-1] == "config.json" for f in files):
        found = "holds no config.json" if entries else "holds nothing"
        raise ModelNameError(
            f"{flag} {uri}: {found}: name a model directory in storage, such as a finished "
            "training stage's <storage>/training/<key> (its summary prints it), or "
            f"name {NAMES}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s into %s", uri, path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=path.parent))
    for f in files:
        fs.get_file(f, str(tmp / f.rsplit("/", 1)[-1]))
    _commit_dir(tmp, path)
    return path


def _hashed(name: str, uri: str) -> str:
    return f"{name}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


def _s3_fs(storage: StorageConfig, bucket: str):
    """An s3fs filesystem with the run's storage settings, or the environment's when the run's
    storage is local."""
    config = storage if not storage.is_local else StorageConfig(url=f"s3://{bucket}")
    return open_storage(config).fs


def _commit_dir(tmp: Path, path: Path) -> None:
    """Move the finished directory `tmp` to `path` in one rename, so a half-written model is
    never found there: a leftover without config.json (an interrupted download of an older
    version) is replaced, one another run finished meanwhile is kept."""
    if path.is_dir() and not (path / "config.json").is_file():
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.replace(tmp, path)
    except OSError:  # finished meanwhile by another run
        shutil.rmtree(tmp, ignore_errors=True)
