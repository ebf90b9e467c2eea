"""Where Prefect keeps task results and cache records in the run's storage, and how a saved
Prefect `RemoteFileSystem` block becomes the storage's S3 credentials (installed into
`cobalt.storage` on import). The storage itself (datasets, manifests) is `cobalt/storage.py`."""

from __future__ import annotations

import urllib.parse
from functools import lru_cache
from pathlib import Path
from typing import Any

import fsspec
from prefect.filesystems import LocalFileSystem, RemoteFileSystem
from pydantic import Field

from cobalt.storage import Storage, StorageError, recipe_key, set_credential_loader


def load_block(name: str) -> RemoteFileSystem:
    """A saved RemoteFileSystem block, or a StorageError that says what to create or set."""
    try:
        return RemoteFileSystem.load(name)
    except ValueError as exc:
        raise StorageError(
            f"Prefect block {name!r} could not be loaded ({exc}): create a RemoteFileSystem block "
            "with that name, or drop --storage-block and set the AWS_* environment variables"
        ) from None


def block_settings(name: str) -> dict[str, Any]:
    """The fsspec settings (credentials, endpoint) of a saved RemoteFileSystem block."""
    return dict(load_block(name).settings)


set_credential_loader(block_settings)


class ResultStorage(RemoteFileSystem):
    """A RemoteFileSystem whose saved document holds no credential: `settings` keeps what is no
    secret (the endpoint); the credentials come from the user's own saved block, which Prefect
    stores as a reference to it (`credentials`), never as a copy, or, without one, from the
    worker's environment (AWS_*, read by s3fs)."""

    _block_type_name = "Cobalt Result Storage"

    credentials: RemoteFileSystem | None = Field(
        default=None,
        description="The saved block whose settings (credentials) reach fsspec; a reference.",
    )

    @property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        if not self._filesystem:
            shared = dict(self.credentials.settings) if self.credentials else {}
            scheme = urllib.parse.urlsplit(self.basepath).scheme
            self._filesystem = fsspec.filesystem(scheme, **(shared | self.settings))
        return self._filesystem


def _remote(storage: Storage, *parts: str) -> ResultStorage:
    config = storage.config
    return ResultStorage(
        basepath=storage.url(*parts),
        settings={"endpoint_url": config.endpoint_url} if config.endpoint_url else {},
        credentials=load_block(config.block) if config.block else None,
    )


@lru_cache(maxsize=8)
def result_storage(storage: Storage) -> Any:
    """Where Prefect writes task results: a Path locally, on S3 a saved `ResultStorage` (Prefect
    needs remote result storage saved server-side; it holds no credential, see the class)."""
    if storage.config.is_local:
        return Path(storage.path("prefect", "results"))
    block = _remote(storage, "prefect", "results")
    recipe = {"basepath": block.basepath, "settings": block.settings, "block": storage.config.block}
    block.save("cobalt-results-" + recipe_key(**recipe)[:12], overwrite=True)
    return block


def key_storage(storage: Storage) -> Any:
    """Where Prefect writes cache records (`cache_policy.configure(key_storage=...)`)."""
    if storage.config.is_local:
        return LocalFileSystem(basepath=storage.path("prefect", "cache-keys"))
    return _remote(storage, "prefect", "cache-keys")
