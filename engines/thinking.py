"""Reasoning text of thinking models (SPEC §1.2: keep only the text after `</think>`)."""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
MAX_ANSWER_CHARS = 6000


def split_thinking(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str:
    """The part of a response that goes back into the conversation.

    - With a `</think>`: the text after the last one, stripped, cut to its first `max_chars`
      characters.
    - With an unclosed `<think>` (reasoning cut by the token limit): "" (there is no answer).
    - Without either (a non-thinking model, or thinking off): the text itself, stripped and cut.

    Templates that open the reasoning in the prompt (R1-Distill) produce only `</think>`, which
    the first rule covers; such a response cut before `</think>` holds no tag at all and is kept
    as it is; callers that know thinking was on can treat it as unanswered.
    """
    if THINK_CLOSE in text:
        answer = text.rpartition(THINK_CLOSE)[2]
    elif THINK_OPEN in text:
        answer = ""
    else:
        answer = text
    return answer.strip()[:max_chars]


def thinking_text(text: str) -> str | None:
    """The reasoning part (before the last `</think>`, opening tag removed), or None if closed
    reasoning is absent."""
    if THINK_CLOSE not in text:
        return None
    head = text.rpartition(THINK_CLOSE)[0]
    if THINK_OPEN in head:
        head = head.split(THINK_OPEN, 1)[1]
    return head.strip()
