"""Trajectory collection (SPEC §1.2): a reference LLM writes programs, the sandbox runs them on the
public tests, the first failing test goes back to the model, and the model repairs its program.

Plain functions, no Prefect and no storage layer (`tasks/trajectory_stages.py` wraps them in tasks;
`benchmarks/trajectory_throughput.py` calls them directly on a GPU machine without Prefect):

- `collect_initial`: turn 0, `n` samples per problem; one record per problem (the cached "first
  programs" every multi-turn experiment starts from).
- `collect_multiturn`: from those records, `turns` feedback turns per sample, batched: one
  `generate` call per turn over every live conversation of a chunk of problems, and one
  `judge_many` per turn over their programs.

Every record (one problem, all its samples and turns) is appended to a JSONL file and fsynced as
soon as it is done (`RecordLog`); a rerun skips the problem ids already in the file, and a torn
trailing line left by a killed run is cut off with a warning.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engines import Completion, Conversation, Engine, SamplingConfig, split_thinking
from sandbox import JudgeRequest, SyncJudge, TestSuite, Verdict

log = logging.getLogger(__name__)

# --- prompts (SPEC §1.2, in the project's own words) ---------------------------------------------

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


# --- collection --------------------------------------------------------------------------------


class CollectConfig(BaseModel):
    """How trajectories are collected (everything here is part of the result's identity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(n=16, seed=0),
        description="Turn 0: n samples per problem (paper: 16, temperature 0.6, top-p 0.95, "
        "6144 new tokens). Feedback turns sample one continuation per conversation with the same "
        "settings and seed + turn.",
    )
    turns: int = Field(
        2, ge=0, le=64, description="Feedback turns (paper: 2 for training data, 8 for evaluation)."
    )
    system_prompt: str = Field(
        SYSTEM_PROMPT,
        description="The system message of every conversation (SPEC §1.2's by default); '' "
        "sends none (the tiny fitted model of the embedded default is fitted without one).",
    )
    max_answer_chars: int = Field(
        6000,
        ge=1,
        description="Answer kept in the conversation (the text after </think>), in characters.",
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="A conversation longer than this (counted with the engine's "
        "tokenizer, where it has one) ends its sample as context_overflow; servers report their "
        "own limit as an error, recorded the same way.",
    )


