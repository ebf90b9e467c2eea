"""Sources: which rows to read (Hub datasets or local files) and how each schema becomes Problems.

Schemas (`kind`):
- `taco`: TACO / TACO-verified / APPS rows (`question`, `input_output`, `solutions`, ...);
- `cobalt`: the Cobalt release (`osunlp/TACO-Cobalt`, `-PTB`: `test_cases`, optional
  `public_test_cases` / `hidden_test_cases`, `perturbed_public_test_cases`, `modified_test_cases`);
- `lcb`: LiveCodeBench `code_generation_lite` (`private_test_cases` = base64(zlib(pickle(JSON))));
- `codecontests`: `name`, `description`, `tests` {input, output} (or `public_tests` and
  `private_tests`).

Everything goes through `datasets.load_dataset`: local JSONL/parquet files with the `json` /
`parquet` builders, Hub datasets by name, or, for repos that ship a loading script (which
`datasets` no longer runs), their data files through `hf://` paths.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import random
import re
import zlib
from collections.abc import Iterable, Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from sandbox import TestSuite
from sandbox.formats import taco_tests
from tasks.problems import (
    Problem,
    Provenance,
    SourceKind,
    cut_before_examples,
    instruction,
    split_tests,
)
from tasks.tally import Rejected, Tally

Role = Literal["train", "dev", "test"]
KINDS: tuple[str, ...] = ("taco", "cobalt", "lcb", "codecontests")
MAX_PRIVATE_TESTS_BYTES = 1 << 30  # decompressed LiveCodeBench private tests, per problem
ID_FIELD = {"taco": "id", "cobalt": "id", "lcb": "question_id", "codecontests": "name"}


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
            tag = tag or "release_v6"
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


class SourceError(RuntimeError):
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
        builder = "parquet" if spec.uri.endswith(".parquet") else "json"
        return datasets.load_dataset(builder, data_files=spec.uri, split="train")
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


class LoadConfig(BaseModel):
    """How rows become problems."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_tests: int = Field(
        4, ge=0, description="Leading tests that are public (TACO-like rows)."
    )
    max_solutions: int = Field(16, ge=0, description="Reference solutions kept (seeded shuffle).")
    seed: int = Field(0, description="Seed of the solution shuffle.")


def load_problems(
    spec: SourceSpec, revision: str, config: LoadConfig
) -> tuple[list[Problem], Tally]:
    """Normalise every row of a source; malformed rows are counted by reason, never fatal."""
    rows = read_rows(spec, revision)
    problems, tally, seen = [], Tally(), set()
    for index, row in enumerate(_iter(rows)):
        difficulty = _difficulty(row)
        try:
            problem = normalise(spec, row, index, revision, config)
            if problem.id in seen:
                raise Rejected("duplicate_id", problem.id)
        except Rejected as rejected:
            tally.drop(spec.name, difficulty, rejected, f"row {index}")
            continue
        seen.add(problem.id)
        problems.append(problem)
        tally.keep(spec.name, problem.difficulty)
    return problems, tally


def _iter(rows: Iterable[Any]) -> Iterator[dict]:
    for row in rows:
        yield row if isinstance(row, dict) else {}


def normalise(
    spec: SourceSpec, row: dict, index: int, revision: str, config: LoadConfig
) -> Problem:
    """One row as a Problem, or `Rejected` with the reason."""
    parse = {"taco": _taco, "cobalt": _cobalt, "lcb": _lcb, "codecontests": _codecontests}[
        spec.kind
    ]
    fields = parse(row, spec, config)
    native_id = row.get(ID_FIELD[spec.kind])
    native_id = f"row{index}" if native_id in (None, "") else str(native_id)
    problem_id = f"{spec.name}/{native_id}"
    solutions = list(fields.pop("solutions", []))
    random.Random(f"{config.seed}:{problem_id}").shuffle(solutions)
    starter = fields.pop("starter_code", "") or ""
    fn_name = fields["public_tests"].fn_name
    prompt_text = fields.pop("prompt_statement", fields["statement"])
    try:
        return Problem(
            id=problem_id,
            source=spec.name,
            difficulty=_difficulty(row),
            instruction=instruction(prompt_text, fn_name, starter),
            starter_code=starter,
            fn_name=fn_name,
            solutions=solutions[: config.max_solutions],
            provenance=Provenance(
                dataset=spec.dataset,
                revision=revision,
                split=spec.split if spec.is_hub else None,
                row=index,
                kind=spec.kind,
            ),
            **fields,
        )
    except ValidationError as exc:
        raise Rejected("invalid_problem", str(exc.errors()[0].get("msg"))) from None


