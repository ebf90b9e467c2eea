"""Sources: reading the rows a `SourceSpec` (`cobalt/data/source_spec.py`) names, from Hub datasets
or local files, and `load_problems` (rows -> `Problem`s through the schema converters of
`cobalt/data/schemas.py`: taco, cobalt, lcb, codecontests).

Everything goes through `datasets.load_dataset`: local JSONL/parquet files with the `json` /
`parquet` builders, Hub datasets by name, or, for repos that ship a loading script (which
`datasets` no longer runs), their data files through `hf://` paths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from cobalt.data.schemas import LoadConfig, difficulty_of, normalise
from cobalt.data.source_spec import HUB, KINDS, SourceSpec, lcb_files
from cobalt.data.tally import Rejected, Tally
from cobalt.errors import UserError
from cobalt.problems import Problem, SourceKind


def infer_kind(columns: Iterable[str]) -> SourceKind:
    """The schema of rows with these columns."""
    cols = set(columns)
    if {"question_content", "private_test_cases"} <= cols:
        return "lcb"
    if "input_output" in cols:
        return "taco"
    if "test_cases" in cols:
        return "cobalt"
    if "description" in cols and ({"tests"} & cols or {"public_tests", "private_tests"} <= cols):
        return "codecontests"
    raise ValueError(
        f"cannot tell the schema from the columns {sorted(cols)[:12]}: give it as PATH:KIND "
        f"with KIND one of {', '.join(KINDS)}"
    )


# --- reading rows ---


class SourceError(UserError):
    """A source cannot be read; the message says what to pass instead."""


def read_rows(spec: SourceSpec, revision: str) -> Any:
    """The rows of a source as a `datasets.Dataset` (iterating yields dicts)."""
    import datasets

    try:
        if spec.is_hub:
            hub = HUB.get(spec.dataset)
            if hub and hub.builder:
                files = (
                    lcb_files(spec.version_tag)
                    if hub.kind == "lcb"
                    else [hub.files.format(split=spec.split)]
                )
                urls = [f"hf://datasets/{spec.dataset}@{revision}/{f}" for f in files]
                return datasets.load_dataset(hub.builder, data_files=urls, split="train")
            return datasets.load_dataset(spec.dataset, split=spec.split, revision=revision)
        if spec.uri.endswith(".parquet"):
            return datasets.load_dataset("parquet", data_files=spec.uri, split="train")
        json_log = logging.getLogger("datasets.packaged_modules.json.json")
        json_log.disabled = True  # a file it cannot parse is read line by line (json_lines)
        try:
            return datasets.load_dataset("json", data_files=spec.uri, split="train")
        finally:
            json_log.disabled = False
    except Exception as exc:
        raise SourceError(hub_hint(spec, exc)) from exc


def hub_hint(spec: SourceSpec, exc: BaseException | str) -> str:
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {str(exc)[:300]}"
    if spec.is_hub:
        return (
            f"dataset {spec.dataset} could not be loaded ({what}); on a machine without the Hub "
            f"pass a local file with --source PATH:{spec.kind} (JSONL or parquet rows of that "
            "schema)"
        )
    return f"source file {spec.uri} could not be read ({what}): check the path and its format"


# --- rows -> problems ---


def load_problems(
    spec: SourceSpec, revision: str, config: LoadConfig
) -> tuple[list[Problem], Tally]:
    """Normalise every row of a source; malformed rows are counted by reason (with their line
    numbers when a file is read line by line), never fatal: only a source with no readable row
    is (SourceError)."""
    problems, tally, seen, index = [], Tally(), set(), -1
    for line, row in source_rows(spec, revision):
        if isinstance(row, Rejected):
            tally.drop(spec.name, difficulty_of({}), row, f"line {line}", line)
            continue
        index += 1
        difficulty = difficulty_of(row)
        try:
            problem = normalise(spec, row, index, revision, config)
            if problem.id in seen:
                raise Rejected("duplicate_id", problem.id)
        except Rejected as rejected:
            tally.drop(
                spec.name, difficulty, rejected, f"line {line}" if line else f"row {index}", line
            )
            continue
        seen.add(problem.id)
        problems.append(problem)
        tally.keep(spec.name, problem.difficulty)
    return problems, tally


def source_rows(spec: SourceSpec, revision: str) -> Iterator[tuple[int | None, dict | Rejected]]:
    """(line number or None, row) of every row. Through `datasets` (no line numbers); a local
    JSON file it cannot parse (one truncated line fails the whole file there) is read line by
    line instead (`json_lines`)."""
    try:
        rows = read_rows(spec, revision)
    except SourceError:
        if spec.is_hub or spec.uri.endswith(".parquet"):
            raise
        yield from json_lines(spec.uri)
        return
    for row in rows:
        yield None, row if isinstance(row, dict) else {}


def json_lines(uri: str) -> Iterator[tuple[int, dict | Rejected]]:
    """(line number, row) of each non-blank line of a JSON Lines file; a line that is not a JSON
    object is a `Rejected` (not_utf8, invalid_json, not_an_object). SourceError when no line is
    a row (not JSON Lines at all)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    rows, first = 0, None
    with fs.open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.rstrip(b"\r\n").decode("utf-8"))
            except UnicodeDecodeError as exc:
                bad = Rejected("not_utf8", f"byte 0x{raw[exc.start]:02x} (column {exc.start + 1})")
            except json.JSONDecodeError as exc:
                at = exc.msg if exc.msg.endswith(" at") else f"{exc.msg} at"
                bad = Rejected("invalid_json", f"{at} column {exc.colno}")
            else:
                if isinstance(row, dict):
                    rows += 1
                    yield number, row
                    continue
                bad = Rejected("not_an_object", f"a JSON {type(row).__name__}")
            first = first or f"line {number}: {bad}"
            yield number, bad
    if not rows:
        raise SourceError(
            f"source file {uri} has no readable row ({first or 'no line'}): pass a JSON Lines "
            "file (one JSON object a line) or parquet"
        )
