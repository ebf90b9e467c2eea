"""Which rows to read: a source named by the user (`SourceSpec`, parsed from
`URI[:KIND][?key=value&...]`), the Hub datasets known by name (`HUB`) and LiveCodeBench's release
files. Reading the rows is `cobalt/data/sources.py`; turning them into problems,
`cobalt/data/schemas.py`; both take a `SourceSpec` from here.
"""

from __future__ import annotations

import re
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

from cobalt.problems import SourceKind

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
            tag = tag or "v6"  # METHOD §1.1: release v6's problems alone (test6.jsonl)
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
