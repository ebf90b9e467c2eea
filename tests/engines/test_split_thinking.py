from engines import split_thinking, thinking_text


def test_keeps_text_after_the_closing_tag():
    text = "<think>\nlet me see\n</think>\n\nHere is the code:\n```python\nprint(1)\n```"
    assert split_thinking(text) == "Here is the code:\n```python\nprint(1)\n```"
    assert thinking_text(text) == "let me see"


def test_template_opened_reasoning_has_only_a_closing_tag():
    assert split_thinking("reasoning without opening tag</think>answer") == "answer"
    assert (
        thinking_text("reasoning without opening tag</think>answer")
        == "reasoning without opening tag"
    )


def test_last_closing_tag_wins():
    assert split_thinking("<think>a</think>b</think> c ") == "c"


def test_unclosed_reasoning_has_no_answer():
    assert split_thinking("<think>I was cut by the token limit") == ""
    assert thinking_text("<think>I was cut by the token limit") is None


def test_plain_text_is_kept():
    assert split_thinking("  no reasoning here\n") == "no reasoning here"
    assert thinking_text("no reasoning here") is None


def test_cap_at_6000_characters():
    answer = "x" * 7000
    assert split_thinking("<think>t</think>" + answer) == "x" * 6000
    assert split_thinking(answer, max_chars=10) == "x" * 10
    assert split_thinking("<think>" + "t" * 9000 + "</think>ok") == "ok"


def test_empty_answer_after_reasoning():
    assert split_thinking("<think>only thoughts</think>\n\n") == ""
