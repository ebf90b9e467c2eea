"""One storage setting for every artifact: datasets (parquet), Prefect's results and cache records.

`StorageConfig.url` is a local directory (the embedded default, `./runs`) or `s3://bucket/prefix`
on any S3-compatible endpoint (through s3fs). Layout under it:

    datasets/<stage>/<name>/<key>/MANIFEST.json      committed version (written last)
    datasets/<stage>/<name>/<key>/<attempt>/*.parquet data of one write attempt
    datasets/problemsets/LATEST.json                 pointer to the newest problem-set bundle
                                                     (each stage's area has one: `latest`)
    prefect/results/<cache key>                      Prefect task results (tasks/storage.py)
    prefect/cache-keys/<cache key>                   Prefect cache records

A dataset is versioned by a content address (`key`: hash of stage config, input fingerprints and
code version) and committed atomically: its files go to a fresh attempt directory and only the
manifest, written last in one atomic put / rename, makes them visible. Readers go through the
manifest, so a crash mid-write leaves nothing a later run would read.

Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...) or from a
saved Prefect `RemoteFileSystem` block named by `block` (loaded by the Prefect layer through
`set_credential_loader`: this module imports no Prefect); they are never logged.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from cobalt.errors import UserError
from cobalt.problems import Problem, fingerprint, from_table, to_table

MANIFEST = "MANIFEST.json"  # every stage's commit record, written last
LATEST = "LATEST.json"  # in a stage's area: the newest finished run, what 'latest' names
# the logger a stage reports to: a module logger, or the Prefect run logger (an adapter)
Logger = logging.Logger | logging.LoggerAdapter
FORMAT = "cobalt-dataset/1"
log = logging.getLogger(__name__)


class StorageError(UserError):
    """The storage cannot be used; the message says what to set."""


class StorageConfig(BaseModel):
    """Where every artifact of the pipeline lives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        default_factory=lambda: os.environ.get("COBALT_STORAGE", "./runs"),
        description="Local directory or s3://bucket/prefix (env COBALT_STORAGE; default ./runs).",
    )
    endpoint_url: str | None = Field(
        None,
        description="S3-compatible endpoint, e.g. http://minio:9000 (AWS_ENDPOINT_URL works too).",
    )
    block: str | None = Field(
        None,
        description="Name of a saved Prefect RemoteFileSystem block whose settings are the fsspec "
        "options (credentials, endpoint); without it credentials come from AWS_* env vars.",
    )
    shared: bool = Field(
        False,
        description="The local directory is on a filesystem every node mounts (NFS, Lustre, a "
        "cluster's shared disk), so training on several nodes may keep its checkpoints there; "
        "checked when the training starts (each node must see the others' files).",
    )

    @field_validator("url")
    @classmethod
    def _supported(cls, url: str) -> str:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        if protocol not in ("file", "s3"):
            raise ValueError(f"storage url {url!r}: use a local directory or s3://bucket/prefix")
        if protocol == "s3" and not url[len("s3://") :].strip("/"):
            raise ValueError("storage url 's3://' needs a bucket: s3://bucket[/prefix]")
        return url.rstrip("/") or "/"

    @property
    def is_local(self) -> bool:
        return not self.url.startswith("s3://")


class TableInfo(BaseModel):
    """One table of a dataset. Its file (in an attempt directory) is named by the manifest only,
    so rewriting identical content yields an identical ref and downstream caches still hit."""

    rows: int
    fingerprint: str


