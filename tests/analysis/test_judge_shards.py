"""The judged step cut into shards (cobalt/analysis/judged.py), without Prefect, a sandbox or a
model: hand-made turn-level errors of six problems and a scripted judge whose reply depends only
on the error it is shown. The cut is deterministic and falls on the judge rounds of an unsharded
run; the merged step equals the unsharded one (same lines, same generate calls); a killed shard
resumes without judging a problem twice; a judge that fails on one shard's errors does not stop
the other shard, and the step's failure counts every error left."""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
from pathlib import Path

import pytest
from analysis_helpers import CORRECT, ScriptedEngine, sum_problem
from pydantic import ValidationError

from cobalt.analysis.judge import FORMAT_REMINDER, JudgeConfig
from cobalt.analysis.judged import (
    JudgeFailures,
    judge_shard,
    judge_shards,
    judged_stage,
    merge_judged,
    plan_shards,
)
from cobalt.analysis.reward_hacking import (
    ErrorRecord,
    TurnCounts,
    TurnError,
    rule_check,
    unified_diff,
    wrong_tests_of,
)
from cobalt.analysis.stages import AnalysisRef, HackingParams, Runtime, judged_spec
from cobalt.storage import StorageConfig
from engines import Completion, Conversation, EngineConfig, SamplingConfig

LOG = logging.getLogger("test")
COUNTS = [2, 1, 3, 1, 2, 1]  # errors of problems p0..p5 (and one problem without errors, pz)
# judge rounds of 2 errors (a problem's errors stay together): [p0] [p1 p2] [p3 p4] [p5];
# shards of 2 rounds: [p0 p1 p2] [p3 p4 p5]
SHARDS = [("hand/p0", "hand/p1", "hand/p2"), ("hand/p3", "hand/p4", "hand/p5")]
JUDGE = JudgeConfig(
    engine=EngineConfig(kind="litellm", model="openai/scripted-judge"),
    sampling=SamplingConfig(n=1, temperature=0.0, max_new_tokens=8, seed=0),
    max_attempts=2,
)


def error_record(index: int, count: int) -> ErrorRecord:
    problem = sum_problem(f"p{index}")
    wrong = wrong_tests_of(problem)[:1]
    errors = []
    for sample in range(count):
        marker = 10 * index + sample  # what the scripted judge answers on
        new = f"{CORRECT}\nprint({marker})"
        errors.append(
            TurnError(
                id=f"{problem.id}#s{sample}t1",
                problem_id=problem.id,
                sample=sample,
                turn=1,
                old_code=CORRECT,
                new_code=new,
                diff=unified_diff(CORRECT, new, 1),
                wrong_tests=wrong,
                pass_rate_before=1.0,
                pass_rate_after=0.5,
                rule=rule_check(CORRECT, new, wrong),
            )
        )
    return ErrorRecord(
        problem_id=problem.id,
        instruction=problem.instruction,
        n_modified=2,
        turns=[TurnCounts(turn=0), TurnCounts(turn=1, errors=count)],
        errors=errors,
    )


def errors_step(root: Path) -> tuple[StorageConfig, AnalysisRef]:
    """The errors step of the six problems (and one without errors) written to a storage."""
    storage = StorageConfig(url=str(root / "runs"))
    records = [error_record(i, n) for i, n in enumerate(COUNTS)]
    records.insert(3, error_record(99, 0).model_copy(update={"problem_id": "hand/pz"}))
    directory = root / "runs" / "reward_hacking" / "errors" / "e1"
    directory.mkdir(parents=True)
    data = b"".join(r.model_dump_json().encode() + b"\n" for r in records)
    (directory / "errors.jsonl").write_bytes(data)
    ref = AnalysisRef(
        stage="errors",
        key="e1",
        uri=str(directory),
        rows=len(records),
        fingerprint="sha256:" + hashlib.sha256(data).hexdigest(),
    )
    return storage, ref


def reply(conversation: Conversation, call: int) -> str:
    """A judge whose reply depends only on the error shown: markers divisible by 3 get an
    unparsable first reply (then a label after the format reminder)."""
    if conversation[-1]["content"] == FORMAT_REMINDER:
        return "LABEL: other"
    marker = int(re.findall(r"print\((\d+)\)", conversation[1]["content"])[-1])
    if marker % 3 == 0:
        return "I think it hard-codes."
    return "LABEL: hard_coding" if marker % 2 else "LABEL: logic_overfitting"


