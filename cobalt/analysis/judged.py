"""The judged step of the reward-hacking analysis in storage: the problems with turn-level errors
cut into shards, each judged and written alone (resumable, runnable on any worker that reaches
the storage), then merged into the step's one JSONL. Layout, under
`<storage>/reward_hacking/judged/<step key>/`:

    shards/<index>-<shard key>/judged.jsonl   one shard's judgements, appended and fsynced per
                                              problem (a killed shard resumes from them)
    shards/<index>-<shard key>/MANIFEST.json  written last: the shard is finished
    judged.jsonl, MANIFEST.json               the step: every problem once, in the errors step's
                                              order (MANIFEST last); what the report reads

A shard is a run of whole judge rounds (`judge_chunk` errors each, problems never split), cut
from the same rounds an unsharded run makes: each round is one `generate` call seeded the same
way, so a sharded step holds the same judgements as an unsharded one. A shard's key is the step
key (errors, the judge's identity and settings, code of the judge) with its problems; the step
key does not depend on the cut, so cached results stay valid whatever the shard size.
`tasks/reward_hacking.py` runs each shard as a cached Prefect task (here or on a Dask cluster)
and the merge as another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cobalt.analysis.judge import JUDGE_ERROR, JudgeError, judge_errors
from cobalt.analysis.reward_hacking import ErrorRecord
from cobalt.analysis.stages import (
    FORMAT,
    AnalysisRef,
    JudgedRecord,
    JudgedSpec,
    Runtime,
    read_step,
)
from cobalt.storage import (
    MANIFEST,
    Logger,
    Spool,
    Storage,
    content_hash,
    from_manifest,
    open_storage,
    recipe_key,
)
from cobalt.trajectories.records import RecordLog, parse_records
from cobalt.trajectories.specs import ShardRef
from cobalt.trajectories.stages import engine_for
from engines import Engine, make_engine

JUDGED = "judged.jsonl"
log = logging.getLogger(__name__)


class JudgeShard(BaseModel):
    """Some problems of the judged step (whole judge rounds): one task, on this machine or a
    cluster's worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: JudgedSpec
    index: int = Field(ge=0)
    problems: tuple[str, ...] = Field(description="Problem ids, in the errors step's order.")
    errors: int = Field(ge=0, description="Turn-level errors of these problems.")

    @property
    def key(self) -> str:
        return recipe_key(step=self.spec.key, problems=list(self.problems))

    @property
    def name(self) -> str:
        return f"judge-{self.spec.key}-{self.index:03d}"


class JudgeShardRef(ShardRef):
    """A finished judge shard: a trajectory shard's reference, its file judged.jsonl."""

    @property
    def records_uri(self) -> str:
        return f"{self.uri}/{JUDGED}"


class JudgeFailures(JudgeError):
    """The judge could not be reached for some errors (error id, engine error): they are not
    recorded, the others are; a rerun asks again for them only."""

    transient = True  # the endpoint may answer on the task's retry

    def __init__(self, failed: Sequence[tuple[str, str]]):
        self.failed = [(str(i), str(e)) for i, e in failed]
        first, error = self.failed[0]
        super().__init__(
            f"the judge failed on {len(self.failed)} of the turn-level errors (first: {first}: "
            f"{error[:300]}); the others are kept, a rerun asks again: check the judge's "
            "endpoint (--judge-api-base) and model"
        )

    def __reduce__(self):  # the list, not the message, rebuilds it (pickled back from a worker)
        return (type(self), (self.failed,))


# --- the cut -------------------------------------------------------------------------------------


def rounds(records: Sequence[ErrorRecord], errors_per_round: int) -> Iterator[list[ErrorRecord]]:
    """Problems grouped so that each group holds about `errors_per_round` errors (a problem's
    errors stay together): one `generate` call per attempt each."""
    chunk: list[ErrorRecord] = []
    count = 0
    for record in records:
        chunk.append(record)
        count += len(record.errors)
        if count >= errors_per_round:
            yield chunk
            chunk, count = [], 0
    if chunk:
        yield chunk


