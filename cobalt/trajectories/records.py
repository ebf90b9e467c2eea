"""The trajectory record (one problem, all its samples and turns: one JSONL line), how one
completion becomes a turn (`make_turn`), and the durable JSONL log records are appended to:
fsynced per record, resumable, safe against a killed writer."""

from __future__ import annotations

import fcntl
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cobalt.trajectories.prompts import extract_code, first_messages
from engines import Completion, Conversation, split_thinking
from sandbox import TestSuite

log = logging.getLogger(__name__)

# --- records -------------------------------------------------------------------------------------

Outcome = Literal[
    "code",  # a fenced code block was found (whatever the program does)
    "no_code",  # an answer without a code block (a refusal, prose only)
    "empty",  # nothing after the reasoning (empty response, or reasoning cut by the token limit)
    "truncated",  # cut by max_new_tokens before a complete code block
    "engine_error",  # the request failed (after the engine's retries): the sample ends here
    "context_overflow",  # the conversation no longer fits the model's context: the sample ends
]
ENDING_OUTCOMES = ("engine_error", "context_overflow")


class TurnUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0


class PublicVerdict(BaseModel):
    """The program's result on the feedback (public, or perturbed public) tests, fail-fast."""

    model_config = ConfigDict(extra="forbid")

    status: str = Field(description="accepted, or the first failing test's status.")
    pass_rate: float
    passed: list[bool] = Field(description="Per test; tests after the first failure are False.")
    failed_test: int | None = Field(None, description="Index of the first failing test.")
    seconds: float = 0.0


class Turn(BaseModel):
    """One assistant turn of one sample and what the model is told about it."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0, description="0: answer to the instruction; t: answer to feedback t.")
    response: str = Field("", description="The raw generated text (reasoning included).")
    answer: str = Field("", description="What goes back into the conversation (after </think>).")
    code: str | None = Field(None, description="The last fenced code block of the answer.")
    outcome: Outcome
    finish_reason: str | None = None
    error: str | None = Field(None, description="Engine error, or why the context overflowed.")
    usage: TurnUsage = Field(default_factory=TurnUsage)
    public: PublicVerdict | None = Field(None, description="None before judging or without code.")
    feedback: str | None = Field(
        None, description="The user turn that follows this answer (None once the sample ended)."
    )


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    turns: list[Turn]
    ended: Outcome | None = Field(None, description="Why the sample stopped before the last turn.")


class Record(BaseModel):
    """One problem with all its samples and turns: one JSONL line."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str
    source: str = ""
    difficulty: str = "unknown"
    stage: Literal["initial", "multiturn"]
    system: str = Field(description="The system prompt of every conversation.")
    instruction: str = Field(description="The first user turn.")
    feedback_tests: Literal["public", "perturbed", "none"] = Field(
        "none", description="Which tests the feedback was built from (none: not judged yet)."
    )
    samples: list[Sample]
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())

    def first_messages(self) -> Conversation:
        """The system prompt (when there is one) and the instruction."""
        return first_messages(self.system, self.instruction)

    def conversation(self, sample: int, turn: int, with_feedback: bool = True) -> Conversation:
        """The messages up to the answer of `turn` (and the feedback after it)."""
        messages = self.first_messages()
        for t in self.samples[sample].turns[: turn + 1]:
            messages.append({"role": "assistant", "content": t.answer})
            if t.feedback is not None and (with_feedback or t.turn < turn):
                messages.append({"role": "user", "content": t.feedback})
        return messages


class ProblemLike(Protocol):
    """What collection needs of a problem (`tasks.problems.Problem` has it all)."""

    id: str
    difficulty: str
    instruction: str

    @property
    def feedback_tests(self) -> TestSuite: ...


_CONTEXT_ERRORS = (
    "context length",
    "context window",
    "contextwindow",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "input is too long",
)


def is_context_overflow(error: str) -> bool:
    """Whether an engine's error says the conversation is longer than the model's context."""
    return any(s in error.lower().replace("_", " ") for s in _CONTEXT_ERRORS)


