"""What the model is shown: the program it is judged on (the last fenced block), the turn's
outcome, and the feedback texts (METHOD §1.2)."""

from __future__ import annotations

import pytest

from cobalt.trajectories.prompts import (
    SYSTEM_PROMPT,
    extract_code,
    failed_feedback,
    no_code_feedback,
    passed_feedback,
)
from cobalt.trajectories.records import Record, Sample, Turn, make_turn
from engines import Completion


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\nprint(1)\n```", "print(1)"),
        ("plain:\n```\nprint(2)\n```\n", "print(2)"),
        (
            "first\n```python\nprint(1)\n```\nthen the fix\n```python\nprint(3)\n```\ndone",
            "print(3)",
        ),
        # sample output in an untagged block after the program does not displace it
        ("```python\nprint(4)\n```\nOutput:\n```\n4\n```", "print(4)"),
        ("```py\nx = 1\n```", "x = 1"),
        ("```Python3  \nx = 2\n```", "x = 2"),
        # other languages never count; an untagged block does
        ("```bash\nls\n```\n```\nprint(5)\n```", "print(5)"),
        ("```text\n5\n```", None),
        ("no code at all", None),
        ("", None),
        # cut by the token limit: an unclosed fence is no block
        ("```python\nprint(6)\n", None),
        ("```python\n```", ""),
        ("```python\nprint('`')\nx = '``'\n```", "print('`')\nx = '``'"),
    ],
)
def test_extract_code_takes_the_last_python_block(text, code):
    assert extract_code(text) == code


def completion(text: str, finish: str = "stop", **kw) -> Completion:
    return Completion(text=text, finish_reason=finish, **kw)


def test_make_turn_strips_thinking_caps_the_answer_and_classifies():
    turn = make_turn(
        0,
        completion(
            "<think>```python\nprint(0)\n```</think>\nok\n```python\nprint(1)\n```",
            prompt_tokens=5,
            completion_tokens=9,
        ),
    )
    assert turn.answer.startswith("ok") and turn.code == "print(1)" and turn.outcome == "code"
    assert turn.response.startswith("<think>") and turn.usage.completion_tokens == 9
    # reasoning only (no answer after </think>) is no code, even if the reasoning had some
    assert make_turn(0, completion("<think>```python\nprint(0)\n```</think>")).outcome == "empty"
    assert make_turn(0, completion("<think>still thinking", "length")).outcome == "empty"
    assert make_turn(0, completion("")).outcome == "empty"
    assert make_turn(0, completion("I cannot help with that.")).outcome == "no_code"
    assert make_turn(0, completion("```python\nwhile True:", "length")).outcome == "truncated"
    # the conversation keeps 6000 characters, but the program comes from the whole answer (a
    # long explanation before the code does not cost the code)
    capped = make_turn(0, completion("x" * 7000 + "\n```python\nprint(1)\n```"))
    assert len(capped.answer) == 6000 and capped.code == "print(1)" and capped.outcome == "code"
    assert make_turn(0, completion("a" * 50), max_answer_chars=10).answer == "a" * 10


def test_engine_errors_are_outcomes_and_context_errors_are_told_apart():
    error = make_turn(2, Completion.failed("APIConnectionError: connection refused"))
    assert (error.outcome, error.code, error.turn) == ("engine_error", None, 2)
    overflow = make_turn(
        1,
        Completion.failed(
            "ContextWindowExceededError: This model's maximum context length is 8192 tokens"
        ),
    )
    assert overflow.outcome == "context_overflow" and "8192" in overflow.error


def test_feedback_texts():
    report = "Input:\n1\nProgram output:\n3\nExpected output:\n2"
    text = failed_feedback(report, 0, 4)
    assert text.startswith("Your program was run on the public tests and failed test 1 of 4.")
    assert report in text
    for ask in (
        "Analyse",
        "trace",
        "cite the lines",
        "complete",
        "```python",
        "not only the edited lines",
    ):
        assert ask in text
    passed = passed_feedback(4)
    assert "passed all 4 public tests" in passed and "hidden tests" in passed
    assert "edge cases" in passed and "```python" in passed
    assert "no public tests" in passed_feedback(0)
    assert "no fenced code block" in no_code_feedback()


def test_system_prompt_names_the_rules():
    for rule in (
        "read-only",
        "memory",
        "fork",
        "subprocess",
        "signals",
        "walk",
        "psutil",
        "resource",
        "ipdb",
        "tkinter",
        "joblib",
    ):
        assert rule in SYSTEM_PROMPT


def test_record_rebuilds_the_conversation():
    turns = [
        Turn(turn=0, answer="a0", outcome="no_code", feedback="f0"),
        Turn(turn=1, answer="a1", outcome="no_code", feedback="f1"),
    ]
    record = Record(
        problem_id="p",
        stage="multiturn",
        system="S",
        instruction="I",
        samples=[Sample(index=0, turns=turns)],
    )
    assert [m["content"] for m in record.conversation(0, 1)] == ["S", "I", "a0", "f0", "a1", "f1"]
    assert [m["content"] for m in record.conversation(0, 1, with_feedback=False)] == [
        "S",
        "I",
        "a0",
        "f0",
        "a1",
    ]
    assert [m["role"] for m in record.conversation(0, 0)] == ["system", "user", "assistant", "user"]