class DatasetRef(BaseModel):
    """A committed dataset version: what tasks pass to each other (small, hashable)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="'<stage>/<name>', e.g. 'clean/taco'.")
    key: str = Field(description="Content address: hash of config, inputs and code version.")
    uri: str = Field(description="The dataset directory (holding MANIFEST.json).")
    tables: dict[str, TableInfo]
    tally: list[dict[str, Any]] = Field(
        default_factory=list, description="Per source/difficulty/outcome counts of this stage."
    )

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())


def default_work_dir() -> str:
    """Local scratch for S3 runs (spools, checkpoints, models): $COBALT_WORK_DIR or
    ~/.cache/cobalt."""
    return os.environ.get("COBALT_WORK_DIR", str(Path.home() / ".cache" / "cobalt"))


@cache
def code_version(*names: str) -> str:
    """Hash of the source of modules or functions given by dotted name (part of every recipe
    key, so changed logic gets a new content address)."""
    digest = hashlib.sha256()
    for name in names:
        try:
            obj: Any = importlib.import_module(name)
        except ModuleNotFoundError:
            module, _, attr = name.rpartition(".")
            obj = getattr(importlib.import_module(module), attr)
        digest.update(inspect.getsource(obj).encode())
    return digest.hexdigest()[:16]


def recipe_key(**recipe: Any) -> str:
    """The content address of a dataset: a hash of everything that determines its content."""
    text = json.dumps(recipe, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Storage:
    """File access under the configured root, through fsspec (local or s3fs)."""

    def __init__(self, config: StorageConfig):
        self.config = config
        self.options = _fs_options(config)
        if config.is_local:
            path = config.url.removeprefix("file://")
            self.root = str(Path(path).expanduser().resolve())
            self.fs = fsspec.filesystem("file", auto_mkdir=True)
            self.protocol = ""
        else:
            self.root = config.url.removeprefix("s3://").strip("/")
            self.fs = fsspec.filesystem("s3", **self.options)
            self.protocol = "s3://"

    # --- paths -------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *(p.strip("/") for p in parts)])

    def url(self, *parts: str) -> str:
        """A full URL (with s3:// for S3) for humans and other tools."""
        return self.protocol + self.path(*parts)

    # --- fail fast ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise StorageError, naming what to set, if the storage cannot be used."""
        if self.config.is_local:
            try:
                os.makedirs(self.root, exist_ok=True)
                probe = Path(self.root, f".probe-{uuid.uuid4().hex}")
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as exc:
                raise StorageError(
                    f"storage directory {self.root} is not writable ({exc.strerror}): "
                    "set --storage (or COBALT_STORAGE) to a writable directory or s3://bucket/prefix"
                ) from None
            return
        bucket = self.root.split("/", 1)[0]
        endpoint = (
            self.options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
        )
        quick = dict(self.options, skip_instance_cache=True)
        quick["config_kwargs"] = {
            **self.options.get("config_kwargs", {}),
            "connect_timeout": 3,
            "read_timeout": 10,
            "retries": {"total_max_attempts": 1},
        }
        try:
            probe = fsspec.filesystem("s3", **quick)
            probe.retries = 1  # fail fast: no backoff loop
            probe.ls(bucket, refresh=True)
        except FileNotFoundError:
            raise StorageError(
                f"bucket {bucket!r} does not exist at {endpoint}: create it, or set --storage "
                "(COBALT_STORAGE) to s3://<existing bucket>/<prefix>"
            ) from None
        except PermissionError as exc:
            raise StorageError(
                f"access to bucket {bucket!r} at {endpoint} denied ({type(exc).__name__}): set "
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or --storage-block <Prefect block>"
            ) from None
        except Exception as exc:  # connection refused, DNS, missing credentials, TLS, ...
            raise StorageError(
                f"cannot reach S3 storage {self.url()} at {endpoint} ({type(exc).__name__}: "
                f"{str(exc)[:160]}): set "
                "--endpoint-url (or AWS_ENDPOINT_URL) to a reachable S3-compatible endpoint and "
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or --storage-block)"
            ) from None

    # --- bytes -------------------------------------------------------------------------------
    def write_atomic(self, path: str, data: bytes) -> None:
        """Whole file or nothing: one PUT on S3, write + rename locally."""
        if self.config.is_local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            self.fs.pipe_file(tmp, data)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def commit(self, manifest_path: str, ref: BaseModel, spec: BaseModel, **extra: Any) -> None:
        """Write a stage's manifest (its spec and ref): the last write, which makes it finished."""
        manifest = {
            **extra,
            "created_at": datetime.now(UTC).isoformat(),
            "spec": spec.model_dump(mode="json"),
            **ref.model_dump(mode="json"),
        }
        self.write_atomic(manifest_path, json.dumps(manifest, indent=1, default=str).encode())

    def read_json(self, path: str) -> dict:
        with self.fs.open(path, "rb") as f:
            return json.loads(f.read())

    # --- the newest finished run of a stage ----------------------------------------------------
    def point_latest(self, area: str, **run: Any) -> None:
        """`<area>/LATEST.json` now names this finished run (`run`'s fields, and when)."""
        pointer = {**run, "at": datetime.now(UTC).isoformat()}
        self.write_atomic(self.path(area, LATEST), json.dumps(pointer, default=str).encode())

    def latest(self, area: str, field: str) -> str | None:
        """What `<area>/LATEST.json` names in `field` (the newest finished run's directory), or
        None when no run finished there yet."""
        pointer = self.path(area, LATEST)
        return self.read_json(pointer)[field] if self.fs.exists(pointer) else None

    # --- datasets ----------------------------------------------------------------------------
    def write_dataset(
        self,
        name: str,
        key: str,
        tables: dict[str, list[Problem]],
        tally: list[dict[str, Any]] | None = None,
        recipe: dict[str, Any] | None = None,
    ) -> DatasetRef:
        """Write tables as parquet into a fresh attempt directory, then commit the manifest."""
        directory = self.path("datasets", name, key)
        attempt = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
        infos: dict[str, TableInfo] = {}
        files: dict[str, str] = {}
        for table, problems in tables.items():
            files[table] = f"{attempt}/{table}.parquet"
            with self.fs.open(f"{directory}/{files[table]}", "wb") as f:
                pq.write_table(to_table(problems), f, compression="zstd")
            infos[table] = TableInfo(rows=len(problems), fingerprint=fingerprint(problems))
        ref = DatasetRef(
            name=name, key=key, uri=self.protocol + directory, tables=infos, tally=tally or []
        )
        manifest = {
            "format": FORMAT,
            "created_at": datetime.now(UTC).isoformat(),
            "recipe": recipe or {},
            "files": files,
            **ref.model_dump(),
        }
        self.write_atomic(
            f"{directory}/{MANIFEST}", json.dumps(manifest, indent=1, default=str).encode()
        )
        self._prune(directory, keep=attempt)
        return ref

    def _prune(self, directory: str, keep: str) -> None:
        """Remove superseded attempts older than a day (a concurrent writer of the same key may
        still be filling a younger one)."""
        cutoff = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y%m%dT%H%M%S")
        try:
            entries = self.fs.ls(directory, detail=False, refresh=True)
        except FileNotFoundError:
            return
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name != keep and name != MANIFEST and name[:15] < cutoff:
                self.fs.rm(entry, recursive=True)

    def read_manifest(self, ref_or_uri: DatasetRef | str) -> dict:
        uri = ref_or_uri.uri if isinstance(ref_or_uri, DatasetRef) else ref_or_uri
        try:
            return self.read_json(f"{_strip(uri)}/{MANIFEST}")
        except FileNotFoundError:
            raise StorageError(
                f"dataset {uri} has no committed manifest (deleted or never finished): rerun the "
                "flow with --refresh to rebuild it"
            ) from None

    def read_problems(self, ref: DatasetRef, table: str = "problems") -> list[Problem]:
        """The problems of a committed table (as the manifest on storage names them)."""
        manifest = self.read_manifest(ref)
        if manifest["tables"][table]["fingerprint"] != ref.tables[table].fingerprint:
            raise StorageError(
                f"dataset {ref.uri} was rewritten with other content since this run's cached "
                "result was recorded: rerun with --refresh"
            )
        with self.fs.open(f"{_strip(ref.uri)}/{manifest['files'][table]}", "rb") as f:
            return from_table(pq.read_table(f))