class BatchConfig(BaseModel):
    """How work is batched (does not change results beyond the engines' seeding)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_size: int = Field(
        16,
        ge=1,
        le=100_000,
        description="Problems processed together; their records land when the chunk is done.",
    )
    lanes: int = Field(
        2,
        ge=1,
        le=64,
        description="A chunk's problems are split into lanes "
        "that take turns on the engine: one lane's programs are judged while "
        "another generates (1: no overlap). Each generate call covers every live "
        "conversation of one lane.",
    )


@dataclass
class Stats:
    """Where the time went (the benchmark and the flow's log read it)."""

    problems: int = 0
    skipped: int = 0  # already in the file
    completions: int = 0
    programs_judged: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    generate_s: float = 0.0
    sandbox_s: float = 0.0  # blocked waiting on the sandbox
    sandbox_busy_s: float = 0.0  # judging, overlapped with generation or not
    wall_s: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, turn: Turn) -> None:
        self.completions += 1
        self.prompt_tokens += turn.usage.prompt_tokens
        self.completion_tokens += turn.usage.completion_tokens
        self.cost_usd += turn.usage.cost_usd
        self.outcomes[turn.outcome] = self.outcomes.get(turn.outcome, 0) + 1

    def merge(self, other: Stats) -> Stats:
        for name in (
            "problems",
            "skipped",
            "completions",
            "programs_judged",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "generate_s",
            "sandbox_s",
            "sandbox_busy_s",
            "wall_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for key, value in other.outcomes.items():
            self.outcomes[key] = self.outcomes.get(key, 0) + value
        return self

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


Gate = Callable[[], AbstractContextManager[Any]]  # e.g. a Prefect global concurrency slot


_CONTEXT_ERRORS = (
    "context length",
    "context window",
    "contextwindow",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "input is too long",
)


def make_turn(turn: int, completion: Completion, max_answer_chars: int = 6000) -> Turn:
    """A turn from one completion: answer (thinking stripped and capped), code, outcome."""
    usage = TurnUsage(
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        reasoning_tokens=completion.reasoning_tokens,
        cost_usd=completion.cost_usd,
        seconds=completion.seconds,
    )
    if completion.error is not None:
        overflow = any(s in completion.error.lower().replace("_", " ") for s in _CONTEXT_ERRORS)
        return Turn(
            turn=turn,
            outcome="context_overflow" if overflow else "engine_error",
            finish_reason=completion.finish_reason,
            error=completion.error,
            usage=usage,
        )
    answer = split_thinking(completion.text, max_answer_chars)
    code = extract_code(answer)
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


def _generate(
    engine: Engine,
    conversations: list[Conversation],
    sampling: SamplingConfig,
    gate: Gate | None,
    stats: Stats,
) -> list[list[Completion]]:
    started = time.perf_counter()
    with (gate or nullcontext)():
        results = engine.generate(conversations, sampling)
    stats.generate_s += time.perf_counter() - started
    return results


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return nullcontext(None)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return nullcontext(None)
    return tqdm(total=total, desc=desc, unit="problem")


def collect_initial(
    problems: Sequence[ProblemLike],
    engine: Engine,
    config: CollectConfig,
    path: str | Path,
    batch: BatchConfig | None = None,
    *,
    gate: Gate | None = None,
    progress: bool = False,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> tuple[dict[str, Record], Stats]:
    """Turn 0: `config.sampling.n` samples per problem, one record per problem appended to `path`.
    Problems already in the file are skipped. Returns every record (old and new) and the stats."""
    batch = batch or BatchConfig()
    stats, started = Stats(), time.perf_counter()
    with RecordLog(path, Record, logger) as store:
        done = store.open()
        todo = [p for p in problems if p.id not in done]
        stats.skipped = len(problems) - len(todo)
        with _progress(len(todo), "initial", progress) as bar:
            for chunk in _chunks(todo, batch.chunk_size):
                conversations = [first_messages(config.system_prompt, p.instruction) for p in chunk]
                results = _generate(engine, conversations, config.sampling, gate, stats)
                for problem, completions in zip(chunk, results, strict=True):
                    samples = []
                    for i, completion in enumerate(completions):
                        turn = make_turn(0, completion, config.max_answer_chars)
                        stats.count(turn)
                        ended = turn.outcome if turn.outcome in ENDING_OUTCOMES else None
                        samples.append(Sample(index=i, turns=[turn], ended=ended))
                    record = _new_record(problem, "initial", samples, config.system_prompt)
                    store.append(record)
                    done[problem.id] = record
                    stats.problems += 1
                    if bar is not None:
                        bar.update()
    stats.wall_s = time.perf_counter() - started
    return done, stats


def collect_multiturn(
    problems: Sequence[ProblemLike],
    initial: dict[str, Record],
    engine: Engine,
    judge: SyncJudge,
    config: CollectConfig,
    path: str | Path,
    batch: BatchConfig | None = None,
    *,
    feedback_kind: Literal["public", "perturbed"] = "public",
    gate: Gate | None = None,
    sandbox_gate: Gate | None = None,
    progress: bool = False,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> tuple[dict[str, Record], Stats]:
    """`config.turns` feedback turns for every sample of `initial` (turn 0 programs), feedback
    from `problem.feedback_tests`. One record per problem appended to `path`; problems already
    there are skipped. Returns every record (old and new) and the stats."""
    batch = batch or BatchConfig()
    stats, started = Stats(), time.perf_counter()
    missing = [p.id for p in problems if p.id not in initial]
    if missing:
        raise ValueError(f"{len(missing)} problems have no initial record (first: {missing[0]})")
    sampling = config.sampling.model_copy(update={"n": 1})
    counter = _token_counter(engine, sampling) if config.max_prompt_tokens else None
    with RecordLog(path, Record, logger) as store:
        done = store.open()
        todo = [p for p in problems if p.id not in done]
        stats.skipped = len(problems) - len(todo)
        with _progress(len(todo), f"{config.turns} feedback turns", progress) as bar:
            for chunk in _chunks(todo, batch.chunk_size):
                records = [_start_record(p, initial[p.id], feedback_kind) for p in chunk]
                _run_chunk(
                    chunk,
                    records,
                    engine,
                    judge,
                    config,
                    sampling,
                    batch.lanes,
                    counter,
                    gate,
                    sandbox_gate,
                    stats,
                )
                for record in records:
                    store.append(record)
                    done[record.problem_id] = record
                    stats.problems += 1
                if bar is not None:
                    bar.update(len(records))
    stats.wall_s = time.perf_counter() - started
    return done, stats


Live = list[tuple[ProblemLike, Sample, Record]]


def _run_chunk(
    chunk: Sequence[ProblemLike],
    records: list[Record],
    engine: Engine,
    judge: SyncJudge,
    config: CollectConfig,
    sampling: SamplingConfig,
    lanes: int,
    counter: Callable[[Conversation], int] | None,
    gate: Gate | None,
    sandbox_gate: Gate | None,
    stats: Stats,
) -> None:
    """All turns of a chunk. Its problems are split into `lanes` lanes that take turns on the
    engine: while one lane generates turn t, the programs of the other lane's turn t are judged
    (in a thread), so the sandbox's time hides behind generation."""
    size = -(-len(chunk) // max(1, min(lanes, len(chunk))))
    groups: list[Live] = []
    for start in range(0, len(chunk), size):
        groups.append(
            [
                (p, r.samples[s.index], r)
                for p, r in zip(
                    chunk[start : start + size], records[start : start + size], strict=True
                )
                for s in r.samples
                if s.ended is None
            ]
        )
    with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="judge") as pool:
        pending: dict[int, Future[tuple[int, float]]] = {}
        for t in range(config.turns + 1):
            for i, group in enumerate(groups):
                if i in pending:
                    _wait(pending.pop(i), stats)
                live = groups[i] = [x for x in group if x[1].ended is None]
                if t > 0:
                    if counter is not None:
                        live = _drop_overflowing(live, t, counter, config.max_prompt_tokens)
                    if not live:
                        continue
                    conversations = [r.conversation(s.index, t - 1) for _, s, r in live]
                    step = sampling.model_copy(update={"seed": _turn_seed(sampling.seed, t)})
                    results = _generate(engine, conversations, step, gate, stats)
                    for (_, sample, _), completions in zip(live, results, strict=True):
                        turn = make_turn(t, completions[0], config.max_answer_chars)
                        stats.count(turn)
                        sample.turns.append(turn)
                        if turn.outcome in ENDING_OUTCOMES:
                            sample.ended = turn.outcome
                    live = [x for x in live if x[1].ended is None]
                if live:
                    pending[i] = pool.submit(_judge_turn, live, judge, sandbox_gate)
        for future in pending.values():
            _wait(future, stats)


def _wait(future: Future[tuple[int, float]], stats: Stats) -> None:
    """Block on a lane's judging; the blocked time is what the sandbox costs the run."""
    started = time.perf_counter()
    programs, busy = future.result()
    stats.sandbox_s += time.perf_counter() - started
    stats.sandbox_busy_s += busy
    stats.programs_judged += programs


def first_messages(system: str, instruction: str) -> Conversation:
    """A conversation's opening: the system prompt ('' sends none) and the instruction."""
    head: Conversation = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": instruction}]


def _new_record(
    problem: ProblemLike,
    stage: Literal["initial", "multiturn"],
    samples: list[Sample],
    system: str = SYSTEM_PROMPT,
) -> Record:
    return Record(
        problem_id=problem.id,
        source=getattr(problem, "source", ""),
        difficulty=problem.difficulty,
        stage=stage,
        system=system,
        instruction=problem.instruction,
        samples=samples,
    )


def _start_record(problem: ProblemLike, initial: Record, kind: str) -> Record:
    record = initial.model_copy(deep=True)
    if record.instruction != problem.instruction:
        raise ValueError(f"{problem.id}: the initial record was made for another instruction")
    tests = problem.feedback_tests
    record.stage = "multiturn"
    record.feedback_tests = kind if tests.inputs else "none"  # type: ignore[assignment]
    record.difficulty, record.source = problem.difficulty, getattr(problem, "source", "")
    record.created_at = datetime.now(UTC).isoformat()
    for sample in record.samples:
        del sample.turns[1:]
    return record


def _turn_seed(seed: int | None, turn: int) -> int | None:
    return None if seed is None else seed + turn


def _judge_turn(live: Live, judge: SyncJudge, gate: Gate | None) -> tuple[int, float]:
    """Judge the last turn of every live sample on its problem's feedback tests (fail-fast) and
    write its feedback. Identical programs of one problem are judged once. Returns the number of
    programs judged and the seconds it took."""
    busy = 0.0
    requests: dict[tuple[str, str], JudgeRequest] = {}
    for problem, sample, _ in live:
        code = sample.turns[-1].code
        tests = problem.feedback_tests
        if code is not None and tests.inputs:
            key = (problem.id, code)
            if key not in requests:
                requests[key] = JudgeRequest(
                    id=f"{problem.id}#{len(requests)}", code=code, tests=tests
                )
    verdicts: dict[tuple[str, str], Verdict] = {}
    if requests:
        started = time.perf_counter()
        with (gate or nullcontext)():
            results = judge.judge_many(list(requests.values()), fail_fast=True)
            retry = [i for i, v in enumerate(results) if v.status == "sandbox_error"]
            if retry:  # the sandbox failed, not the program: once more on a fresh worker
                again = judge.judge_many(
                    [list(requests.values())[i] for i in retry], fail_fast=True
                )
                for i, verdict in zip(retry, again, strict=True):
                    results[i] = verdict
        busy = time.perf_counter() - started
        verdicts = dict(zip(requests, results, strict=True))
    for problem, sample, _ in live:
        turn = sample.turns[-1]
        total = len(problem.feedback_tests.inputs)
        if turn.code is None:
            turn.feedback = no_code_feedback()
        elif not total:
            turn.feedback = passed_feedback(0)
        else:
            verdict = verdicts[(problem.id, turn.code)]
            failed = next((i for i, ok in enumerate(verdict.passed) if not ok), None)
            turn.public = PublicVerdict(
                status=verdict.status,
                pass_rate=verdict.pass_rate,
                passed=verdict.passed,
                failed_test=failed,
                seconds=verdict.seconds,
            )
            if failed is None:
                turn.feedback = passed_feedback(total)
            else:
                turn.feedback = failed_feedback(verdict.feedback[failed], failed, total)
    return len(requests), busy


def _token_counter(
    engine: Engine, sampling: SamplingConfig
) -> Callable[[Conversation], int] | None:
    """Exact prompt length where the engine has a tokenizer (the local engines)."""
    tokenizer = getattr(engine, "tokenizer", None)
    render = getattr(engine, "render", None)
    if tokenizer is None or render is None:
        return None
    return lambda conversation: len(
        tokenizer(render(conversation, sampling), add_special_tokens=False)["input_ids"]
    )


def _drop_overflowing(
    live: Live, t: int, counter: Callable[[Conversation], int], limit: int | None
) -> Live:
    kept = []
    for item in live:
        _, sample, record = item
        tokens = counter(record.conversation(sample.index, t - 1))
        if limit is not None and tokens > limit:
            sample.turns.append(
                Turn(
                    turn=t,
                    outcome="context_overflow",
                    error=f"the conversation has {tokens} tokens, over max_prompt_tokens={limit}",
                )
            )
            sample.ended = "context_overflow"
        else:
            kept.append(item)
    return kept
