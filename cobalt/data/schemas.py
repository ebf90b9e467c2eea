"""How each source schema's rows become `Problem`s (`normalise`), one converter per kind:

- `taco`: TACO / TACO-verified / APPS rows (`question`, `input_output`, `solutions`, ...);
- `cobalt`: the Cobalt release (`osunlp/TACO-Cobalt`, `-PTB`: `test_cases`, optional
  `public_test_cases` / `hidden_test_cases`, `perturbed_public_test_cases`, `modified_test_cases`);
- `lcb`: LiveCodeBench `code_generation_lite` (`private_test_cases` = base64(zlib(pickle(JSON))),
  decoded by an unpickler that refuses every global);
- `codecontests`: `name`, `description`, `tests` {input, output} (or `public_tests` and
  `private_tests`).

A malformed row raises `Rejected` with its reason (counted by the data stage, never fatal).
Which rows are read is `cobalt/data/source_spec.py` (the spec) and `cobalt/data/sources.py`.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import random
import zlib
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cobalt.data.source_spec import SourceSpec
from cobalt.data.tally import Rejected
from cobalt.problems import Problem, Provenance, cut_before_examples, instruction, split_tests
from sandbox import TestSuite
from sandbox.formats import taco_tests

MAX_PRIVATE_TESTS_BYTES = 1 << 30  # decompressed LiveCodeBench private tests, per problem
ID_FIELD = {"taco": "id", "cobalt": "id", "lcb": "question_id", "codecontests": "name"}


class LoadConfig(BaseModel):
    """How rows become problems."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_tests: int = Field(
        4, ge=0, description="Leading tests that are public (TACO-like rows)."
    )
    max_solutions: int = Field(16, ge=0, description="Reference solutions kept (seeded shuffle).")
    seed: int = Field(0, description="Seed of the solution shuffle.")


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
            difficulty=difficulty_of(row),
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


def difficulty_of(row: dict) -> str:
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
    """A TACO-style `{inputs, outputs[, fn_name]}` object as a TestSuite, enforcing METHOD §1.1's
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
