"""Trajectory collection (METHOD §1.2): a reference LLM writes programs, the sandbox runs them on
the public tests, the first failing test goes back to the model, and the model repairs its program.

- `collect_initial`: turn 0, `n` samples per problem; one record per problem (the cached "first
  programs" every multi-turn experiment starts from).
- `collect_multiturn`: from those records, `turns` feedback turns per sample, batched: one
  `generate` call per turn over every live conversation of a chunk of problems, and one
  `judge_many` per turn over their programs.
- A failed request is a recorded outcome (`engine_error`), but a call whose every completion
  failed (a server down, a wrong model name or key) raises `EngineFailedError` before any of it
  is recorded: a run against a dead endpoint stops with the engine's error instead of finishing
  with Pass@1 0%.
- `judge_turns`: runs turns' programs on the feedback tests and writes each turn's feedback (the
  one rule, shared with the multi-turn GRPO rollout, cobalt/training/method/multiturn_rollout.py).

Every record is appended to a `RecordLog` (cobalt/trajectories/records.py) as soon as it is done;
a rerun skips the problem ids already in the file. No Prefect and no storage layer here
(cobalt/trajectories/stages.py runs these into storage).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cobalt.errors import UserError
from cobalt.trajectories.batching import BatchConfig, Gate, Stats, chunks, progress_bar
from cobalt.trajectories.prompts import (
    SYSTEM_PROMPT,
    failed_feedback,
    first_messages,
    no_code_feedback,
    passed_feedback,
)
from cobalt.trajectories.records import (
    ENDING_OUTCOMES,
    ProblemLike,
    PublicVerdict,
    Record,
    RecordLog,
    Sample,
    Turn,
    is_context_overflow,
    make_turn,
)
from engines import Completion, Conversation, Engine, SamplingConfig
from sandbox import JudgeRequest, SyncJudge, Verdict

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
        description="The system message of every conversation (METHOD §1.2's by default); '' "
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


class EngineFailedError(UserError):
    """Every completion of one call to the engine failed: nothing of the call is recorded (the
    records written before it are kept), and the task's retry or a rerun asks again."""

    transient = True  # the endpoint may answer on the task's retry


def _generate(
    engine: Engine,
    conversations: list[Conversation],
    sampling: SamplingConfig,
    gate: Gate | None,
    stats: Stats,
) -> list[list[Completion]]:
    """`engine.generate`, timed; `EngineFailedError` when more than one completion came back
    and each is an engine error (not a conversation over the model's context)."""
    started = time.perf_counter()
    with (gate or nullcontext)():
        results = engine.generate(conversations, sampling)
    stats.generate_s += time.perf_counter() - started
    errors = [c.error for completions in results for c in completions]
    if len(errors) > 1 and all(e is not None and not is_context_overflow(e) for e in errors):
        config = engine.config
        at = f" at {config.api_base}" if config.api_base else ""
        raise EngineFailedError(
            f"all {len(errors)} completions of one call to the {engine.kind} engine "
            f"({config.model}{at}) failed, the first with: {' '.join(errors[0].split())[:300]}"
            "; check that the server is up and serves this model (--api-base, --model, the API "
            "key), then run again: the records written so far are kept"
        )
    return results


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
        with progress_bar(len(todo), "initial", progress) as bar:
            for chunk in chunks(todo, batch.chunk_size):
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
        with progress_bar(len(todo), f"{config.turns} feedback turns", progress) as bar:
            for chunk in chunks(todo, batch.chunk_size):
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
                    last = [(problem, sample.turns[-1]) for problem, sample, _ in live]
                    pending[i] = pool.submit(judge_turns, last, judge, sandbox_gate)
        for future in pending.values():
            _wait(future, stats)


def _wait(future: Future[tuple[int, float]], stats: Stats) -> None:
    """Block on a lane's judging; the blocked time is what the sandbox costs the run."""
    started = time.perf_counter()
    programs, busy = future.result()
    stats.sandbox_s += time.perf_counter() - started
    stats.sandbox_busy_s += busy
    stats.programs_judged += programs


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


def judge_turns(
    turns: Sequence[tuple[ProblemLike, Turn]], judge: SyncJudge, gate: Gate | None = None
) -> tuple[int, float]:
    """Judge each turn's program on its problem's feedback tests (fail-fast) and write the turn's
    `public` verdict and `feedback` (the next user turn, METHOD §1.2). Identical programs of one
    problem are judged once; a sandbox failure is retried once on a fresh worker. Used by
    trajectory collection and by the multi-turn GRPO rollout
    (cobalt/training/method/multiturn_rollout.py).
    Returns the number of programs judged and the seconds it took."""
    busy = 0.0
    requests: dict[tuple[str, str], JudgeRequest] = {}
    for problem, turn in turns:
        code = turn.code
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
    for problem, turn in turns:
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
