"""TACO/APPS `input_output` fields become TestSuites (checked on the real rows of the sample)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandbox.formats import taco_tests
from sandbox.models import JudgeRequest

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "apps_sample.jsonl"
ROWS = {row["id"]: row for row in map(json.loads, SAMPLE.read_text().splitlines())}


def test_standard_input_row_keeps_its_strings():
    row = ROWS["apps_train_0001"]
    io = json.loads(row["input_output"])
    suite = taco_tests(row["input_output"])
    assert suite.fn_name is None
    assert suite.inputs == io["inputs"] == ["3\n2 2 3\n4 3 7\n10 1 9\n"]
    assert suite.outputs == io["outputs"] == ["1\n6\n-1\n"]


def test_standard_input_row_with_several_tests():
    suite = taco_tests(ROWS["apps_train_2287"]["input_output"])
    assert len(suite.inputs) == len(suite.outputs) == 3
    assert suite.outputs[1] == "No\n"


def test_call_based_row_gives_one_json_argument_per_line():
    suite = taco_tests(ROWS["apps_train_2404"]["input_output"])  # LeetCode findKthPositive
    assert suite.fn_name == "findKthPositive"
    assert suite.inputs == ["[2, 3, 4, 7, 11]\n5"]
    assert suite.outputs == ["9"]


def test_call_based_codewars_row_keeps_the_one_element_list_outputs():
    suite = taco_tests(ROWS["apps_train_4184"]["input_output"])  # Codewars is_prime
    assert suite.fn_name == "is_prime"
    assert suite.inputs[:3] == ["1", "2", "5"]
    assert suite.outputs[:3] == ["[false]", "[true]", "[true]"]
    assert len(suite.inputs) == len(suite.outputs) == 8


def test_every_sample_row_converts_and_makes_valid_requests():
    for row_id, row in ROWS.items():
        suite = taco_tests(row["input_output"])
        assert suite.inputs, row_id
        for code in json.loads(row["solutions"]):
            JudgeRequest(id=row_id, code=code, tests=suite)


def test_dict_input_is_accepted_like_its_json_text():
    io = {"inputs": ["1\n"], "outputs": ["2\n"]}
    assert taco_tests(io) == taco_tests(json.dumps(io))


def test_empty_fn_name_means_standard_input():
    assert taco_tests({"fn_name": "", "inputs": ["1"], "outputs": ["1"]}).fn_name is None


def test_list_items_of_a_standard_input_test_are_joined_with_spaces():
    suite = taco_tests({"inputs": [["1", "2"]], "outputs": [[3]]})
    assert suite.inputs == ["1 2"] and suite.outputs == ["3"]


def test_call_based_scalar_argument_is_one_line():
    suite = taco_tests({"fn_name": "f", "inputs": ["abc", {"k": 1}], "outputs": [1, 2]})
    assert suite.inputs == ['"abc"', '{"k": 1}']
    assert suite.outputs == ["1", "2"]


@pytest.mark.parametrize(
    "io",
    [
        {"inputs": "1\n", "outputs": ["1"]},
        {"inputs": ["1\n"], "outputs": "1"},
        {"inputs": None, "outputs": []},
        {"outputs": ["1"]},
    ],
)
def test_inputs_and_outputs_must_be_lists(io):
    with pytest.raises(ValueError, match=r"inputs and \.outputs must be lists"):
        taco_tests(io)


def test_non_string_standard_input_item_is_an_error():
    with pytest.raises(ValueError, match="is a int, not a string"):
        taco_tests({"inputs": [5], "outputs": ["5"]})


def test_mismatched_lengths_raise_a_validation_error_naming_the_fields():
    with pytest.raises(ValidationError) as info:
        taco_tests({"inputs": ["1", "2"], "outputs": ["1"]})
    message = str(info.value)
    assert "tests.inputs has 2 items" in message and "tests.outputs has 1" in message
    with pytest.raises(ValidationError, match=r"tests\.outputs"):
        taco_tests({"fn_name": "f", "inputs": [[1]], "outputs": [1, 2]})


def test_fn_name_must_be_an_identifier():
    with pytest.raises(ValidationError, match=r"tests\.fn_name"):
        taco_tests({"fn_name": "not a name", "inputs": [[1]], "outputs": [1]})