def content_hash(data: bytes) -> str:
    """A file's fingerprint in a manifest: 'sha256:<hex>'."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Spool:
    """A JSONL that one task appends to (a shard of a stage) and storage keeps, in `directory`
    beside the MANIFEST.json its caller commits last. Local storage: the file itself, in place.
    S3: a local spool file (`spool_dir/filename`), resumed from the uploaded copy when the local
    one is missing, uploaded by `upload()` (whole lines only) and by `close()`.

    `finished` is the manifest when the directory already holds a finished one (never under
    `refresh`, which removes the manifest and both copies of the file first)."""

    def __init__(
        self,
        st: Storage,
        directory: str,
        filename: str,
        spool_dir: Path,
        *,
        refresh: bool = False,
        name: str = "",
        logger: Logger = log,
    ):
        self.st, self.directory = st, directory
        self.manifest, self.remote = f"{directory}/{MANIFEST}", f"{directory}/{filename}"
        self.is_local = st.config.is_local
        self.local = Path(self.remote) if self.is_local else Path(spool_dir, filename)
        self.finished: dict[str, Any] | None = None
        if refresh:
            for path in (self.manifest, self.remote):
                if st.fs.exists(path):
                    st.fs.rm(path)
            self.local.unlink(missing_ok=True)
        elif st.fs.exists(self.manifest):
            self.finished = st.read_json(self.manifest)
            logger.info("%s: finished already (%s)", name, directory)
            return
        if not self.is_local and not self.local.exists() and st.fs.exists(self.remote):
            self.local.parent.mkdir(parents=True, exist_ok=True)
            st.fs.get_file(self.remote, str(self.local))
            logger.info("%s: resuming from %s", name, st.url(self.remote))

    def upload(self) -> None:
        """The lines written so far, to storage (S3; nothing to do locally)."""
        if self.is_local:
            return
        try:
            data = self.local.read_bytes()
        except FileNotFoundError:
            return
        self.st.write_atomic(self.remote, data[: data.rfind(b"\n") + 1])

    def close(self) -> bytes:
        """The finished file's bytes (an empty file when nothing was written), in storage."""
        self.local.parent.mkdir(parents=True, exist_ok=True)
        self.local.touch()
        data = self.local.read_bytes()
        if not self.is_local:
            self.st.write_atomic(self.remote, data)
        return data


