"""What the model is told and what is taken from its answers (METHOD §1.2, in the project's own
words): the system prompt, the feedback turns, the opening of a conversation, and the program
extracted from a response. No Prefect, no storage."""

from __future__ import annotations

import re

from engines import Conversation

# --- prompts (METHOD §1.2, in the project's own words) -------------------------------------------

SYSTEM_PROMPT = (
    "You are a careful Python programming assistant. The programs you write are executed in a "
    "restricted sandbox: the filesystem is read-only, and every run has limits on time, memory "
    "and output. Your code must never create processes (no fork, no subprocess, no os.system "
    "or any other way of running shell commands), never "
    "kill or send signals to processes, and never create, modify, delete or walk through files "
    "and directories. Do not import system-level modules such as psutil, resource, ipdb, "
    "tkinter or joblib."
)

_REPAIR_ASK = (
    "Analyse this feedback step by step: trace what your program does on this input, find where "
    "it goes wrong, and cite the lines you change and why. Then write the complete, corrected "
    "program in a single ```python code block: the whole program, not only the edited lines."
)
_FAILED = "Your program was run on the public tests and failed test {index} of {total}.\n\n{report}"
_PASSED = (
    "Your program passed all {total} public tests. The hidden tests are more thorough and may "
    "still catch mistakes: check your solution against edge cases (smallest and largest inputs, "
    "empty, equal or repeated values, unusual formats) and against the time limit."
)
_PASSED_ASK = (
    "If you find a problem, explain it and cite the lines you change. Then write the complete "
    "final program, corrected or unchanged, in a single ```python code block."
)
_NO_TESTS = "This problem has no public tests, so your program could not be checked."
_NO_CODE = (
    "Your response contains no fenced code block, so there was no program to run. Write your "
    "solution as one complete Python program in a single ```python code block."
)


def failed_feedback(report: str, index: int, total: int) -> str:
    """The user turn after a program that failed public test `index` (0-based) of `total`."""
    head = _FAILED.format(index=index + 1, total=total, report=report.strip())
    return head + "\n\n" + _REPAIR_ASK


def passed_feedback(total: int) -> str:
    """The user turn after a program that passed every public test."""
    head = _PASSED.format(total=total) if total else _NO_TESTS
    return head + "\n\n" + _PASSED_ASK


def no_code_feedback() -> str:
    """The user turn after a response without a fenced code block (empty, refused, cut off)."""
    return _NO_CODE


# --- code extraction ---------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}


def extract_code(text: str) -> str | None:
    """The program in a response: the last ```python block, or else the last untagged ``` block.

    Blocks tagged with another language (```text, ```bash) never count, and an untagged block after
    the program (sample output, say) does not displace a ```python block. An unclosed fence (a
    response cut by the token limit) is no block. Returns None when there is no block; the code
    itself is returned without its fences and trailing whitespace (it may be empty).
    """
    tagged: str | None = None
    plain: str | None = None
    for match in _FENCE.finditer(text):
        tag = match.group(1).strip().lower()
        code = match.group(2).rstrip()
        if tag in _PYTHON_TAGS:
            tagged = code
        elif not tag:
            plain = code
    return tagged if tagged is not None else plain


def first_messages(system: str, instruction: str) -> Conversation:
    """A conversation's opening: the system prompt ('' sends none) and the instruction."""
    head: Conversation = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": instruction}]