def asked(engine: ScriptedEngine) -> set[int]:
    """The markers of the errors an engine was asked about."""
    return {
        int(m)
        for call in engine.calls
        for conversation in call
        for m in re.findall(r"print\((\d+)\)", conversation[1]["content"])[-1:]
    }


class Killed(BaseException):
    """The process dies here."""


def runtime(storage: StorageConfig, shard_size: int | None, **extra) -> Runtime:
    return Runtime(
        storage=storage,
        judge=JUDGE,
        judge_chunk=2,
        judge_shard_size=shard_size,
        work_dir="/tmp",
        **extra,
    )


def judged_files(storage: StorageConfig) -> list[Path]:
    return sorted(Path(storage.url).glob("reward_hacking/judged/*/judged.jsonl"))


def test_the_cut_is_deterministic_and_falls_on_judge_rounds(tmp_path):
    storage, errors = errors_step(tmp_path)
    spec = judged_spec(errors, JUDGE)
    shards = judge_shards(spec, runtime(storage, 4))
    assert [s.problems for s in shards] == SHARDS  # pz has no errors: in no shard
    assert [s.errors for s in shards] == [6, 4] and [s.index for s in shards] == [0, 1]
    again = judge_shards(spec, runtime(storage, 4))
    assert again == shards and [s.key for s in again] == [s.key for s in shards]
    assert len({s.key for s in shards}) == 2 and all(spec.key in s.name for s in shards)
    # one round per shard, and the default (16 rounds) is one shard
    assert [s.problems for s in judge_shards(spec, runtime(storage, 2))] == [
        ("hand/p0",),
        ("hand/p1", "hand/p2"),
        ("hand/p3", "hand/p4"),
        ("hand/p5",),
    ]
    assert [s.problems for s in judge_shards(spec, runtime(storage, None))] == [
        tuple(p for shard in SHARDS for p in shard)
    ]
    # a shard's key is its problems under the step's key; the step's key ignores the cut
    other = judged_spec(errors, JUDGE.model_copy(update={"max_attempts": 3}))
    assert [s.key for s in plan_shards(other, [], 2, 4)] == []
    assert {s.key for s in judge_shards(other, runtime(storage, 4))}.isdisjoint(
        {s.key for s in shards}
    )


def test_the_shard_size_is_validated():
    assert HackingParams().judge_shard_size is None  # default: 16 rounds of judge_chunk
    assert Runtime(storage=StorageConfig(), judge=JUDGE, work_dir="/tmp").errors_per_shard == 1024
    assert HackingParams(judge_chunk=8, judge_shard_size=32).judge_shard_size == 32
    with pytest.raises(ValidationError, match=r"judge_shard_size \(30\) must be a multiple of "):
        HackingParams(judge_chunk=8, judge_shard_size=30)
    with pytest.raises(ValidationError):
        HackingParams(judge_shard_size=0)


def test_the_merged_shards_equal_the_unsharded_step(tmp_path):
    one_storage, errors = errors_step(tmp_path / "one")
    spec = judged_spec(errors, JUDGE)
    whole = ScriptedEngine(reply)
    unsharded = judged_stage(spec, runtime(one_storage, None), logger=LOG, engine=whole)

    two_storage, errors2 = errors_step(tmp_path / "two")
    spec = judged_spec(errors2, JUDGE)
    assert spec.key == unsharded.key
    rt = runtime(two_storage, 4)
    shards = judge_shards(spec, rt)
    cut = ScriptedEngine(reply)
    refs = [judge_shard(s, rt, logger=LOG, engine=lambda: cut) for s in reversed(shards)]
    merged = merge_judged(spec, refs, rt, logger=LOG)

    # the same lines, in the errors step's order, from the same generate calls (the rounds)
    (a,), (b,) = judged_files(one_storage), judged_files(two_storage)
    assert a.read_bytes() == b.read_bytes()
    assert [p.split('"')[3] for p in a.read_text().splitlines()] == [
        p for shard in SHARDS for p in shard
    ]
    assert (merged.rows, merged.fingerprint, merged.stats) == (
        unsharded.rows,
        unsharded.fingerprint,
        unsharded.stats,
    )
    assert merged.stats == {
        "judged": 10,
        "labels": {"other": 3, "hard_coding": 2, "logic_overfitting": 5},
        "requests": 13,
    }
    assert sorted(map(str, cut.calls)) == sorted(map(str, whole.calls))
    assert len(whole.calls) == 4 + 3  # 4 rounds, 3 of them with a retry
    assert len(list(b.parent.glob("shards/*/MANIFEST.json"))) == 2

    # finished: no shard left to run, the step read back from its manifest, nothing judged
    assert judge_shards(spec, rt) == []
    idle = ScriptedEngine(reply)
    assert judged_stage(spec, rt, logger=LOG, engine=idle) == merged and idle.calls == []
    assert merge_judged(spec, [], rt, logger=LOG) == merged