def from_manifest(manifest: dict[str, Any], model: type[Any]) -> Any:
    """The ref model (`model`) of a finished stage, from the fields of its manifest."""
    return model.model_validate({k: v for k, v in manifest.items() if k in model.model_fields})


def _strip(uri: str) -> str:
    return uri.removeprefix("s3://")


CredentialLoader = Callable[[str], dict[str, Any]]
_credential_loader: CredentialLoader | None = None


def set_credential_loader(loader: CredentialLoader) -> None:
    """Install how `StorageConfig.block` names are turned into fsspec options. The Prefect layer
    (tasks/storage.py) installs a loader of saved RemoteFileSystem blocks; without one, `block`
    cannot be used (credentials then come from the AWS_* environment variables)."""
    global _credential_loader
    _credential_loader = loader
    open_storage.cache_clear()


def _fs_options(config: StorageConfig) -> dict[str, Any]:
    """fsspec options: the block's settings (credentials) if named, plus the endpoint."""
    options: dict[str, Any] = {}
    if config.block:
        if _credential_loader is None:
            raise StorageError(
                f"storage block {config.block!r} is a saved Prefect block: run through the flows "
                "(or `import tasks`) to load it, or drop the block and set the AWS_* environment "
                "variables"
            )
        options.update(_credential_loader(config.block))
    if config.endpoint_url:
        options["endpoint_url"] = config.endpoint_url
    return options


@lru_cache(maxsize=8)
def open_storage(config: StorageConfig) -> Storage:
    """A Storage per config, reused within a process."""
    return Storage(config)
