"""The Cobalt reward (METHOD §1.5) against hand-computed values."""

from __future__ import annotations

import math

import pytest

from cobalt.training.method.cobalt_reward import (
    correctness_reward,
    format_reward,
    has_repetition,
    keyword_bonus,
    total_reward,
    validation_reward,
)


def words(text: str) -> int:  # a fixed "tokenizer": whitespace-separated words
    return len(text.split())


GOOD = "I think it works </think>Here:\n```python\nprint(1)\n```\nDone."


@pytest.mark.parametrize(
    ("p", "b", "expected"),
    [
        (1.0, 0.5, 1.0),  # solved: 1.0, no bonus since p == 1
        (0.6, 0.0, 0.2),  # p >= 0.5
        (0.3, 0.0, 0.0),  # 0 < p < 0.5
        (0.0, 0.0, -0.1),  # p == 0
        (0.75, 0.5, 0.25),  # 0.2 + 0.1 * (0.75 - 0.5) / (1 - 0.5) = 0.2 + 0.05
        (0.25, 0.5, -0.15),  # regression: -0.1 + 0.1 * (0.25 - 0.5) / 0.5 = -0.1 - 0.05
        (0.5, 0.5, -0.1),  # no change: -0.1 + 0.1 * 0 / 0.5
        (0.0, 0.25, -0.2),  # -0.1 + 0.1 * (0 - 0.25) / 0.25 = -0.2
        (0.4, 0.2, 0.025),  # 0.0 + 0.1 * (0.4 - 0.2) / (1 - 0.2) = 0.025
    ],
)
def test_correctness_table(p: float, b: float, expected: float) -> None:
    assert correctness_reward(p, b, training=True) == pytest.approx(expected)


def test_no_code_train_vs_validation() -> None:
    assert correctness_reward(None, 0.5, training=True) == -1.0
    assert correctness_reward(None, 0.5, training=False) == 0.0


def test_validation_reward() -> None:
    assert validation_reward(1.0) == 1.0
    assert validation_reward(0.99) == 0.0
    assert validation_reward(None) == 0.0


def test_format_ok_correct_is_zero() -> None:
    assert format_reward(GOOD, words, correct=True) == 0.0


def test_repetition() -> None:
    block = "x" * 31 + "y"  # 32 characters
    assert has_repetition("start " + block * 8 + " end")
    assert not has_repetition("start " + block * 7 + " end")  # only 7 in a row
    # period 31 repeated 15 times = period 62 only 7.5 times: below 32 chars it does not count
    assert not has_repetition(("x" * 30 + "y") * 15)
    assert has_repetition(("x" * 30 + "y") * 16)  # 8 x a 62-character block
    assert format_reward(block * 8 + GOOD, words, correct=True) == -0.9


def test_repetition_is_the_regexs_answer_on_random_texts() -> None:
    """The vectorised check agrees with its definition, `(.{32,}?)\\1{7,}`, on texts of small
    alphabets (where chance repeats happen) with and without a repeated block planted."""
    import random
    import re

    regex = re.compile(r"(.{32,}?)\1{7,}", re.S)
    rng = random.Random(0)
    found = 0
    for _ in range(150):
        alphabet = "ab( )=\n+x"[: rng.randrange(2, 10)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(250, 1500)))
        if rng.random() < 0.4:
            block = "".join(rng.choice(alphabet) for _ in range(rng.randrange(28, 45)))
            at = rng.randrange(len(text))
            text = text[:at] + block * rng.randrange(6, 10) + text[at:]
        expected = regex.search(text) is not None
        found += expected
        assert has_repetition(text) == expected, text
    assert 10 < found < 140  # both answers were exercised


@pytest.mark.parametrize(
    "response",
    [
        "a </think> b </think>Here:\n```python\nprint(1)\n```",  # two </think>
        "no think tag\n```python\nprint(1)\n```",  # no </think>
        "t </think>```python\nprint(`1`)\n```",  # backtick inside the code
        "t </think>```python\nx = 1\n```\n```python\ny = 2\n```",  # two blocks
        "t </think>```bash\nls\n```",  # not python
        "t </think>```python\nprint(1)\n",  # unclosed fence
        "t </think>```python\nprint(1)\n```\n```text\n1\n",  # an unclosed fence after it
    ],
)
def test_format_broken(response: str) -> None:
    assert format_reward(response, words, correct=True) == -0.9
    assert format_reward(response, words, correct=False) == -0.9


def test_an_extra_block_in_the_explanation_is_not_broken() -> None:
    """METHOD §1.5 asks for exactly one well-formed python block: a sample-output block after it
    is allowed (it used to cost -0.9), and the explanation starts after the python block."""
    response = "t </think>```python\nprint(1)\n```\nOutput:\n```text\n1\n```"
    assert format_reward(response, words, correct=True) == 0.0


def test_long_thinking() -> None:
    # distinct words (a repeated "ok " would be a repetition)
    long = (
        "".join(f"w{i} " for i in range(4097)) + "</think>```python\nprint(1)\n```"
    )  # 4097 thinking tokens > 4096
    assert format_reward(long, words, correct=True) == -0.01
    assert format_reward(long, words, correct=False) == -0.1  # replaces the shaping bonus


def test_incorrect_shaping_bonus() -> None:
    # thinking "wait but wait error " = 4 tokens; keywords used 1-4 times: wait(2), but, error = 3
    r = "wait but wait error </think>```python\nprint(1)\n```"
    expected = math.tanh(4 / 1024) * 0.075 + 3 * 0.005  # 0.000293 + 0.015
    assert format_reward(r, words, correct=False) == pytest.approx(expected)
    assert format_reward(r, words, correct=True) == 0.0


def test_keyword_count_and_cap() -> None:
    assert keyword_bonus("wait " * 5) == 0.0  # used 5 times: not 1-4
    assert keyword_bonus("Wait, however") == pytest.approx(0.01)  # case-insensitive, 2 keywords
    assert keyword_bonus("butter awaits") == 0.0  # whole words only
    # 6 keywords once each: 6 * 0.005 = 0.03, capped at 0.025
    assert keyword_bonus("wait mistake however but retry error") == pytest.approx(0.025)


def test_incorrect_long_explanation() -> None:
    # thinking "hmm " = 1 token, no keyword; explanation of 513 tokens > 512: -0.1
    r = "hmm </think>```python\nprint(1)\n```\n" + "".join(f"s{i} " for i in range(513))
    assert format_reward(r, words, correct=False) == pytest.approx(
        math.tanh(1 / 1024) * 0.075 - 0.1
    )
    assert format_reward(r, words, correct=True) == -0.01


def test_total_and_clipping() -> None:
    assert total_reward(1.0, 0.0, GOOD, words) == 1.0  # 1.0 + 0
    # no code in training with a broken format: -1 - 0.9 = -1.9, clipped to -1
    assert total_reward(None, 0.0, "prose only", words) == -1.0
    # no code in validation: 0 + format(correct since 0 >= 0) = 0 + 0 (well-formed block)
    assert total_reward(None, 0.0, GOOD, words, training=False) == 0.0
    # regression -0.2 (incorrect) + bonus tanh(4/1024)*0.075 (thinking "I think it works " = 4
    # tokens)
    assert total_reward(0.0, 0.25, GOOD, words) == pytest.approx(-0.2 + math.tanh(4 / 1024) * 0.075)
    assert total_reward(0.75, 0.5, "anything", thinking=False) == pytest.approx(0.25)