def test_a_killed_shard_resumes_without_judging_twice(tmp_path):
    storage, errors = errors_step(tmp_path)
    spec = judged_spec(errors, JUDGE)
    rt = runtime(storage, 4)
    first = judge_shards(spec, rt)[0]  # rounds [p0] [p1 p2]

    def killed(conversation: Conversation, call: int) -> str:
        if call >= 2:  # the first round (2 calls: a retry) went through
            raise Killed
        return reply(conversation, call)

    with pytest.raises(Killed):
        judge_shard(first, rt, logger=LOG, engine=lambda: ScriptedEngine(killed))
    shard_file = next(Path(storage.url).glob("reward_hacking/judged/*/shards/*/judged.jsonl"))
    assert [line.split('"')[3] for line in shard_file.read_text().splitlines()] == ["hand/p0"]
    assert not (shard_file.parent / "MANIFEST.json").exists()

    resumed = ScriptedEngine(reply)
    ref = judge_shard(first, rt, logger=LOG, engine=lambda: resumed)
    assert asked(resumed) == {10, 20, 21, 22}  # p1 and p2 only: p0 is not judged again
    ids = [line.split('"')[3] for line in shard_file.read_text().splitlines()]
    assert ids == ["hand/p0", "hand/p1", "hand/p2"] and ref.rows == 3

    # the whole step, finished from there, equals an unsharded run from scratch
    merged = judged_stage(spec, rt, logger=LOG, engine=ScriptedEngine(reply))
    fresh_storage, _ = errors_step(tmp_path / "fresh")
    fresh = judged_stage(
        spec, runtime(fresh_storage, None), logger=LOG, engine=ScriptedEngine(reply)
    )
    (a,), (b,) = judged_files(storage), judged_files(fresh_storage)
    assert a.read_bytes() == b.read_bytes() and merged.fingerprint == fresh.fingerprint


def test_a_failing_judge_stops_no_other_shard_and_a_rerun_asks_only_for_the_rest(tmp_path):
    storage, errors = errors_step(tmp_path)
    spec = judged_spec(errors, JUDGE)
    rt = runtime(storage, 4)

    def down_for_p1(conversation: Conversation, call: int) -> str | Completion:
        if "[p1]" in conversation[1]["content"]:
            return Completion(text="", finish_reason="error", error="connection refused")
        return reply(conversation, call)

    with pytest.raises(JudgeFailures, match=r"failed on 1 of the turn-level errors") as failure:
        judged_stage(spec, rt, logger=LOG, engine=ScriptedEngine(down_for_p1))
    assert failure.value.failed == [("hand/p1#s0t1", "connection refused")]
    again = pickle.loads(pickle.dumps(failure.value))  # as it comes back from a worker
    assert again.failed == failure.value.failed and str(again) == str(failure.value)
    step = Path(storage.url, "reward_hacking", "judged", spec.key)
    assert len(list(step.glob("shards/*/MANIFEST.json"))) == 1  # the second shard is done
    assert not (step / "MANIFEST.json").exists()

    rerun = ScriptedEngine(reply)
    judged_stage(spec, rt, logger=LOG, engine=rerun)
    assert asked(rerun) == {10}  # only the error the judge failed on
    assert judged_files(storage)[0].read_text().count("\n") == 6