def _difficulty(row: dict) -> str:
    value = row.get("difficulty")
    return str(value).strip().lower() if value not in (None, "") else "unknown"


def _required(row: dict, field: str) -> Any:
    value = row.get(field)
    if value is None or value == "":
        raise Rejected("missing_field", f"no {field!r}")
    return value


def _text(row: dict, field: str) -> str:
    value = _required(row, field)
    if not isinstance(value, str):
        raise Rejected("missing_field", f"{field!r} is a {type(value).__name__}, not text")
    return value.strip()


def _json(value: Any, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        raise Rejected("bad_tests_json", f"{field} is not valid JSON") from None


def io_tests(io: Any, field: str) -> TestSuite:
    """A TACO-style `{inputs, outputs[, fn_name]}` object as a TestSuite, enforcing SPEC §1.1's
    format rules: lists of equal length; standard-input items are strings (a list item is joined
    with spaces). Call-based arguments and results may be any JSON values."""
    io = _json(io, field)
    if not isinstance(io, dict):
        raise Rejected("bad_tests_json", f"{field} is a {type(io).__name__}, not an object")
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if inputs is None or outputs is None:
        raise Rejected("missing_field", f"{field} has no inputs/outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise Rejected("tests_not_lists", f"{field} inputs/outputs are not lists")
    if len(inputs) != len(outputs):
        raise Rejected("tests_length_mismatch", f"{len(inputs)} inputs, {len(outputs)} outputs")
    if not io.get("fn_name"):
        for item in inputs + outputs:
            if not isinstance(item, str | list):
                raise Rejected("test_item_not_string", f"a test item is a {type(item).__name__}")
    try:
        return taco_tests(io)
    except (ValueError, TypeError) as exc:
        reason = "bad_fn_name" if "fn_name" in str(exc) else "test_item_not_string"
        raise Rejected(reason, str(exc)[:200]) from None


def _solutions(row: dict) -> list[str]:
    value = row.get("solutions")
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise Rejected("bad_solutions", "solutions is not valid JSON") from None
    if isinstance(value, dict):  # CodeContests: {language: [...], solution: [...]}, 3 = Python 3
        value = [
            s
            for lang, s in zip(
                value.get("language") or [], value.get("solution") or [], strict=False
            )
            if lang == 3
        ]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise Rejected("bad_solutions", "solutions is not a list of programs")
    return [s for s in value if s.strip()]


def _taco(row: dict, spec: SourceSpec, config: LoadConfig) -> dict:
    tests = io_tests(_required(row, "input_output"), "input_output")
    public, hidden = split_tests(tests, config.public_tests)
    return {
        "statement": _text(row, "question"),
        "public_tests": public,
        "hidden_tests": hidden,
        "starter_code": row.get("starter_code") or "",
        "solutions": _solutions(row),
    }


def _cobalt(row: dict, spec: SourceSpec, config: LoadConfig) -> dict:
    statement = _text(row, "question") if row.get("question") else _text(row, "instruction")
    if row.get("public_test_cases") is not None and row.get("hidden_test_cases") is not None:
        public = io_tests(row["public_test_cases"], "public_test_cases")
        hidden = io_tests(row["hidden_test_cases"], "hidden_test_cases")
    else:
        public, hidden = split_tests(
            io_tests(_required(row, "test_cases"), "test_cases"), config.public_tests
        )
    fields = {
        "statement": statement,
        "public_tests": public,
        "hidden_tests": hidden,
        "starter_code": row.get("starter_code") or "",
        "solutions": _solutions(row),
    }
    if row.get("perturbed_public_test_cases") is not None:
        fields["perturbed_public_tests"] = io_tests(
            row["perturbed_public_test_cases"], "perturbed_public_test_cases"
        )
        fields["modified_tests"] = io_tests(
            _required(row, "modified_test_cases"), "modified_test_cases"
        )
    return fields


def _codecontests(row: dict, spec: SourceSpec, config: LoadConfig) -> dict:
    if row.get("tests") is not None:
        tests = _cc_tests(row["tests"], "tests")
        public, hidden = split_tests(tests, config.public_tests)
    else:
        public = _cc_tests(_required(row, "public_tests"), "public_tests")
        hidden = _cc_tests(_required(row, "private_tests"), "private_tests")
    return {
        "statement": _text(row, "description"),
        "public_tests": public,
        "hidden_tests": hidden,
        "solutions": _solutions(row),
    }


def _cc_tests(value: Any, field: str) -> TestSuite:
    value = _json(value, field)
    if not isinstance(value, dict):
        raise Rejected("bad_tests_json", f"{field} is not an object")
    return io_tests({"inputs": value.get("input"), "outputs": value.get("output")}, field)


# --- LiveCodeBench ---


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: every global (class, function) is refused, so a payload cannot
    call anything (os.system, eval, ...). LiveCodeBench's payloads are a plain str."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load global {module}.{name}")


def decode_private_tests(text: str) -> list[dict]:
    """LiveCodeBench private tests: base64 -> zlib -> pickle (no globals) -> JSON list."""
    try:
        compressed = base64.b64decode(text)
    except (binascii.Error, ValueError):
        raise Rejected("bad_private_tests", "private_test_cases is not base64") from None
    try:
        inflater = zlib.decompressobj()
        data = inflater.decompress(compressed, MAX_PRIVATE_TESTS_BYTES)
        if inflater.unconsumed_tail:
            raise Rejected("bad_private_tests", "private tests larger than 1 GiB")
    except zlib.error:
        raise Rejected("bad_private_tests", "private_test_cases is not zlib data") from None
    try:
        payload = _NoGlobals(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if "refused to load global" in str(exc):
            raise Rejected("unsafe_pickle", str(exc)) from None
        raise Rejected("bad_private_tests", f"not a pickle ({exc})") from None
    except Exception as exc:  # truncated / corrupt pickles raise many types
        raise Rejected("bad_private_tests", f"not a pickle ({type(exc).__name__})") from None
    if not isinstance(payload, str):
        raise Rejected(
            "bad_private_tests", f"pickle holds a {type(payload).__name__}, not JSON text"
        )
    tests = _json(payload, "private_test_cases")
    if not isinstance(tests, list):
        raise Rejected("bad_private_tests", "private tests are not a list")
    return tests


def _lcb_suite(cases: Any, fn_name: str | None, field: str) -> TestSuite:
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise Rejected("bad_tests_json", f"{field} is not a list of test objects")
    types = {c.get("testtype") for c in cases}
    if types - {"stdin", "functional"}:
        raise Rejected("bad_tests_json", f"{field} has test types {sorted(map(str, types))}")
    if cases and ("functional" in types) != (fn_name is not None):
        raise Rejected("missing_fn_name" if fn_name is None else "mixed_test_types", field)
    inputs, outputs = [c.get("input") for c in cases], [c.get("output") for c in cases]
    if not all(isinstance(x, str) for x in inputs + outputs):
        raise Rejected("test_item_not_string", f"{field} has a non-text input or output")
    try:
        return TestSuite(inputs=inputs, outputs=outputs, fn_name=fn_name)
    except ValidationError:
        raise Rejected("bad_fn_name", repr(fn_name)) from None


def _lcb(row: dict, spec: SourceSpec, config: LoadConfig) -> dict:
    content = _text(row, "question_content")
    contest = row.get("contest_date")
    if spec.date_from or spec.date_to:
        try:
            day = datetime.fromisoformat(str(contest)).date()
        except ValueError:
            raise Rejected("missing_field", f"contest_date {contest!r} is not a date") from None
        if (spec.date_from and day < spec.date_from) or (spec.date_to and day > spec.date_to):
            raise Rejected("outside_date_window", str(day))
    metadata = _json(row.get("metadata") or "{}", "metadata")
    fn_name = (metadata or {}).get("func_name") if isinstance(metadata, dict) else None
    public_cases = _json(_required(row, "public_test_cases"), "public_test_cases")
    if fn_name is None and any(
        isinstance(c, dict) and c.get("testtype") == "functional" for c in public_cases or []
    ):
        raise Rejected("missing_fn_name", "functional tests without metadata.func_name")
    public = _lcb_suite(public_cases, fn_name, "public_test_cases")
    private = decode_private_tests(_text(row, "private_test_cases"))
    hidden = _lcb_suite(private, fn_name, "private_test_cases")
    return {
        "statement": content,
        "prompt_statement": cut_before_examples(content),
        "public_tests": public,
        "hidden_tests": hidden,
        "starter_code": row.get("starter_code") or "",
        "contest_date": str(contest) if contest else None,
    }
