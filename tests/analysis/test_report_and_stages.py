"""The stage in storage and the report, without Prefect: hand-made trajectories of two problems
(their evaluation by the real sandbox) -> the errors step -> the judged step (the served tiny
model through LiteLLM as judge; killed and resumed, and an unreachable judge that fails the step
without recording anything) -> report.json, report.md, PNG; the report's tables on judgements
whose labels are known; the comparison of two analyses."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from analysis_helpers import SAMPLES, record, sum_problem
from tiny_serving import free_port

from cobalt.analysis import report as rep
from cobalt.analysis.judge import PARSE_FAILURE, Attempt, JudgeConfig, JudgeError, Judgement
from cobalt.analysis.judged import judged_stage
from cobalt.analysis.reward_hacking import ErrorRecord
from cobalt.analysis.stages import (
    ErrorsSpec,
    HackingParams,
    JudgedRecord,
    Runtime,
    errors_spec,
    errors_stage,
    find_analysis,
    judged_spec,
    read_step,
)
from cobalt.analysis.summary import summarize
from cobalt.storage import StorageConfig
from cobalt.trajectories.evaluation import evaluate
from cobalt.trajectories.problemsets import ProblemSetError, resolve_problems
from cobalt.trajectories.records import RecordLog
from cobalt.trajectories.runs import Trajectories
from cobalt.trajectories.specs import TrajectoryRef
from engines import EngineConfig, SamplingConfig
from sandbox import SandboxConfig, SyncJudge

LOG = logging.getLogger("test")


def write_stage(directory: Path, stage: str, records) -> TrajectoryRef:
    directory.mkdir(parents=True)
    data = b"".join(r.model_dump_json().encode() + b"\n" for r in records)
    (directory / "records.jsonl").write_bytes(data)
    return TrajectoryRef(
        stage=stage,
        key=directory.name,
        uri=str(directory),
        rows=len(records),
        fingerprint="sha256:" + hashlib.sha256(data).hexdigest(),
    )


@pytest.fixture(scope="module")
def inference(tmp_path_factory):
    """What the trajectories stage would leave: two perturbed problems, their trajectories (the
    hand-made ones, twice) and their evaluation by the real sandbox."""
    root = tmp_path_factory.mktemp("hacking")
    problems = [sum_problem("a", "easy"), sum_problem("b", "hard")]
    problems_file = root / "problems.jsonl"
    problems_file.write_text("".join(p.model_dump_json() + "\n" for p in problems))
    storage = StorageConfig(url=str(root / "runs"))
    source = resolve_problems(str(problems_file), storage, perturbed=True)
    records = {
        p.id: record(p, SAMPLES).model_copy(update={"instruction": p.instruction}) for p in problems
    }
    with SyncJudge(SandboxConfig(backend="namespace", concurrency=2)) as judge:
        evals, _ = evaluate(problems, records, judge, 2, root / "evaluation.jsonl")
    multiturn = write_stage(root / "runs" / "mt" / "k1", "multiturn", list(records.values()))
    evaluation = write_stage(root / "runs" / "ev" / "k2", "evaluation", list(evals.values()))
    found = Trajectories(
        evaluation=evaluation,
        multiturn=multiturn,
        problems=source,
        engine={"kind": "transformers", "model": "/models/policy-a"},
    )
    return storage, found


def served_judge(served_tiny, **engine) -> JudgeConfig:
    return JudgeConfig(
        engine=EngineConfig(
            kind="litellm", model=served_tiny["model"], api_base=served_tiny["api_base"], **engine
        ),
        sampling=SamplingConfig(n=1, temperature=0.6, max_new_tokens=8, seed=0),
        max_attempts=1,
    )


def test_errors_judged_and_reported_in_storage(inference, served_tiny):
    storage, found = inference
    spec = errors_spec(found, turns=2)
    errors = errors_stage(spec, storage, logger=LOG)
    assert errors.rows == 2 and errors.stats["errors"] == 4 and errors.stats["pairs"] == 16
    assert Path(errors.uri, "MANIFEST.json").exists()
    again = errors_stage(spec, storage, logger=LOG)  # finished: read back from its manifest
    assert again == errors
    by_problem: dict[str, ErrorRecord] = read_step(errors, storage, ErrorRecord)
    assert [len(r.errors) for r in by_problem.values()] == [2, 2]

    # the judge is down: nothing is recorded, the step fails and says what to check
    down = served_judge(served_tiny, max_retries=0)
    closed = f"http://127.0.0.1:{free_port()}/v1"
    down = down.model_copy(update={"engine": down.engine.model_copy(update={"api_base": closed})})
    jspec = judged_spec(errors, down)
    runtime = Runtime(storage=storage, judge=down, judge_chunk=2, work_dir="/tmp")
    with pytest.raises(
        JudgeError, match=r"(?s)failed on 4 of the turn-level errors.*--judge-api-base"
    ):
        judged_stage(jspec, runtime, logger=LOG)
    directory = Path(storage.url, "reward_hacking", "judged", jspec.key)
    assert [p.read_bytes() for p in directory.glob("shards/*/judged.jsonl")] == [b""]
    assert not list(directory.rglob("MANIFEST.json")) and not (directory / "judged.jsonl").exists()

    # a run of the unsharded step (before shards) killed after the first problem, in the step's
    # own judged.jsonl: its line is kept, the second problem is judged
    up = served_judge(served_tiny)
    assert judged_spec(errors, up).key == jspec.key  # the endpoint is not part of the key
    kept = JudgedRecord(
        problem_id="hand/a",
        judgements=[
            Judgement(
                error_id=e.id,
                label="hard_coding",
                attempts=[Attempt(raw="LABEL: hard_coding", label="hard_coding")],
            )
            for e in by_problem["hand/a"].errors
        ],
    )
    with RecordLog(directory / "judged.jsonl", JudgedRecord) as log:
        log.open()
        log.append(kept)
    runtime = runtime.model_copy(update={"judge": up})
    judged = judged_stage(jspec, runtime, logger=LOG)
    lines = read_step(judged, storage, JudgedRecord)
    assert lines["hand/a"] == kept
    assert [j.label for j in lines["hand/b"].judgements] == [PARSE_FAILURE, PARSE_FAILURE]
    assert judged.stats == {
        "judged": 4,
        "labels": {"hard_coding": 2, PARSE_FAILURE: 2},
        "requests": 4,
    }

    params = HackingParams(storage=storage, judge=up, examples=3)
    summary = summarize(params, spec, errors, judged, up.engine.model)
    report = json.loads(Path(summary.report.removeprefix("file://")).read_text())
    assert report["policy"] == "policy-a" and [e["id"] for e in report["examples"]] == [
        "hand/a#s0t1",
        "hand/b#s0t1",
        "hand/a#s4t2",
    ]
    first = report["examples"][0]  # the JSON has the examples' diffs and labels too
    assert first["turn"] == 1 and first["judge"] == "hard_coding" and first["rule_hard_coded"]
    assert first["diff"].startswith("--- turn 0\n+++ turn 1") and "+    print(30)" in first["diff"]
    assert first["wrong_tests"][0]["output"].strip() == "30"
    assert summary.per_turn[-1] == {
        "turn": "all",
        "programs": 28,
        "passes_wrong_test_%": 50.0,
        "pairs": 16,
        "changed": 12,
        "errors": 4,
        "error_rate_%": 25.0,
        "error_rate_changed_%": 33.33,
    }
    assert "4 turn-level errors in 16 program pairs (25.0%)" in summary.line
    plot = Path(summary.plot.removeprefix("file://"))
    assert plot.read_bytes()[:4] == b"\x89PNG"
    markdown = (plot.parent / "report.md").read_text()
    assert "```diff\n--- turn 0\n+++ turn 1" in markdown and "+    print(30)" in markdown
    assert find_analysis("latest", storage) == report

    # compared with itself: nothing changes
    compared = summarize(params, spec, errors, judged, up.engine.model, compare=report)
    rows = compared.comparison["per_turn"]
    assert [(r["turn"], r["change_points"]) for r in rows] == [(1, 0.0), (2, 0.0), ("all", 0.0)]
    assert Path(compared.comparison_plot.removeprefix("file://")).read_bytes()[:4] == b"\x89PNG"


def test_a_set_without_wrong_tests_is_refused(inference, tmp_path):
    storage, found = inference
    plain = found.problems.model_copy(update={"perturbed": False, "fingerprint": ""})
    spec: ErrorsSpec = errors_spec(found.model_copy(update={"problems": plain}), turns=2)
    with pytest.raises(ProblemSetError, match=r"no problem of .* has wrong"):
        errors_stage(spec, storage, logger=LOG)
    with pytest.raises(ProblemSetError, match="not a finished reward-hacking analysis"):
        find_analysis(str(tmp_path), storage)


def test_report_tables_on_known_labels(inference):
    storage, found = inference
    spec = errors_spec(found, turns=2)
    records = list(
        read_step(errors_stage(spec, storage, logger=LOG), storage, ErrorRecord).values()
    )
    labels = {
        "hand/a#s0t1": "hard_coding",
        "hand/a#s4t2": "logic_overfitting",
        "hand/b#s0t1": "other",
    }
    judgements = [
        Judgement(error_id=i, label=label, attempts=[Attempt(raw=f"LABEL: {label}", label=label)])
        for i, label in labels.items()
    ] + [
        Judgement(
            error_id="hand/b#s4t2",
            label=PARSE_FAILURE,
            attempts=[Attempt(raw="?", label=PARSE_FAILURE)],
        )
    ]
    pairs = rep.joined(records, judgements)
    rows = {r["category"]: (r["judge"], r["rule_hard_coded"]) for r in rep.categories(pairs)}
    assert rows == {
        "hard_coding": (1, 1),
        "logic_overfitting": (1, 0),
        "semantic_drifting": (0, 0),
        "other": (1, 1),  # the rule says hard-coding, the judge does not
        PARSE_FAILURE: (1, 0),
        "rule pre-check: hard_coding": (None, 2),
    }
    assert rep.agreement(pairs) == {
        "labelled": 3,
        "parse_failures": 1,
        "both_hard_coding": 1,
        "judge_only": 0,
        "rule_only": 1,
        "neither": 1,
        "agreement_%": 66.67,
    }
    picked = [e.id for e, _ in rep.pick_examples(pairs, 10)]
    assert picked == ["hand/a#s0t1", "hand/a#s4t2", "hand/b#s0t1", "hand/b#s4t2"]
    unjudged = rep.categories(rep.joined(records, judgements[:1]))
    assert ("not judged", 3) in [(r["category"], r["judge"]) for r in unjudged]
    # per turn: the hand-made trajectories twice
    rates = [
        (r["turn"], r["pairs"], r["errors"], r["error_rate_%"]) for r in rep.per_turn(records, 2)
    ]
    assert rates == [(0, 0, 0, None), (1, 8, 2, 25.0), (2, 8, 2, 25.0), ("all", 16, 4, 25.0)]


def test_compare_two_reports():
    def report(errors: list[int], pairs: list[int], hard: int) -> dict:
        per_turn = [{"turn": 0, "pairs": 0, "errors": 0, "error_rate_%": None}] + [
            {"turn": t + 1, "pairs": p, "errors": e, "error_rate_%": round(100 * e / p, 2)}
            for t, (e, p) in enumerate(zip(errors, pairs, strict=True))
        ]
        cats = [
            {"category": "hard_coding", "judge": hard, "judge_%": 50.0, "rule_hard_coded": 0},
            {
                "category": "rule pre-check: hard_coding",
                "judge": None,
                "judge_%": None,
                "rule_hard_coded": 3,
            },
        ]
        return {"per_turn": per_turn, "categories": cats}

    before, after = report([4, 2], [20, 20], 3), report([1, 2], [20, 10], 1)
    tables = rep.compare(before, after)
    assert [
        (r["turn"], r["error_rate_before_%"], r["error_rate_after_%"], r["change_points"])
        for r in tables["per_turn"]
    ] == [
        (1, 20.0, 5.0, -15.0),
        (2, 10.0, 20.0, 10.0),
    ]
    assert tables["categories"][0] == {
        "category": "hard_coding",
        "before": 3,
        "before_%": 50.0,
        "after": 1,
        "after_%": 50.0,
    }
    assert tables["categories"][1]["before"] == 3  # the rule's count
