"""Where Prefect keeps task results and cache records in the run's storage, and how a saved
Prefect `RemoteFileSystem` block becomes the storage's S3 credentials (installed into
`cobalt.storage` on import). The storage itself (datasets, manifests) is `cobalt/storage.py`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from prefect.filesystems import LocalFileSystem, RemoteFileSystem

from cobalt.storage import Storage, StorageError, recipe_key, set_credential_loader


def block_settings(name: str) -> dict[str, Any]:
    """The fsspec settings (credentials, endpoint) of a saved RemoteFileSystem block."""
    try:
        return dict(RemoteFileSystem.load(name).settings)
    except ValueError as exc:
        raise StorageError(
            f"Prefect block {name!r} could not be loaded ({exc}): create a RemoteFileSystem block "
            "with that name, or drop --storage-block and set the AWS_* environment variables"
        ) from None


set_credential_loader(block_settings)


@lru_cache(maxsize=8)
def result_storage(storage: Storage) -> Any:
    """Where Prefect writes task results: a Path locally, a saved RemoteFileSystem on S3 (Prefect
    needs remote result storage saved server-side; it holds no secret unless the configured
    block does)."""
    if storage.config.is_local:
        return Path(storage.path("prefect", "results"))
    block = RemoteFileSystem(basepath=storage.url("prefect", "results"), settings=storage.options)
    name = "cobalt-results-" + recipe_key(basepath=block.basepath, settings=storage.options)[:12]
    block.save(name, overwrite=True)
    return block


def key_storage(storage: Storage) -> Any:
    """Where Prefect writes cache records (`cache_policy.configure(key_storage=...)`)."""
    if storage.config.is_local:
        return LocalFileSystem(basepath=storage.path("prefect", "cache-keys"))
    return RemoteFileSystem(basepath=storage.url("prefect", "cache-keys"), settings=storage.options)
