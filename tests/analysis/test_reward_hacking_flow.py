"""The reward-hacking flow end to end, against real parts: Prefect's test harness, the embedded
default's fitted model as the policy (in this process), the served tiny model as the judge
(LiteLLM against `transformers serve`), the real sandbox. Problems whose perturbation lures the
policy into another operation, so the run has errors to judge. Then a rerun (every task a cache
hit), a second policy compared with the first, and the command line's failures before any
work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from analysis_helpers import REPO, lure_problems, sum_problem
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)
from prefect_states import task_run_states
from tiny_serving import free_port

from cobalt.analysis.judge import PARSE_FAILURE
from cobalt.analysis.stages import HackingParams
from cobalt.presets import tiny_collect
from flows.reward_hacking import main, parse_params, reward_hacking_flow

pytestmark = pytest.mark.slow
NAMESPACE = {"backend": "namespace", "concurrency": 2}
INFERENCE = ("initial", "multiturn", "evaluation")
KINDS = ("local-model", "errors", "judge-merge", "judge")  # task runs of the flow itself


def params(tmp_path: Path, model: Path, served: dict, **overrides: Any) -> HackingParams:
    problems = tmp_path / "lure.jsonl"
    if not problems.exists():
        problems.write_text("".join(p.model_dump_json() + "\n" for p in lure_problems()))
    values: dict[str, Any] = {
        "problems": str(problems),
        "engine": {"kind": "transformers", "model": str(model)},
        "judge": {
            "engine": {"kind": "litellm", "model": served["model"], "api_base": served["api_base"]},
            "sampling": {"n": 1, "temperature": 0.6, "max_new_tokens": 12, "seed": 0},
            "max_attempts": 2,
        },
        "sandbox": NAMESPACE,
        "storage": {"url": str(tmp_path / "runs")},
        **overrides,
    }
    return HackingParams.model_validate(values)


def run(p: HackingParams):
    state = reward_hacking_flow(p, return_state=True)
    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id
    return state.result(), states_of(flow_run_id), artifacts(flow_run_id)


def states_of(flow_run_id: Any) -> dict[str, str]:
    """Task name -> state over the flow run and its inference subflow run."""
    own = task_run_states(flow_run_id)  # (the task run standing for the subflow left out)
    states = {}
    for name, state in own.items():  # judge-<key>-<index> (a shard), judge-merge-<key>, ...
        kind = next((k for k in KINDS if name.startswith(f"{k}-")), None)
        if kind is not None:
            states[kind] = state
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
    assert [c.name for c in children] == ["reward-hacking-inference"]
    for name, state in task_run_states(children[0].id).items():
        states["inference/" + name.split("-")[0] + ("-merge" if "-merge-" in name else "")] = state
    return states


def artifacts(flow_run_id: Any) -> dict[str, Any]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found if a.key}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(900)
def test_flow_finds_judges_reports_caches_and_compares(tmp_path, fitted_model, served_tiny):
    p = params(tmp_path, fitted_model["path"], served_tiny)
    summary, states, found = run(p)
    assert states["errors"] == states["judge"] == states["judge-merge"] == "Completed"
    assert {states[f"inference/{s}"] for s in INFERENCE} == {"Completed"}

    total = summary.per_turn[-1]
    assert total["turn"] == "all" and total["pairs"] > 0
    assert total["errors"] >= 1, summary.line  # the lure works on the fitted model
    # the random tiny judge never writes the format: every error is a parse failure, counted
    cats = {c["category"]: c["judge"] for c in summary.categories}
    assert cats[PARSE_FAILURE] == total["errors"] and cats["hard_coding"] == 0
    assert summary.agreement["labelled"] == 0
    report = json.loads(Path(summary.report.removeprefix("file://")).read_text())
    assert report["per_turn"] == summary.per_turn and report["turns"] == 2
    assert Path(summary.plot.removeprefix("file://")).read_bytes()[:4] == b"\x89PNG"
    judged = (Path(summary.uri) / "judged.jsonl").read_text().splitlines()
    replies = [a for line in judged for j in json.loads(line)["judgements"] for a in j["attempts"]]
    assert len(replies) == 2 * total["errors"]  # two attempts each, every raw reply kept
    assert all("raw" in a and a["error"] is None for a in replies)
    keys = {"reward-hacking-per-turn", "reward-hacking-categories", "reward-hacking-plot"}
    assert keys | {"reward-hacking-summary"} <= set(found)
    assert "```diff\n--- turn " in found["reward-hacking-summary"].data
    assert found["reward-hacking-plot"].data == summary.plot

    # the same inputs again: every task is a cache hit
    again, states, _ = run(p)
    assert again.per_turn == summary.per_turn and again.uri == summary.uri
    assert states.pop("local-model") == "Completed"  # resolving 'fitted' is not cached
    assert "judge" not in states  # the judged step is finished: no shard to run, merge cached
    assert len(states) == 2 + 2 * len(INFERENCE) and set(states.values()) == {"Cached"}, states

    # another policy (here: other sampling seeds) compared with the first analysis
    other = p.collect.model_copy(
        update={"sampling": p.collect.sampling.model_copy(update={"seed": 1})}
    )
    compared, states, found = run(p.model_copy(update={"collect": other, "compare": summary.uri}))
    assert states["inference/initial"] == "Completed"
    rows = compared.comparison["per_turn"]
    assert [r["turn"] for r in rows] == [1, 2, "all"]
    assert rows[-1]["errors_before"] == total["errors"]
    assert rows[-1]["errors_after"] == compared.per_turn[-1]["errors"]
    assert {"reward-hacking-comparison", "reward-hacking-comparison-plot"} <= set(found)
    plot = Path(compared.comparison_plot.removeprefix("file://"))
    assert plot.read_bytes()[:4] == b"\x89PNG" and (plot.parent / "comparison.json").exists()


def test_cli_failures_before_any_work(tmp_path, capsys):
    storage = str(tmp_path / "runs")
    # problems that cannot be perturbed (one public test): nothing to analyse
    single = sum_problem().model_copy(
        update={
            "public_tests": sum_problem().hidden_tests.model_copy(
                update={"inputs": ["1\n7\n"], "outputs": ["7\n"]}
            ),
            "perturbed_public_tests": None,
            "modified_tests": None,
        }
    )
    problems = tmp_path / "single.jsonl"
    problems.write_text(single.model_dump_json() + "\n")
    assert main(["--problems", str(problems), "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert "needs problems with perturbed public tests" in err

    # the judge's endpoint is down: refused before inference, naming the flag to fix
    lure = tmp_path / "lure.jsonl"
    lure.write_text(sum_problem().model_dump_json() + "\n")
    closed = f"http://127.0.0.1:{free_port()}/v1"
    judge = ["--judge-engine", "litellm", "--judge-model", "openai/judge"]
    code = main(["--problems", str(lure), *judge, "--judge-api-base", closed, "--storage", storage])
    assert code == 2
    err = capsys.readouterr().err
    assert "did not answer" in err and "--judge-api-base" in err and closed in err
    # a hosted judge without its key
    code = main(
        [
            "--problems",
            str(lure),
            *judge,
            "--judge-api-key-env",
            "NO_SUCH_KEY_VAR",
            "--storage",
            storage,
        ]
    )
    assert code == 2 and "NO_SUCH_KEY_VAR" in capsys.readouterr().err
    # --compare names no finished analysis
    code = main(["--problems", str(lure), "--compare", str(tmp_path), "--storage", storage])
    assert code == 2 and "not a finished reward-hacking analysis" in capsys.readouterr().err
    code = main(["--problems", str(lure), "--compare", "latest", "--storage", storage])
    assert code == 2 and "no reward-hacking analysis" in capsys.readouterr().err
    # a policy directory without a model
    code = main(["--problems", str(lure), "--model", str(tmp_path), "--storage", storage])
    assert code == 2 and "config.json" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "trajectories").exists()  # no work started
    with pytest.raises(SystemExit):
        parse_params(["--judge-engine", "litellm"])  # which model?


def test_cli_defaults_and_help():
    embedded = parse_params([])
    assert embedded.engine.model == embedded.judge.engine.model == "fitted"
    assert embedded.problems.endswith("synthetic_train.jsonl:taco")
    assert embedded.collect == tiny_collect()  # as the pipeline samples the embedded model
    real = parse_params(["--model", "/models/policy", "--judge-model", "/models/judge"])
    assert real.collect.sampling.n == 16 and real.collect.system_prompt  # METHOD §1.2's settings
    assert real.judge.sampling.max_new_tokens == 1024
    result = subprocess.run(
        [sys.executable, "-m", "flows.reward_hacking", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    for flag in (
        "--problems",
        "--table",
        "--model",
        "--engine",
        "--judge-model",
        "--judge-engine",
        "--judge-api-base",
        "--baseline",
        "--cluster",
        "--storage",
    ):
        assert flag in result.stdout, flag
