"""Output comparison follows LiveCodeBench's rules (METHOD §3)."""

from __future__ import annotations

import pytest

from sandbox.compare import call_result_matches, parse_json, stdout_matches

# -- standard output -------------------------------------------------------------------------


def test_identical_output_matches():
    assert stdout_matches("1\n2\n", "1\n2\n")


def test_whole_output_is_stripped_before_splitting():
    assert stdout_matches("\n\n  1\n2\n\n\n", "1\n2")
    assert stdout_matches("1\n2", "\n1\n2\n\n")


def test_each_line_is_stripped():
    assert stdout_matches("  1  \n\t2\t\n", "1\n2")
    assert stdout_matches("1 2\r\n3\r\n", "1 2\n3")


def test_line_count_must_match():
    assert not stdout_matches("1\n2\n3", "1\n2")
    assert not stdout_matches("1 2", "1\n2")


def test_blank_lines_inside_the_output_count():
    assert not stdout_matches("1\n\n2", "1\n2")
    assert not stdout_matches("1\n2", "1\n\n2")


def test_spaces_inside_a_line_matter_for_text():
    assert not stdout_matches("a  b", "a b")
    assert not stdout_matches("ab", "a b")


@pytest.mark.parametrize(
    ("got", "want"),
    [("1.0", "1"), ("0.50 2", "0.5 2.00"), ("1e3", "1000"), ("-0", "0"), ("3.14159", "3.141590")],
)
def test_numbers_equal_as_decimals_match(got, want):
    assert stdout_matches(got, want)
    assert stdout_matches(f"x\n{got}", f"x\n{want}")


@pytest.mark.parametrize(
    ("got", "want"),
    [("1.0001", "1"), ("0.5 2", "0.5 2 3"), ("2 0.5", "0.5 2"), ("1", "1.0000000001")],
)
def test_different_numbers_do_not_match(got, want):
    assert not stdout_matches(got, want)


@pytest.mark.parametrize(
    ("got", "want"),
    [("yes", "YES"), ("abc", "abd"), ("1 a", "1.0 b"), ("NaN", "nan"), ("sNaN", "sNaN1")],
)
def test_non_numbers_must_be_equal_as_text(got, want):
    assert not stdout_matches(got, want)


def test_empty_output_matches_only_empty_expectation():
    assert stdout_matches("", "")
    assert stdout_matches("\n \n", "")
    assert not stdout_matches("", "0")
    assert not stdout_matches("0", "")


# -- call-based return values ------------------------------------------------------------------


def test_equal_json_values_match():
    value = '{"a": [1, 2.5, "x", null, true]}'
    assert call_result_matches(value, value)
    assert call_result_matches("[1,2]", "[1, 2]")  # JSON values, not text
    assert not call_result_matches("[2, 1]", "[1, 2]")
    assert not call_result_matches('"1"', "1")


def test_tuples_arrive_as_lists_and_compare_as_lists():
    import json

    assert call_result_matches(json.dumps((1, (2, 3))), "[1, [2, 3]]")


def test_one_element_list_expectation_accepts_the_bare_value():
    """TACO's Codewars outputs are wrapped in a one-element list."""
    assert call_result_matches("9", "[9]")
    assert call_result_matches("[9]", "[9]")
    assert call_result_matches("false", "[false]")
    assert call_result_matches("[1, 2]", "[[1, 2]]")
    assert not call_result_matches("8", "[9]")
    assert not call_result_matches("9", "[9, 9]")
    assert not call_result_matches("[9]", "9")  # the wrapping is only ever on the expected side


def test_result_that_is_not_json_never_matches():
    assert not call_result_matches("not json", '"not json"')
    assert not call_result_matches("", '""')
    assert not call_result_matches("[1, 2", "[1, 2]")
    assert not call_result_matches("[" * 100_000 + "]" * 100_000, "[]")  # RecursionError is caught


def test_bad_expected_json_never_matches():
    assert not call_result_matches("1", "one")


def test_missing_result_never_matches():
    assert not call_result_matches(None, "null")
    assert not call_result_matches(None, "[null]")


def test_parse_json_reports_failure_instead_of_raising():
    assert parse_json("[1]") == (True, [1])
    assert parse_json("{") == (False, None)
