"""Reports of failing tests, as the feedback turn shows them to the model (METHOD §1.2)."""

from __future__ import annotations

from sandbox.feedback import PART_LIMIT, truncate_middle
from sandbox.feedback import test_report as report_of


def test_short_text_is_kept_whole():
    text = "x" * PART_LIMIT
    assert truncate_middle(text) == text


def test_long_text_keeps_head_and_tail_within_the_budget():
    text = "".join(f"{i:05d}" for i in range(2000))  # 10,000 distinct characters
    cut = truncate_middle(text)
    head, note, tail = cut.split("\n")
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + len(tail) == PART_LIMIT
    assert len(head) == PART_LIMIT // 2
    assert note == f"... ({len(text) - PART_LIMIT} characters cut) ..."
    assert text[len(head) : len(text) - len(tail)] not in cut


def test_truncation_respects_a_custom_limit():
    cut = truncate_middle("a" * 50 + "b" * 50, limit=10)
    assert cut.startswith("aaaaa\n") and cut.endswith("\nbbbbb")
    assert "90 characters cut" in cut


def test_passed_test_has_no_report():
    assert report_of("passed", "1\n", "2") == ""


def test_wrong_answer_report_shows_input_output_and_expected():
    report = report_of("wrong_answer", "3 4\n", "7", stdout="8\n")
    assert report == "Input:\n3 4\n\nProgram output:\n8\n\nExpected output:\n7"


def test_wrong_answer_report_cuts_each_part_in_the_middle():
    big_input, big_output = "1 " * 1000, "9" * 5000
    report = report_of("wrong_answer", big_input, "2", stdout=big_output)
    assert len(report) < 3 * PART_LIMIT + 200
    assert "characters cut" in report
    assert report.count("9") == PART_LIMIT


def test_runtime_error_report_shows_the_error():
    stderr = 'Traceback (most recent call last):\n  File "solution.py", line 1\nZeroDivisionError\n'
    report = report_of("runtime_error", "5\n", "1", stderr=stderr)
    assert report.startswith("Input:\n5\n")
    assert "The program crashed:" in report
    assert "ZeroDivisionError" in report
    assert "Expected output" not in report  # an error is not compared with the answer


def test_runtime_error_without_stderr_says_it_exited_with_an_error():
    report = report_of("runtime_error", "5\n", "1")
    assert "The program exited with an error." in report


def test_timeout_report_names_the_limit():
    report = report_of("timeout", "5\n", "1", timeout_s=4.0)
    assert "exceeded the time limit of 4 seconds" in report
    report = report_of("timeout", "5\n", "1", timeout_s=1.5)
    assert "time limit of 1.5 seconds" in report


def test_output_and_memory_limit_reports():
    assert "printed more than 1024 bytes" in report_of("output_limit", "", "", output_bytes=1024)
    report = report_of("memory_limit", "", "", stderr="MemoryError\n")
    assert "exceeded the memory limit" in report and "MemoryError" in report


def test_syntax_error_report_is_the_compiler_message_only():
    report = report_of("syntax_error", "1\n", "2", stderr="SyntaxError: invalid syntax\n")
    assert report == "The program does not compile:\nSyntaxError: invalid syntax"


def test_skipped_and_sandbox_error_reports():
    assert "time for the whole test suite ran out" in report_of("skipped", "1", "2")
    assert "sandbox failed" in report_of("sandbox_error", "1", "2")


def test_call_based_report_labels_arguments_and_returned_value():
    report = report_of("wrong_answer", "[1, 2]\n3", "[9]", result="8", fn_name="solve")
    assert report.splitlines() == [
        "Arguments of solve (one JSON value per line):",
        "[1, 2]",
        "3",
        "Returned value:",
        "8",
        "Expected output:",
        "[9]",
    ]


def test_call_based_report_without_a_result():
    report = report_of("wrong_answer", "1", "2", stdout="printed", result=None, fn_name="f")
    assert "Returned value:\n\nExpected output:" in report
    assert "printed" not in report  # printed text is not the return value
