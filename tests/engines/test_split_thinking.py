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


def test_a_template_that_opens_thinking_makes_a_cut_response_unanswered():
    """R1-Distill's template ends the generation prompt with `<think>`: the model writes only
    `</think>`. With the opened tag put back, a response cut before `</think>` has no answer (its
    reasoning's code is never judged), and a finished one keeps the text after `</think>`."""
    from engines import opens_thinking, with_open_thinking

    assert opens_thinking("<|User|>hi<|Assistant|><think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off
    assert not opens_thinking("<|im_start|>assistant\n")
    cut = "Let me write ```python\nprint(1)\n``` and check"
    assert split_thinking(cut) == cut  # without knowing the template: taken as the answer
    assert split_thinking(with_open_thinking(cut, True)) == ""
    done = "reasoning</think>\n```python\nprint(2)\n```"
    assert split_thinking(with_open_thinking(done, True)) == "```python\nprint(2)\n```"
    assert with_open_thinking(done, False) == done


def test_template_opens_thinking_reads_the_chat_template(tiny_model):
    """On a real tokenizer: its own template opens nothing; an R1-style template (the generation
    prompt ends with `<think>`) does."""
    from transformers import AutoTokenizer

    from engines.thinking import template_opens_thinking

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert not template_opens_thinking(tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}"
    )
    assert template_opens_thinking(tokenizer)
