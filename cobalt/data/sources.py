"""Sources: which rows to read (Hub datasets or local files, `SourceSpec`), reading them, and
`load_problems` (rows -> `Problem`s through the schema converters of `cobalt/data/schemas.py`:
taco, cobalt, lcb, codecontests).

Everything goes through `datasets.load_dataset`: local JSONL/parquet files with the `json` /
`parquet` builders, Hub datasets by name, or, for repos that ship a loading script (which
`datasets` no longer runs), their data files through `hf://` paths.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from cobalt.data.schemas import LoadConfig, difficulty_of, normalise
from cobalt.data.tally import Rejected, Tally
from cobalt.errors import UserError
from cobalt.problems import (
    Problem,
    SourceKind,
)

Role = Literal["train", "dev", "test"]
KINDS: tuple[str, ...] = ("taco", "cobalt", "lcb", "codecontests")


class HubDataset(BaseModel):
    kind: SourceKind
    name: str
    builder: str | None = Field(None, description="Load data files with this builder (no script).")
    files: str | None = Field(None, description="Data file pattern; {split} is substituted.")


HUB: dict[str, HubDataset] = {
    "BAAI/TACO": HubDataset(kind="taco", name="taco", builder="arrow", files="{split}/*.arrow"),
    "likaixin/TACO-verified": HubDataset(kind="taco", name="taco-verified"),
    "osunlp/TACO-Cobalt": HubDataset(kind="cobalt", name="cobalt"),
    "osunlp/TACO-Cobalt-PTB": HubDataset(kind="cobalt", name="cobalt-ptb"),
    "livecodebench/code_generation_lite": HubDataset(kind="lcb", name="lcb", builder="json"),
}


def lcb_files(version_tag: str) -> list[str]:
    """LiveCodeBench data files of a tag: `release_vN` = test.jsonl..testN.jsonl (cumulative),
    `vN` = that release's file alone (`v6` -> test6.jsonl, the paper's test set),
    `release_latest` = every release file at the resolved revision."""
    if version_tag == "release_latest":
        return ["test*.jsonl"]
    match = re.fullmatch(r"(release_)?v(\d+)", version_tag)
    if not match:
        raise ValueError(
            f"version_tag {version_tag!r}: use release_vN (cumulative), vN (alone), release_latest"
        )
    n = int(match.group(2))
    name = lambda i: "test.jsonl" if i == 1 else f"test{i}.jsonl"  # noqa: E731
    return [name(i) for i in range(1, n + 1)] if match.group(1) else [name(n)]


class SourceSpec(BaseModel):
    """One source of rows. From the CLI: `URI[:KIND][?key=value&...]`, e.g.
    `samples/apps_sample.jsonl:taco`, `hf:likaixin/TACO-verified`,
    `hf:livecodebench/code_generation_lite?version_tag=v6&date_from=2025-02-01`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(
        description="A local JSONL/parquet file (or fsspec URL), or 'hf:<owner>/<name>'."
    )
    kind: SourceKind | None = Field(None, description="Row schema; inferred when left out.")
    name: str | None = Field(None, description="Short name used in ids and reports.")
    role: Role | None = Field(
        None,
        description="train: split into train/dev; dev or test: kept whole. Default: test for "
        "lcb, else train.",
    )
    split: str = Field("train", description="Hub split to read.")
    revision: str = Field("main", description="Hub revision (branch, tag or commit).")
    version_tag: str | None = Field(None, description="LiveCodeBench on the Hub: release_vN or vN.")
    date_from: date | None = Field(None, description="LiveCodeBench: first contest date kept.")
    date_to: date | None = Field(None, description="LiveCodeBench: last contest date kept.")

    @model_validator(mode="after")
    def _defaults(self) -> SourceSpec:
        hub = HUB.get(self.dataset) if self.is_hub else None
        kind = self.kind or (hub.kind if hub else None)
        if self.is_hub and kind is None:
            raise ValueError(f"source {self.uri}: give its schema, e.g. {self.uri}:taco")
        name = self.name or (hub.name if hub else _stem(self.uri))
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ValueError(f"source name {name!r}: use letters, digits, '_', '.', '-'")
        tag = self.version_tag
        if self.is_hub and self.dataset == "livecodebench/code_generation_lite":
            tag = tag or "v6"  # SPEC §1.1: release v6's problems alone (test6.jsonl)
            lcb_files(tag)  # validates
        elif tag is not None:
            raise ValueError("version_tag only applies to livecodebench/code_generation_lite")
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError("date_from is after date_to")
        role = self.role or ("test" if kind == "lcb" else "train") if kind else self.role
        for field, value in (("kind", kind), ("name", name), ("version_tag", tag), ("role", role)):
            object.__setattr__(self, field, value)
        return self

    @property
    def is_hub(self) -> bool:
        return self.uri.startswith("hf:") and not self.uri.startswith("hf://")

    @property
    def dataset(self) -> str:
        return self.uri.removeprefix("hf:") if self.is_hub else self.uri

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        """`URI[:KIND][?key=value&...]` -> SourceSpec."""
        text, _, query = text.partition("?")
        fields: dict[str, Any] = dict(
            parse_qsl(query, keep_blank_values=False, strict_parsing=bool(query))
        )
        head, sep, tail = text.rpartition(":")
        if sep and tail in KINDS:
            fields["kind"], text = tail, head
        return cls(uri=text, **fields)

    def with_kind(self, kind: SourceKind) -> SourceSpec:
        return SourceSpec(
            **{
                **self.model_dump(exclude={"kind", "role", "name"}),
                "kind": kind,
                "role": self.role,
                "name": self.name,
            }
        )


def parse_sources(value: Any) -> Any:
    """Sources as given (SourceSpec objects, dicts or 'URI[:KIND][?key=value]' strings)."""
    if isinstance(value, list):
        return [SourceSpec.parse(v) if isinstance(v, str) else v for v in value]
    return value


Sources = Annotated[list[SourceSpec], BeforeValidator(parse_sources)]


def _stem(uri: str) -> str:
    stem = Path(uri.split("?")[0]).name.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "source"


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