def make_turn(turn: int, completion: Completion, max_answer_chars: int = 6000) -> Turn:
    """A turn from one completion: answer (thinking stripped and capped), code (the last block of
    the whole answer, before the cap), outcome."""
    usage = TurnUsage(
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        reasoning_tokens=completion.reasoning_tokens,
        cost_usd=completion.cost_usd,
        seconds=completion.seconds,
    )
    if completion.error is not None:
        return Turn(
            turn=turn,
            outcome="context_overflow" if is_context_overflow(completion.error) else "engine_error",
            finish_reason=completion.finish_reason,
            error=completion.error,
            usage=usage,
        )
    whole = split_thinking(completion.text, None)
    code = extract_code(whole)  # from the whole answer: the cap is for the conversation only
    answer = whole[:max_answer_chars]
    if code is not None:
        outcome: Outcome = "code"
    elif not answer:
        outcome = "empty"
    elif completion.finish_reason == "length":
        outcome = "truncated"
    else:
        outcome = "no_code"
    return Turn(
        turn=turn,
        response=completion.text,
        answer=answer,
        code=code,
        outcome=outcome,
        finish_reason=completion.finish_reason,
        usage=usage,
    )


# --- durable JSONL -------------------------------------------------------------------------------


class RecordLog:
    """An append-only JSONL file of records keyed by `problem_id`, safe against being killed.

    `open()` reads what is there (skipping corrupt lines with a warning; a torn or corrupt tail is
    cut off so new lines start clean), takes an exclusive lock (a second writer fails at once),
    and returns the finished records. `append()` writes one line with one `write`, then flushes
    and fsyncs it: once it returns, the record survives a crash of this process or the machine.
    """

    def __init__(
        self,
        path: str | Path,
        model: type[BaseModel] = Record,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
    ):
        self.path = Path(path)
        self.model = model
        self.log = logger or log
        self._fd: int | None = None

    def __enter__(self) -> RecordLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"{self.path} is being written by another process") from None
        if created:
            _fsync_dir(self.path.parent)
        self._fd = fd
        records, good_end = read_records(self.path, self.model, self.log)
        size = os.fstat(fd).st_size
        if good_end < size and os.pread(fd, size - good_end, good_end).strip():
            self.log.warning(
                "%s: cutting %d bytes of corrupt trailing data (a record torn by a "
                "killed run); it will be redone",
                self.path,
                size - good_end,
            )
        if good_end < size:
            os.ftruncate(fd, good_end)
            os.fsync(fd)
        return records

    def append(self, record: BaseModel) -> None:
        assert self._fd is not None, "open() the log first"
        line = record.model_dump_json().encode() + b"\n"
        view = memoryview(line)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def read_records(
    path: str | Path,
    model: type[BaseModel] = Record,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> tuple[dict[str, Any], int]:
    """The valid records of a JSONL file (see `parse_records`); a missing file has none."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return {}, 0
    return parse_records(data, model, logger, str(path))


def parse_records(
    data: bytes,
    model: type[BaseModel] = Record,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    name: str = "records",
) -> tuple[dict[str, Any], int]:
    """The valid records of JSONL bytes by `problem_id` (the first of duplicates wins), and the
    byte offset after the last valid line (what follows is a corrupt tail). Corrupt lines, a
    torn last line included, are skipped with a warning."""
    logger = logger or log
    records: dict[str, Any] = {}
    offset, good_end = 0, 0
    for number, line in enumerate(data.split(b"\n"), 1):
        end = offset + len(line) + 1
        if line.strip():
            try:
                if end > len(data):  # the last piece has no end of line
                    raise ValueError("no end of line (a torn write)")
                record = model.model_validate_json(line)
            except (ValueError, ValidationError) as exc:
                logger.warning(
                    "%s line %d: skipping a corrupt record (%s)",
                    name,
                    number,
                    str(exc).splitlines()[0][:200],
                )
            else:
                key = record.problem_id  # type: ignore[attr-defined]
                if key in records:
                    logger.warning("%s line %d: duplicate record for %s ignored", name, number, key)
                else:
                    records[key] = record
                good_end = end
        offset = end
    return records, min(good_end, len(data))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
