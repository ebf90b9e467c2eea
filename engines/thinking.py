"""Reasoning text of thinking models (METHOD §1.2: keep only the text after `</think>`)."""

from __future__ import annotations

from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
MAX_ANSWER_CHARS = 6000


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt leaves a reasoning block open for the model to continue
    (R1-Distill's template ends its generation prompt with `<think>`; Qwen3's with thinking off
    closes it at once)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


def template_opens_thinking(tokenizer: Any, **template_kwargs: Any) -> bool:
    """Whether a tokenizer's chat template opens a reasoning block in every generation prompt
    (checked on a one-message conversation; templates without one say False)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return False
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}],
        tokenize=False,
        add_generation_prompt=True,
        **template_kwargs,
    )
    return isinstance(prompt, str) and opens_thinking(prompt)


def with_open_thinking(text: str, opened: bool) -> str:
    """A completion as the model wrote it: the `<think>` its prompt opened put back in front, so
    that a response cut before `</think>` reads as unfinished reasoning (no answer) everywhere."""
    return f"{THINK_OPEN}\n{text}" if opened and THINK_OPEN not in text else text


def split_thinking(text: str, max_chars: int | None = MAX_ANSWER_CHARS) -> str:
    """The part of a response that goes back into the conversation.

    - With a `</think>`: the text after the last one, stripped, cut to its first `max_chars`
      characters (None: not cut; code is extracted from the uncut answer).
    - With an unclosed `<think>` (reasoning cut by the token limit): "" (there is no answer).
    - Without either (a non-thinking model, or thinking off): the text itself, stripped and cut.

    Templates that open the reasoning in the prompt (R1-Distill) produce only `</think>`, which
    the first rule covers; the local engines and the GRPO rewards put the opened `<think>` back in
    front (`with_open_thinking`), so a response cut before `</think>` falls under the second.
    """
    if THINK_CLOSE in text:
        answer = text.rpartition(THINK_CLOSE)[2]
    elif THINK_OPEN in text:
        answer = ""
    else:
        answer = text
    answer = answer.strip()
    return answer if max_chars is None else answer[:max_chars]


def thinking_text(text: str) -> str | None:
    """The reasoning part (before the last `</think>`, opening tag removed), or None if closed
    reasoning is absent."""
    if THINK_CLOSE not in text:
        return None
    head = text.rpartition(THINK_CLOSE)[0]
    if THINK_OPEN in head:
        head = head.split(THINK_OPEN, 1)[1]
    return head.strip()
