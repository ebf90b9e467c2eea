"""The Cobalt reward (METHOD §1.5) for one sampled next turn: plain functions, no Prefect or torch.

- `correctness_reward(pass_rate, prev_best, training)`: the pass-rate table plus the improvement
  bonus / regression penalty against the context's `prev_best_pass_rate`.
- `format_reward(response, count_tokens, correct)`: the thinking-model format term.
- `validation_reward(pass_rate)`: 1 if every test passes, else 0.
- `total_reward(...)`: correctness + format, clipped to [-1, 1].

Choices where METHOD §1.5 is open (kept here so the tests can pin them):

- p == b (no change from the best earlier turn, with 0 < b and p < 1) takes the "otherwise"
  branch: the reward becomes -0.1 + 0.1 * 0 = -0.1 (no improvement is penalised like a regression).
- The 0.025 cap applies to the *sum of the keyword bonuses* only (0.005 each); the tanh term
  (at most 0.075) is added on top. A keyword counts when it occurs 1 to 4 times (case-insensitive,
  whole words) in the *thinking* text; a keyword used 5+ times earns nothing.
- For incorrect answers the -0.1 for thinking over 4096 tokens replaces the whole shaping bonus
  (tanh and keywords); the -0.1 for an over-long answer or explanation is added once (either or
  both) on top of that.
- For correct answers the -0.01 is applied once, whichever limit(s) are exceeded.
- Thinking = text before the single `</think>`; answer = text after it; explanation = answer text
  after the closing fence of the python block. A well-formed block is ```` ```python ```` (or `py`,
  `python3`, `py3`) on its own opening line, closed by a ```` ``` ````, its code without a
  backtick. The answer holds exactly one such block; other complete fenced blocks (```` ```text ````
  sample output, a shell line in the explanation) are allowed, but every fence must be closed (an
  odd number of ```` ``` ```` fences is a broken answer). Inline single backticks are allowed.
  (Formerly the answer had to hold exactly two fences: an extra block in the explanation
  cost -0.9, which METHOD §1.5's "exactly one well-formed fenced python block" does not ask.)
- The repetition check looks at the whole raw response (thinking included).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

NO_CODE_TRAIN = -1.0
FORMAT_PENALTY = -0.9
MAX_THINK_TOKENS = 4096
MAX_ANSWER_TOKENS = 2048
MAX_EXPLANATION_TOKENS = 512
KEYWORDS = ("wait", "mistake", "however", "but", "retry", "error", "verify", "wrong", "evaluate")
KEYWORD_BONUS = 0.005
KEYWORD_CAP = 0.025

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}
_KEYWORD_RES = {k: re.compile(rf"\b{k}\b", re.IGNORECASE) for k in KEYWORDS}


def correctness_reward(pass_rate: float | None, prev_best: float, training: bool = True) -> float:
    """Reward from the pass rate p on all tests (None: the response had no fenced code block)."""
    if pass_rate is None:
        return NO_CODE_TRAIN if training else 0.0
    p, b = pass_rate, prev_best
    if p >= 1.0:
        reward = 1.0
    elif p >= 0.5:
        reward = 0.2
    elif p > 0.0:
        reward = 0.0
    else:
        reward = -0.1
    if p < 1.0 and b > 0.0:
        if p > b:
            reward += 0.1 * (p - b) / (1.0 - b)
        else:
            reward = -0.1 + 0.1 * (p - b) / b
    return reward


def has_repetition(text: str, min_block: int = 32, times: int = 8) -> bool:
    """A block of `min_block`+ characters repeated `times`+ times in a row.

    Equivalent to the regex `(.{32,}?)\\1{7,}` but vectorised (the regex takes seconds on a
    25k-character response): a block of length L repeated 8 times is a stretch where
    s[j] == s[j + L] for 7L consecutive j. Such a stretch holds exactly 7 multiples of L, so each
    period is first tried at its multiples alone (n / L comparisons) and checked whole only where 7
    in a row match: 9x faster on a 50k-character response with no repetition (the paper preset's
    random 8B model's 6,144-token responses spent 11% of a GRPO step here, docs/RESULTS.md)."""
    import numpy as np

    n = len(text)
    if n < min_block * times:
        return False
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    runs = times - 1
    for period in range(min_block, n // times + 1):
        later = codes[period::period]
        at_multiples = codes[: n - period : period][: len(later)] == later
        marks = np.concatenate(([0], np.cumsum(at_multiples)))
        if len(at_multiples) < runs or not (marks[runs:] - marks[:-runs] == runs).any():
            continue
        need = runs * period
        same = np.concatenate(([0], np.cumsum(codes[:-period] == codes[period:])))
        if (same[need:] - same[:-need] == need).any():
            return True
    return False


def _split(response: str) -> tuple[str, str, str] | None:
    """(thinking, answer, explanation after the code), or None when the format is broken."""
    if response.count("</think>") != 1:
        return None
    thinking, answer = response.split("</think>")
    if answer.count("```") % 2:
        return None
    blocks = [b for b in _FENCE.finditer(answer) if b.group(1).strip().lower() in _PYTHON_TAGS]
    if len(blocks) != 1 or "`" in blocks[0].group(2):
        return None
    return thinking, answer, answer[blocks[0].end() :]


def keyword_bonus(thinking: str) -> float:
    """0.005 per reflective keyword used 1-4 times; the sum capped at 0.025."""
    used = sum(1 for r in _KEYWORD_RES.values() if 1 <= len(r.findall(thinking)) <= 4)
    return min(KEYWORD_CAP, KEYWORD_BONUS * used)


def format_reward(response: str, count_tokens: Callable[[str], int], correct: bool) -> float:
    """The thinking-model format term (see the module docstring for the exact rules)."""
    if has_repetition(response):
        return FORMAT_PENALTY
    parts = _split(response)
    if parts is None:
        return FORMAT_PENALTY
    thinking, answer, explanation = parts
    think_tokens = count_tokens(thinking)
    long_answer = (
        count_tokens(answer) > MAX_ANSWER_TOKENS
        or count_tokens(explanation) > MAX_EXPLANATION_TOKENS
    )
    if correct:
        return -0.01 if think_tokens > MAX_THINK_TOKENS or long_answer else 0.0
    if think_tokens > MAX_THINK_TOKENS:
        reward = -0.1
    else:
        reward = math.tanh(think_tokens / 1024) * 0.075 + keyword_bonus(thinking)
    if long_answer:
        reward -= 0.1
    return reward


def validation_reward(pass_rate: float | None) -> float:
    return 1.0 if pass_rate is not None and pass_rate >= 1.0 else 0.0


def total_reward(
    pass_rate: float | None,
    prev_best: float,
    response: str,
    count_tokens: Callable[[str], int] | None = None,
    *,
    training: bool = True,
    thinking: bool = True,
) -> float:
    """Correctness + format term (thinking models only), clipped to [-1, 1].

    `correct` for the format term means the correctness reward is >= 0."""
    reward = correctness_reward(pass_rate, prev_best, training)
    if thinking:
        if count_tokens is None:
            raise ValueError("thinking models need count_tokens for the format term")
        reward += format_reward(response, count_tokens, correct=reward >= 0)
    return max(-1.0, min(1.0, reward))
