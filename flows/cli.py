"""What the flows' command lines share: parameters validated and preflight-checked before any work,
known errors printed without a traceback (exit 2), and an embedded Prefect server given time to
start on a busy machine."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings
from pydantic import ValidationError

from cobalt.analysis.judge import JudgeError
from cobalt.data.sources import SourceError
from cobalt.errors import EmptyStageError
from cobalt.reference import ReferenceModelError
from cobalt.storage import StorageError
from cobalt.trajectories.problemsets import ProblemSetError
from engines import MissingAPIKeyError


class ConfigError(ValueError):
    """A --config file that cannot be read as a JSON object; the message names file and place."""


def read_config(path: Path) -> dict[str, Any]:
    """A --config file's JSON object; `ConfigError` (one line: the file, line and column) when it
    is missing, not JSON or not an object."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--config {path}: not valid JSON at line {exc.lineno} column {exc.colno} "
            f"({exc.msg}); the file holds one JSON object of parameter fields"
        ) from None
    if not isinstance(values, dict):
        raise ConfigError(
            f"--config {path}: holds a JSON {type(values).__name__}, not an object of parameter "
            'fields (e.g. {"collect": {"turns": 3}})'
        )
    return values


EPHEMERAL_START_S = 90  # Prefect's 20 s default is too short on a loaded 2-core machine
# what a user can fix: printed as one line, exit status 2, no traceback
USER_ERRORS = (
    ConfigError,
    StorageError,
    SourceError,
    ProblemSetError,
    EmptyStageError,
    ReferenceModelError,
    MissingAPIKeyError,
    JudgeError,
    OSError,
)
STORAGE_FLAGS = (
    ("storage", "url"),
    ("endpoint_url", "endpoint_url"),
    ("storage_block", "block"),
)


def run_flow_cli(
    parse: Callable[[], Any],
    preflight: Callable[[Any], Any],
    flow: Callable[[Any], Any],
    render: Callable[[Any], str],
) -> int:
    try:
        params = parse()
        preflight(params)  # the flow checks again; here the message comes without a traceback
    except ValidationError as exc:
        print(f"error: invalid parameters:\n{exc}", file=sys.stderr)
        return 2
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    timeout = max(EPHEMERAL_START_S, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: timeout}):
        summary = flow(params)
    print(render(summary))
    return 0


def add_storage_args(parser: argparse.ArgumentParser) -> None:
    """--storage, --endpoint-url, --storage-block: the StorageConfig every flow takes."""
    arg = parser.add_argument
    arg("--storage", metavar="URL", help="local directory or s3://bucket/prefix (default ./runs)")
    arg("--endpoint-url", metavar="URL", help="S3-compatible endpoint, e.g. http://minio:9000")
    arg("--storage-block", metavar="NAME", help="Prefect RemoteFileSystem block with S3 settings")


def add_running_args(parser: argparse.ArgumentParser, group: Any = None) -> None:
    """How a stage that generates and judges runs (never part of a cache key): the sandbox,
    the Prefect concurrency limits, storage, the local work directory, --refresh. `group`: an
    argument group of `parser` for the sandbox and limit flags (default: the parser)."""
    arg = (group or parser).add_argument
    arg("--backend", choices=["auto", "docker", "namespace"], help="sandbox isolation (auto)")
    arg("--sandbox-concurrency", type=int, help="programs judged at once (CPU count)")
    arg("--timeout", type=float, help="seconds per test (4)")
    arg("--llm-limit", metavar="NAME", help="Prefect global concurrency limit for the endpoint")
    arg("--sandbox-limit", metavar="NAME", help="Prefect global concurrency limit for judging")
    add_storage_args(parser)
    parser.add_argument(
        "--work-dir", metavar="DIR", help="local models and spools for S3 runs (~/.cache/cobalt)"
    )
    parser.add_argument("--refresh", action="store_true", help="recompute every stage")


def running_values(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """Put the flags of `add_running_args` that were given into `values` (over a --config
    file's)."""
    for flag in ("llm_limit", "sandbox_limit", "work_dir"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.refresh:
        values["refresh"] = True
    storage_values(args, values)
    if args.backend is not None:
        values.setdefault("sandbox", {})["backend"] = args.backend
    if args.sandbox_concurrency is not None:
        values.setdefault("sandbox", {})["concurrency"] = args.sandbox_concurrency
    if args.timeout is not None:
        values.setdefault("limits", {})["timeout_s"] = args.timeout


def storage_values(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """Put the storage flags given into `values["storage"]` (over a --config file's)."""
    storage = values.setdefault("storage", {})
    for flag, field in STORAGE_FLAGS:
        if getattr(args, flag, None) is not None:
            storage[field] = getattr(args, flag)