def plan_shards(
    spec: JudgedSpec, records: Sequence[ErrorRecord], judge_chunk: int, errors_per_shard: int
) -> list[JudgeShard]:
    """The problems with errors, in order, cut into shards of `errors_per_shard // judge_chunk`
    whole rounds (the rounds an unsharded run makes: grouping restarts at each round's end, so
    a shard that starts there groups its problems the same way). [] when nothing has errors."""
    per_shard = max(1, errors_per_shard // judge_chunk)
    chunks = list(rounds([r for r in records if r.errors], judge_chunk))
    shards = []
    for index, start in enumerate(range(0, len(chunks), per_shard)):
        group = [r for chunk in chunks[start : start + per_shard] for r in chunk]
        shards.append(
            JudgeShard(
                spec=spec,
                index=index,
                problems=tuple(r.problem_id for r in group),
                errors=sum(len(r.errors) for r in group),
            )
        )
    return shards


def step_dir(st: Storage, spec: JudgedSpec) -> str:
    return st.path("reward_hacking", "judged", spec.key)


def shard_dir(st: Storage, shard: JudgeShard) -> str:
    return f"{step_dir(st, shard.spec)}/shards/{shard.index:04d}-{shard.key}"


def judge_shards(spec: JudgedSpec, runtime: Runtime) -> list[JudgeShard]:
    """The shards still to run: [] when the step is finished (unless refresh) or nothing has
    errors; else the cut of `plan_shards` (reads the errors step)."""
    st = open_storage(runtime.storage)
    if not runtime.refresh and st.fs.exists(f"{step_dir(st, spec)}/{MANIFEST}"):
        return []
    errors: dict[str, ErrorRecord] = read_step(spec.errors, runtime.storage, ErrorRecord)
    return plan_shards(spec, list(errors.values()), runtime.judge_chunk, runtime.errors_per_shard)


# --- one shard -----------------------------------------------------------------------------------


def judge_shard(
    shard: JudgeShard,
    runtime: Runtime,
    *,
    logger: Logger = log,
    engine: Callable[[], Engine] | None = None,
) -> JudgeShardRef:
    """The judge's label of every error of a shard's problems, appended per problem (fsynced) to
    the shard's judged.jsonl: a killed shard resumes with the problems it has (local storage:
    the file itself; S3: the copy uploaded after every round). Errors the judge could not be
    reached for are not written; the shard then fails after judging the rest (JudgeFailures).
    `engine()` gives the judge (default: this process's engine for `runtime.judge.engine`,
    opened on first use and kept: a cluster worker loads a local judge once)."""
    st = open_storage(runtime.storage)
    spool_dir = Path(runtime.work_dir, "spool", "reward_hacking", shard.key)
    spool = Spool(
        st,
        shard_dir(st, shard),
        JUDGED,
        spool_dir,
        refresh=runtime.refresh,
        name=shard.name,
        logger=logger,
    )
    if spool.finished is not None:
        return from_manifest(spool.finished, JudgeShardRef)
    errors: dict[str, ErrorRecord] = read_step(shard.spec.errors, runtime.storage, ErrorRecord)
    failed: list[tuple[str, str]] = []  # (error id, engine error)
    with RecordLog(spool.local, JudgedRecord, logger) as judged:
        done = judged.open()
        if not runtime.refresh:
            for record in _unsharded(st, shard, done, logger):
                judged.append(record)
                done[record.problem_id] = record
        todo = [errors[p] for p in shard.problems if p not in done]
        if todo:
            logger.info(
                "%s: judging %d turn-level errors of %d problems",
                shard.name,
                sum(len(r.errors) for r in todo),
                len(todo),
            )
            judge = (engine or (lambda: engine_for(runtime.judge.engine)))()
            for chunk in rounds(todo, runtime.judge_chunk):
                items = [(e, r.instruction) for r in chunk for e in r.errors]
                judgements = iter(judge_errors(items, judge, runtime.judge))
                for record in chunk:
                    mine = [next(judgements) for _ in record.errors]
                    if any(j.label == JUDGE_ERROR for j in mine):
                        failed += [
                            (j.error_id, j.attempts[-1].error or "")
                            for j in mine
                            if j.label == JUDGE_ERROR
                        ]
                        continue
                    judged.append(JudgedRecord(problem_id=record.problem_id, judgements=mine))
                spool.upload()
    if failed:
        raise JudgeFailures(failed)
    data = spool.close()
    records, _ = parse_records(data, JudgedRecord, logger, str(spool.local))
    ref = JudgeShardRef(
        key=shard.key,
        index=shard.index,
        uri=st.protocol + spool.directory,
        rows=len(records),
        fingerprint=content_hash(data),
        stats=label_stats(records.values()),
    )
    st.commit(spool.manifest, ref, shard, format=FORMAT)
    logger.info("%s: %d problems judged (%s)", shard.name, ref.rows, ref.stats["labels"])
    return ref


def _unsharded(
    st: Storage, shard: JudgeShard, done: dict[str, Any], logger: Logger
) -> list[JudgedRecord]:
    """The shard's problems that the step's own judged.jsonl holds and the shard does not have
    yet: a run of the unsharded step (before shards) that was killed, or a finished step."""
    path = f"{step_dir(st, shard.spec)}/{JUDGED}"
    if not st.fs.exists(path):
        return []
    with st.fs.open(path, "rb") as f:
        found, _ = parse_records(f.read(), JudgedRecord, logger, path)
    kept = [found[p] for p in shard.problems if p in found and p not in done]
    if kept:
        logger.info("%s: %d problems judged by an earlier run kept", shard.name, len(kept))
    return kept


# --- the step ------------------------------------------------------------------------------------


def merge_judged(
    spec: JudgedSpec, shards: Sequence[JudgeShardRef], runtime: Runtime, *, logger: Logger = log
) -> AnalysisRef:
    """The step's judged.jsonl: the shards' records, every problem once, in the errors step's
    order (the order of an unsharded run), and its manifest. A finished step is returned as is
    (unless refresh)."""
    st = open_storage(runtime.storage)
    directory = step_dir(st, spec)
    manifest = f"{directory}/{MANIFEST}"
    if not runtime.refresh and st.fs.exists(manifest):
        return from_manifest(st.read_json(manifest), AnalysisRef)
    found: dict[str, JudgedRecord] = {}
    for ref in sorted(shards, key=lambda r: r.index):
        with st.fs.open(ref.records_uri.removeprefix("s3://"), "rb") as f:
            part, _ = parse_records(f.read(), JudgedRecord, logger, ref.records_uri)
        for problem_id, record in part.items():
            found.setdefault(problem_id, record)
    order = read_step(spec.errors, runtime.storage, ErrorRecord) if found else {}
    records = [found[p] for p in order if p in found]
    records += [r for p, r in found.items() if p not in order]  # (none: the same errors)
    data = b"".join(r.model_dump_json().encode() + b"\n" for r in records)
    st.write_atomic(f"{directory}/{JUDGED}", data)
    ref = AnalysisRef(
        stage="judged",
        key=spec.key,
        uri=st.protocol + directory,
        rows=len(records),
        fingerprint=content_hash(data),
        stats=label_stats(records),
    )
    st.commit(manifest, ref, spec, format=FORMAT)
    logger.info(
        "judge labels: %s (%d shards)", ref.stats["labels"] or "no errors to judge", len(shards)
    )
    return ref


def judged_stage(
    spec: JudgedSpec, runtime: Runtime, *, logger: Logger = log, engine: Engine | None = None
) -> AnalysisRef:
    """The whole judged step in this process: every shard in turn (one judge engine, opened when
    there is something to judge and closed at the end, or `engine`), then the merge. Failures
    of the judge are counted over every shard before the step fails (the rest is kept)."""
    refs: list[JudgeShardRef] = []
    failed: list[tuple[str, str]] = []
    with ExitStack() as stack:
        opened: list[Engine] = [engine] if engine is not None else []

        def judge() -> Engine:
            if not opened:
                opened.append(stack.enter_context(make_engine(runtime.judge.engine)))
            return opened[0]

        for shard in judge_shards(spec, runtime):
            try:
                refs.append(judge_shard(shard, runtime, logger=logger, engine=judge))
            except JudgeFailures as exc:
                failed += exc.failed
    if failed:
        raise JudgeFailures(failed)
    return merge_judged(spec, refs, runtime, logger=logger)


def label_stats(records: Any) -> dict[str, Any]:
    """Judgements, per label, and requests made, over JudgedRecords."""
    labels: dict[str, int] = {}
    requests = 0
    for record in records:
        for j in record.judgements:
            labels[j.label] = labels.get(j.label, 0) + 1
            requests += len(j.attempts)
    return {"judged": sum(labels.values()), "labels": labels, "requests": requests}
