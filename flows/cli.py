"""What the flows' command lines share: parameters validated and preflight-checked before any work;
an error the user can fix printed as one line (exit 2) wherever in the run it is raised, with no
traceback from Prefect either; a --config file read with the file, line and column of a mistake,
and merged over the defaults; an embedded Prefect server given time to start on a busy machine,
without telemetry, and no process left behind when the command is killed (engines/reaper.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect.settings import (
    PREFECT_SERVER_ANALYTICS_ENABLED,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    temporary_settings,
)
from pydantic import ValidationError

from cobalt.errors import USER_ERRORS as LIBRARY_ERRORS
from cobalt.errors import user_error
from cobalt.params import ConfigError, add_option, help_text
from cobalt.run_settings import ModelRunSettings, RunSettings
from engines.reaper import reaper

EPHEMERAL_START_S = 90  # Prefect's 20 s default is too short on a loaded 2-core machine
# what a user can fix, before the run: printed as one line, exit status 2, no traceback
USER_ERRORS = (*LIBRARY_ERRORS, OSError)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # they log a failed run's traceback
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
    """Parse, preflight, run the flow, print its summary: 0; an error the user can fix, at any
    of these steps, is printed as one line: 2; any other error keeps its traceback."""
    with embedded_run(), reaper():  # a preflight may start the temporary server already
        try:
            params = parse()
            preflight(params)  # the flow checks again; here a failure costs no flow run
        except ValidationError as exc:
            print("error: " + validation_line(exc), file=sys.stderr)
            return 2
        except USER_ERRORS as exc:
            return fail(exc)
        try:
            summary = flow(params)
        except Exception as exc:
            if (found := user_error(exc)) is None:
                raise
            return fail(found)
    print(render(summary))
    return 0


def validation_line(exc: ValidationError) -> str:
    """Pydantic's errors as one line: each field's dotted path and what is wrong with it."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or exc.title
        parts.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "invalid parameters: " + " ".join("; ".join(parts).split())


def fail(exc: BaseException) -> int:
    """Print `exc` as the one line `error: ...` on stderr; the exit status of a user error."""
    print("error: " + " ".join(str(exc).split()), file=sys.stderr)
    return 2


@contextlib.contextmanager
def embedded_run() -> Iterator[None]:
    """The Prefect settings of a command-line run (a temporary server's start-up time, its
    telemetry off unless PREFECT_SERVER_ANALYTICS_ENABLED says otherwise), and a user error's
    traceback kept out of the run's log (its one line is printed at the end)."""
    timeout = max(EPHEMERAL_START_S, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    updates: dict[Any, Any] = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: timeout}
    if "PREFECT_SERVER_ANALYTICS_ENABLED" not in os.environ:
        updates[PREFECT_SERVER_ANALYTICS_ENABLED] = False
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    for logger in loggers:
        logger.addFilter(_no_user_traceback)
    try:
        with temporary_settings(updates=updates):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(_no_user_traceback)


def _no_user_traceback(record: logging.LogRecord) -> bool:
    """A log filter: a record of a user error keeps its message, not its traceback."""
    if record.exc_info and user_error(record.exc_info[1]) is not None:
        record.exc_info, record.exc_text = None, None
    return True


def read_config(path: Path | str | None) -> dict[str, Any]:
    """The JSON object of a --config file ({} for None); ConfigError names the file and the
    line:column of a mistake."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = Path(path).read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"--config {path}: line {line}: a byte that is not UTF-8 (0x{exc.object[exc.start]:02x})"
            ": save the file as UTF-8 JSON"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"--config {path}: {exc.strerror or exc}: pass an existing JSON file"
        ) from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--config {path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg}): fix the file "
            "(a JSON object of the flow's parameters)"
        ) from None
    if not isinstance(values, dict):
        raise ConfigError(
            f"--config {path}: holds a JSON {type(values).__name__}, not an object: write "
            '{"field": value, ...} with the flow\'s parameters'
        )
    return values


def add_storage_args(parser: argparse.ArgumentParser) -> None:
    """--storage, --endpoint-url, --storage-block: the StorageConfig every flow takes."""
    arg = parser.add_argument
    arg("--storage", metavar="URL", help="local directory or s3://bucket/prefix (default ./runs)")
    arg("--endpoint-url", metavar="URL", help="S3-compatible endpoint, e.g. http://minio:9000")
    arg("--storage-block", metavar="NAME", help="Prefect RemoteFileSystem block with S3 settings")
    arg(
        "--shared-storage",
        action="store_true",
        help="the local --storage directory is on a filesystem every node mounts (NFS, Lustre): "
        "training on several nodes may use it",
    )


def add_sandbox_args(container: Any, aliases: tuple[str, ...] = ()) -> None:
    """--backend and --sandbox-concurrency: how programs are judged (the flow's `sandbox`);
    `aliases`: former spellings of --sandbox-concurrency."""
    container.add_argument(
        "--backend", choices=["auto", "docker", "namespace"], help="sandbox isolation (auto)"
    )
    add_option(
        container,
        "--sandbox-concurrency",
        aliases=aliases,
        type=int,
        metavar="N",
        help="programs judged at once (default: the CPU count)",
    )


def sandbox_values(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """Put --backend / --sandbox-concurrency, where given, into `values["sandbox"]`."""
    for flag, field in (("backend", "backend"), ("sandbox_concurrency", "concurrency")):
        if getattr(args, flag, None) is not None:
            values.setdefault("sandbox", {})[field] = getattr(args, flag)


def add_work_dir(parser: argparse.ArgumentParser) -> None:
    """--work-dir: what a flow that loads models keeps on this machine (`work_dir`)."""
    description = ModelRunSettings.model_fields["work_dir"].description or ""
    parser.add_argument("--work-dir", metavar="DIR", help=help_text(description))


def add_refresh(parser: argparse.ArgumentParser) -> None:
    """--refresh: recompute every stage (`refresh`)."""
    description = RunSettings.model_fields["refresh"].description or ""
    parser.add_argument("--refresh", action="store_true", help=help_text(description))


def add_running_args(parser: argparse.ArgumentParser, group: Any = None) -> None:
    """How a stage that generates and judges runs (never part of a cache key): the sandbox,
    the Prefect concurrency limits, storage, the local work directory, --refresh. `group`: an
    argument group of `parser` for the sandbox and limit flags (default: the parser)."""
    container = group or parser
    add_sandbox_args(container)
    arg = container.add_argument
    arg("--timeout", type=float, help="seconds per test (4)")
    arg("--llm-limit", metavar="NAME", help="Prefect global concurrency limit for the endpoint")
    arg("--sandbox-limit", metavar="NAME", help="Prefect global concurrency limit for judging")
    add_storage_args(parser)
    add_work_dir(parser)
    add_refresh(parser)


def running_values(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """Put the flags of `add_running_args` that were given into `values` (over a --config
    file's)."""
    for flag in ("llm_limit", "sandbox_limit", "work_dir"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.refresh:
        values["refresh"] = True
    storage_values(args, values)
    sandbox_values(args, values)
    if args.timeout is not None:
        values.setdefault("limits", {})["timeout_s"] = args.timeout


def storage_values(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """Put the storage flags given into `values["storage"]` (over a --config file's)."""
    storage = values.setdefault("storage", {})
    for flag, field in STORAGE_FLAGS:
        if getattr(args, flag, None) is not None:
            storage[field] = getattr(args, flag)
    if getattr(args, "shared_storage", False):
        storage["shared"] = True
