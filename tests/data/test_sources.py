"""Rows -> problems: schemas, malformed rows, LiveCodeBench decoding, instructions, parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from data_helpers import SAMPLES, CallsSystem, encode_private, write_jsonl

from cobalt.data.schemas import decode_private_tests
from cobalt.data.sources import (
    LoadConfig,
    SourceError,
    SourceSpec,
    infer_kind,
    lcb_files,
    load_problems,
)
from cobalt.data.tally import Rejected
from cobalt.problems import Problem, Provenance, from_table, instruction, to_table
from sandbox import TestSuite as Suite


def load(path: Path, kind: str, **config):
    spec = SourceSpec(uri=str(path), kind=kind)
    problems, tally = load_problems(spec, "sha256:test", LoadConfig(**config))
    reasons = {o: n for (_, _, o), n in tally.counts.items() if o != "kept"}
    return problems, reasons


def test_lcb_native_record_decodes_to_four_hidden_tests(lcb_native):
    tests = decode_private_tests(lcb_native["private_test_cases"])
    assert len(tests) == 4
    assert tests[0] == {"input": "1\nabc\n", "output": "YES\n", "testtype": "stdin"}

    problems, reasons = load(SAMPLES / "lcb_native_record.json", "lcb")
    (p,) = problems
    assert (p.id, p.difficulty, reasons) == ("lcb_native_record/1873_A", "easy", {})
    assert len(p.public_tests.inputs) == 1 and len(p.hidden_tests.inputs) == 4
    assert p.hidden_tests.inputs[0] == "1\nabc\n"


def test_hostile_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    payload = encode_private(CallsSystem(f"touch {marker}"))
    with pytest.raises(Rejected) as err:
        decode_private_tests(payload)
    assert err.value.reason == "unsafe_pickle"
    assert "refused to load global" in str(err.value) and "system" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload, detail",
    [
        ("!!! not base64 !!!", "base64"),
        ("aGVsbG8=", "zlib"),  # base64 of b"hello"
        (encode_private(["not", "a", "string"]), "list"),
        (encode_private("{not json"), "JSON"),
    ],
)
def test_bad_private_tests_are_rejected(payload, detail):
    with pytest.raises(Rejected) as err:
        decode_private_tests(payload)
    assert err.value.reason in {"bad_private_tests", "bad_tests_json"}
    assert detail in str(err.value)


def test_malformed_taco_rows_are_counted_not_fatal(tmp_path, taco_row):
    def io(inputs, outputs):
        return json.dumps({"inputs": inputs, "outputs": outputs})

    rows = [
        taco_row,
        {**taco_row, "id": "no-question", "question": None},
        {**taco_row, "id": "bad-json", "input_output": "{not json"},
        {**taco_row, "id": "not-lists", "input_output": io("1\n", "2\n")},
        {**taco_row, "id": "mismatch", "input_output": io(["1\n", "2\n"], ["2\n"])},
        {**taco_row, "id": "ints", "input_output": io([1, 2], ["2", "4"])},
        {**taco_row, "id": "bad-solutions", "solutions": "[not json"},
        {**taco_row},  # same id again
        {**taco_row, "id": "joined", "input_output": io([["1", "2"]], [["3"]])},
    ]
    problems, reasons = load(write_jsonl(tmp_path / "taco.jsonl", rows), "taco")
    assert reasons == {
        "missing_field": 1,
        "bad_tests_json": 1,
        "tests_not_lists": 1,
        "tests_length_mismatch": 1,
        "test_item_not_string": 1,
        "bad_solutions": 1,
        "duplicate_id": 1,
    }
    assert [p.id for p in problems] == ["taco/double", "taco/joined"]
    joined = problems[1]
    assert joined.public_tests.inputs == ["1 2"] and joined.public_tests.outputs == ["3"]


def test_unreadable_lines_are_counted_with_their_line_numbers(tmp_path, taco_row):
    """One truncated line fails the whole file in `datasets`; it is then read line by line: each
    line that is not a JSON object is dropped by reason with its line number, the rest kept."""
    rows = [json.dumps({**taco_row, "id": f"p{i}"}).encode() for i in range(4)]
    path = tmp_path / "broken.jsonl"
    path.write_bytes(
        b"\n".join([rows[0], rows[1][:80], b"", rows[2], b'{"id": "caf\xe9"}', b"[1, 2]", rows[3]])
        + b"\n"
    )
    spec = SourceSpec(uri=str(path), kind="taco")
    problems, tally = load_problems(spec, "sha256:test", LoadConfig())
    assert [p.id for p in problems] == ["broken/p0", "broken/p2", "broken/p3"]
    drops = {o: n for (_, _, o), n in tally.counts.items() if o != "kept"}
    assert drops == {"invalid_json": 1, "not_utf8": 1, "not_an_object": 1}
    assert tally.lines == {
        ("broken", "unknown", "invalid_json"): [2],
        ("broken", "unknown", "not_utf8"): [5],
        ("broken", "unknown", "not_an_object"): [6],
    }
    assert tally.examples[("broken", "not_utf8")] == "line 5: byte 0xe9 (column 12)"
    assert tally.examples[("broken", "invalid_json")].startswith(
        "line 2: Unterminated string starting at column"
    )


def test_a_file_with_no_readable_row_is_the_fatal_case(tmp_path):
    path = tmp_path / "junk.jsonl"
    path.write_bytes(b"not json\n\xff\xfe\n[1]\n")
    with pytest.raises(
        SourceError,
        match=r"junk\.jsonl has no readable row \(line 1: invalid_json: Expecting value at column 1\)",
    ):
        load(path, "taco")


def test_taco_row_becomes_a_problem(tmp_path, taco_row):
    (p,), _ = load(write_jsonl(tmp_path / "t.jsonl", [taco_row]), "taco", public_tests=4)
    assert len(p.public_tests.inputs) == 4 and len(p.hidden_tests.inputs) == 6
    assert p.tests.inputs == [f"{i}\n" for i in range(10)]
    assert sorted(p.solutions) == sorted(json.loads(taco_row["solutions"]))
    assert p.difficulty == "easy" and p.verification == "not_run"
    assert p.provenance == Provenance(
        dataset=str(tmp_path / "t.jsonl"), revision="sha256:test", row=0, kind="taco"
    )


def test_call_based_taco_sample(tmp_path):
    problems, _ = load(SAMPLES / "apps_sample.jsonl", "taco")
    call = next(p for p in problems if p.fn_name)
    assert call.fn_name == "findKthPositive" and "class Solution" in call.starter_code
    assert call.public_tests.fn_name == call.hidden_tests.fn_name == "findKthPositive"
    assert "`findKthPositive`" in call.instruction and "Starter code:" in call.instruction


def test_lcb_rows_functional_and_window(tmp_path, lcb_native):
    rows = [json.loads(line) for line in (SAMPLES / "lcb_sample.jsonl").read_text().splitlines()]
    problems, reasons = load(SAMPLES / "lcb_sample.jsonl", "lcb")
    assert len(problems) == len(rows) and reasons == {}
    functional = [p for p in problems if p.fn_name]
    assert functional and all(p.starter_code for p in functional)
    p = functional[0]
    assert json.loads(p.public_tests.inputs[0].split("\n")[0]) is not None  # JSON per line

    spec = SourceSpec(
        uri=str(SAMPLES / "lcb_sample.jsonl"),
        kind="lcb",
        date_from="2024-08-01",
        date_to="2024-12-31",
    )
    kept, tally = load_problems(spec, "sha256:test", LoadConfig())
    assert kept and all("2024-08-01" <= p.contest_date[:10] <= "2024-12-31" for p in kept)
    dropped = sum(n for (_, _, o), n in tally.counts.items() if o == "outside_date_window")
    assert dropped == len(rows) - len(kept)


def test_lcb_statement_is_cut_before_the_first_example():
    statement = "Find x.\n\nInput\n\nOne line.\nSample Input 1\n\n3\n\nSample Output 1\n\n6"
    prompt = instruction(statement[: statement.find("\nSample")])
    assert "Sample Input" not in prompt
    from cobalt.problems import cut_before_examples

    assert cut_before_examples(statement) == "Find x.\n\nInput\n\nOne line."
    assert cut_before_examples("A\nExample 1:\n\nInput: x") == "A"


def test_instruction_wording():
    stdin = instruction("Add two numbers.")
    assert "step by step" in stdin and "```python" in stdin and "standard input" in stdin
    call = instruction("Add.", "add", "class Solution:\n    def add(self, a, b):\n        ")
    assert "`add`" in call and "Starter code:\n```python\nclass Solution:" in call


def test_codecontests_sample_and_schema_inference():
    problems, reasons = load(SAMPLES / "codecontests_sample.jsonl", "codecontests")
    assert len(problems) == 165 and reasons == {}
    assert problems[0].solutions == [] and problems[0].difficulty == "unknown"
    assert infer_kind(["name", "description", "tests"]) == "codecontests"
    assert infer_kind(["question", "input_output", "solutions"]) == "taco"
    assert infer_kind(["question_content", "private_test_cases"]) == "lcb"
    assert infer_kind(["id", "test_cases", "question"]) == "cobalt"


def test_cobalt_rows_with_perturbed_tests(tmp_path):
    tests = {"inputs": [f"{i}\n" for i in range(6)], "outputs": [f"{i}\n" for i in range(6)]}
    row = {
        "id": 7,
        "difficulty": "MEDIUM",
        "question": "Echo the number you read. " * 5,
        "test_cases": json.dumps(tests),
        "perturbed_public_test_cases": json.dumps(
            {"inputs": ["0\n", "1\n"], "outputs": ["1\n", "0\n"]}
        ),
        "modified_test_cases": json.dumps({"inputs": ["0\n", "1\n"], "outputs": ["1\n", "0\n"]}),
    }
    (p,), reasons = load(write_jsonl(tmp_path / "ptb.jsonl", [row]), "cobalt")
    assert reasons == {} and p.id == "ptb/7"
    assert p.public_tests.inputs == tests["inputs"][:4]
    assert p.feedback_tests.outputs == ["1\n", "0\n"] and p.modified_tests is not None


def test_source_spec_parsing():
    spec = SourceSpec.parse("samples/apps_sample.jsonl:taco")
    assert (spec.uri, spec.kind, spec.name, spec.role) == (
        "samples/apps_sample.jsonl",
        "taco",
        "apps_sample",
        "train",
    )
    lcb = SourceSpec.parse(
        "hf:livecodebench/code_generation_lite?version_tag=v6&date_from=2025-02-01"
    )
    assert (lcb.kind, lcb.name, lcb.role, lcb.version_tag, str(lcb.date_from)) == (
        "lcb",
        "lcb",
        "test",
        "v6",
        "2025-02-01",
    )
    # METHOD §1.1: the paper evaluates on release v6's problems (test6.jsonl), not every release
    assert SourceSpec.parse("hf:livecodebench/code_generation_lite").version_tag == "v6"
    assert SourceSpec.parse("s3://b/x.parquet:cobalt?name=ptb&role=dev").role == "dev"
    assert lcb_files("v6") == ["test6.jsonl"]
    assert lcb_files("release_latest") == ["test*.jsonl"]
    assert lcb_files("release_v3") == ["test.jsonl", "test2.jsonl", "test3.jsonl"]
    with pytest.raises(ValueError, match="give its schema"):
        SourceSpec.parse("hf:someone/unknown")
    with pytest.raises(ValueError, match="version_tag"):
        SourceSpec.parse("x.jsonl:taco?version_tag=v6")


def test_parquet_round_trip_is_exact():
    suite = Suite(inputs=["1 2\n", "ünï\x00code\n", ""], outputs=["3", "", "x"])
    problem = Problem(
        id="s/1",
        source="s",
        difficulty="hard",
        statement="Add.\n",
        instruction="Do it",
        public_tests=suite,
        hidden_tests=Suite(inputs=[], outputs=[]),
        solutions=["print(1)"],
        verification="passed",
        contest_date=None,
        perturbed_public_tests=suite,
        modified_tests=Suite(inputs=["a"], outputs=["b"]),
        provenance=Provenance(dataset="d", revision="r", split=None, row=3, kind="taco"),
    )
    call = problem.model_copy(
        update={
            "id": "s/2",
            "fn_name": "f",
            "starter_code": "def f(a):\n    ",
            "public_tests": Suite(inputs=["[1, 2]"], outputs=["[3]"], fn_name="f"),
            "hidden_tests": Suite(inputs=[], outputs=[], fn_name="f"),
            "perturbed_public_tests": None,
            "modified_tests": None,
        }
    )
    table = to_table([problem, call])
    sink = pa.BufferOutputStream()
    import pyarrow.parquet as pq

    pq.write_table(table, sink)
    back = from_table(pq.read_table(pa.BufferReader(sink.getvalue())))
    assert back == [problem, call]
