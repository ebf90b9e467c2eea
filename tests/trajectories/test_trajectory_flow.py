"""The trajectories flow end to end, against real parts: Prefect's test harness, the real sandbox
(namespace backend), the tiny model in this process, `transformers serve` for the LiteLLM path,
moto's S3 server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
)
from prefect_states import task_run_states
from trajectory_helpers import REPO, doubling

from cobalt.models import ModelNameError
from cobalt.trajectories.collect import EngineFailedError
from cobalt.trajectories.evaluation import EvalRecord
from cobalt.trajectories.problemsets import ProblemSetError
from cobalt.trajectories.prompts import no_code_feedback
from cobalt.trajectories.records import Record, read_records
from cobalt.trajectories.stages import TrajectoryParams
from engines import EngineConfig, MissingAPIKeyError
from engines.serving import free_port
from flows.trajectories import main, parse_params, trajectories_flow
from tasks.trajectories import preflight

NAMESPACE = {"backend": "namespace", "concurrency": 2}
STAGES = ("initial", "multiturn", "evaluation")


@pytest.fixture(scope="session", autouse=True)
def _boot_server_early(serve_process):
    """Start `transformers serve` before the Prefect harness, so both boot at once."""


def problems_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text(
        "".join(p.model_dump_json() + "\n" for p in (doubling("a", "easy"), doubling("b", "hard")))
    )
    return path


def params(tmp_path: Path, **overrides: Any) -> TrajectoryParams:
    values = {
        "problems": str(problems_file(tmp_path)),
        "collect": {"sampling": {"n": 2, "seed": 0, "max_new_tokens": 8}, "turns": 1},
        "sandbox": NAMESPACE,
        "storage": {"url": str(tmp_path / "runs")},
        **overrides,
    }
    return TrajectoryParams.model_validate(values)


def run(p: TrajectoryParams):
    state = trajectories_flow(p, return_state=True)
    flow_run_id = state.state_details.flow_run_id
    return state.result(), task_states(flow_run_id), flow_run_id


def task_states(flow_run_id: Any) -> dict[str, str]:
    return {name.split("-", 1)[0]: state for name, state in task_run_states(flow_run_id).items()}


def artifacts(flow_run_id: Any) -> dict[str, Any]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found}


def records(uri: str, model=Record) -> dict:
    found, _ = read_records(Path(uri) / "records.jsonl", model)
    return found


@pytest.mark.usefixtures("prefect_harness")
def test_local_engine_flow_caches_and_shares_first_programs_with_perturbed_runs(tmp_path):
    p = params(tmp_path)
    summary, states, run_id = run(p)
    assert states == dict.fromkeys(STAGES, "Completed")
    trajectories = records(summary.multiturn.uri)
    assert sorted(trajectories) == ["hand/a", "hand/b"]
    for record in trajectories.values():  # the tiny model writes no code
        assert [[t.turn for t in s.turns] for s in record.samples] == [[0, 1], [0, 1]]
        assert all(t.feedback == no_code_feedback() for s in record.samples for t in s.turns)
    assert [(r["difficulty"], r["turn"], r["pass@1"]) for r in summary.table] == [
        ("all", 0, 0.0),
        ("all", 1, 0.0),
        ("easy", 0, 0.0),
        ("easy", 1, 0.0),
        ("hard", 0, 0.0),
        ("hard", 1, 0.0),
    ]
    plot = Path(summary.plot.removeprefix("file://"))
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert json.loads((plot.parent / "table.json").read_text()) == summary.table
    found = artifacts(run_id)
    assert {"trajectories-pass-at-1", "trajectories-plot", "trajectories-summary"} <= set(found)
    assert found["trajectories-plot"].data == summary.plot
    assert "Pass@1 0.0% at turn 0" in found["trajectories-summary"].data
    manifest = json.loads((Path(summary.multiturn.uri) / "MANIFEST.json").read_text())
    assert manifest["rows"] == 2 and manifest["stats"]["completions"] == 4
    before = {
        f: f.stat().st_mtime_ns for f in (tmp_path / "runs" / "trajectories").rglob("*.jsonl")
    }

    again, states, _ = run(p)  # same inputs: every stage is a cache hit, nothing is rewritten
    assert states == dict.fromkeys(STAGES, "Cached")
    assert again.multiturn == summary.multiturn and again.table == summary.table
    assert {f: f.stat().st_mtime_ns for f in before} == before

    # the perturbed experiment starts from the same first programs
    perturbed, states, _ = run(p.model_copy(update={"perturbed": True}))
    assert states == {"initial": "Cached", "multiturn": "Completed", "evaluation": "Completed"}
    assert perturbed.initial == summary.initial
    assert {r.feedback_tests for r in records(perturbed.multiturn.uri).values()} == {"perturbed"}
    evals = records(perturbed.evaluation.uri, EvalRecord)
    assert {(e.n_tests, e.n_modified) for e in evals.values()} == {(5, 2)}
    assert "passes_wrong_test" in perturbed.table[0]


@pytest.mark.usefixtures("prefect_harness")
def test_the_steps_run_without_prefect_and_the_flow_finds_them(tmp_path):
    """A notebook's path (cobalt.trajectories.stages.run_step, no Prefect): the same steps at the
    same addresses as the flow, so the flow run after it regenerates nothing."""
    from cobalt.trajectories import stages

    p = params(tmp_path)
    ready = stages.preflight(p)
    specs, runtime = stages.stage_specs(p, ready), stages.runtime_of(p, ready)
    try:
        initial = stages.run_step(specs["initial"], runtime)
        multiturn = stages.run_step(stages.chained(specs["multiturn"], initial), runtime)
        evaluation = stages.run_step(stages.chained(specs["evaluation"], multiturn), runtime)
    finally:
        stages.close_engines()
    assert sorted(records(multiturn.uri)) == ["hand/a", "hand/b"]
    assert sorted(records(evaluation.uri, EvalRecord)) == ["hand/a", "hand/b"]
    written = {
        f: f.stat().st_mtime_ns for f in (tmp_path / "runs" / "trajectories").rglob("*.jsonl")
    }
    assert len(written) >= 3  # a records file a step at least

    summary, _, _ = run(p)
    assert (summary.initial, summary.multiturn, summary.evaluation) == (
        initial,
        multiturn,
        evaluation,
    )
    assert {f: f.stat().st_mtime_ns for f in written} == written


@pytest.mark.usefixtures("prefect_harness")
def test_cli_on_the_bundled_sample(tmp_path, capsys):
    code = main(
        [
            "--problems",
            "samples/apps_sample.jsonl:taco",
            "--limit",
            "2",
            "--n",
            "1",
            "--turns",
            "1",
            "--max-new-tokens",
            "8",
            "--backend",
            "namespace",
            "--sandbox-concurrency",
            "2",
            "--storage",
            str(tmp_path / "runs"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert (
        "trajectories (transformers): 2 problems x 1 samples, 1 feedback turns; Pass@1 0.0%" in out
    )
    assert "| all | 1 | 2 | 2 | 0.0 |" in out
    assert (tmp_path / "runs" / "models" / "tiny-seed0" / "tiny_model.json").exists()


@pytest.mark.usefixtures("prefect_harness")
def test_litellm_engine_against_a_served_model(tmp_path, served_tiny):
    """The same code path through LiteLLM, holding Prefect global concurrency slots for the
    endpoint (one flow run at a time) and the sandbox host while it works."""
    with get_client(sync_client=True) as client:
        for name in ("tiny-endpoint", "sandbox-host"):
            client.upsert_global_concurrency_limit_by_name(name, 1)
    engine = EngineConfig(
        kind="litellm", model=served_tiny["model"], api_base=served_tiny["api_base"], concurrency=4
    )
    summary, states, _ = run(
        params(tmp_path, engine=engine, llm_limit="tiny-endpoint", sandbox_limit="sandbox-host")
    )
    assert states == dict.fromkeys(STAGES, "Completed")
    turns = [t for r in records(summary.multiturn.uri).values() for s in r.samples for t in s.turns]
    assert len(turns) == 2 * 2 * 2
    assert not [t.error for t in turns if t.error]
    assert all(t.usage.prompt_tokens > 0 and t.feedback == no_code_feedback() for t in turns)
    assert summary.table[0]["pass@1"] == 0.0
    with get_client(sync_client=True) as client:  # every slot was given back
        assert client.read_global_concurrency_limit_by_name("tiny-endpoint").active_slots == 0


@pytest.mark.usefixtures("prefect_harness")
def test_a_stopped_server_stops_the_run_with_its_error(tmp_path, capsys):
    """Every request refused (a server not up, as once on a GPU: the run finished with Pass@1
    0% and exit 0, its records cached): the stage fails with the engine's error and the
    endpoint, caches nothing, and the command line prints it as one line (exit 2)."""
    dead = EngineConfig(
        kind="litellm",
        model="openai/tiny",
        api_base=f"http://127.0.0.1:{free_port()}/v1",
        max_retries=0,
        timeout_s=5,
    )
    state = trajectories_flow(params(tmp_path, engine=dead), return_state=True)
    assert state.is_failed()
    expected = (
        r"all 4 completions of one call to the litellm engine \(openai/tiny at "
        r"http://127\.0\.0\.1:\d+/v1\) failed, the first with: .*Connection.*--api-base"
    )
    with pytest.raises(EngineFailedError, match=expected):
        state.result()
    assert not list((tmp_path / "runs").rglob("MANIFEST.json"))  # nothing cached

    config = tmp_path / "dead.json"
    config.write_text(json.dumps({"engine": dead.model_dump(mode="json")}))
    argv = ["--config", str(config), "--problems", str(problems_file(tmp_path))]  # n 16
    assert main([*argv, "--storage", str(tmp_path / "runs"), "--turns", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: all 32 completions of one call to the litellm engine")


@pytest.mark.usefixtures("prefect_harness")
def test_s3_storage(tmp_path, s3_endpoint, s3_bucket):
    url = f"s3://{s3_bucket}/cobalt"
    p = params(
        tmp_path,
        storage={"url": url, "endpoint_url": s3_endpoint},
        work_dir=str(tmp_path / "work"),
        limit=1,
    )
    summary, states, _ = run(p)
    assert states == dict.fromkeys(STAGES, "Completed")
    assert summary.multiturn.uri.startswith(f"s3://{s3_bucket}/cobalt/trajectories/multiturn/")
    assert summary.plot.endswith("/pass_at_1.png") and summary.plot.startswith("s3://")
    fs = fsspec.filesystem("s3", endpoint_url=s3_endpoint, skip_instance_cache=True)
    data = fs.cat(summary.multiturn.records_uri)
    assert data.count(b"\n") == 1 and b'"problem_id":"hand/a"' in data
    assert fs.exists(f"{summary.multiturn.uri}/MANIFEST.json")
    assert (tmp_path / "work" / "models" / "tiny-seed0").is_dir()


def test_preflight_fails_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("COBALT_TEST_KEY", raising=False)
    keyed = EngineConfig(kind="litellm", model="openai/gpt-4o-mini", api_key_env="COBALT_TEST_KEY")
    with pytest.raises(MissingAPIKeyError, match="COBALT_TEST_KEY"):
        preflight(params(tmp_path, engine=keyed))
    assert (
        main(
            [
                "--engine",
                "litellm",
                "--model",
                "openai/x",
                "--api-key-env",
                "COBALT_TEST_KEY",
                "--problems",
                str(problems_file(tmp_path)),
                "--storage",
                str(tmp_path / "runs"),
            ]
        )
        == 2
    )
    assert "COBALT_TEST_KEY" in capsys.readouterr().err
    with pytest.raises(ProblemSetError, match=r"python -m flows\.data"):
        preflight(params(tmp_path, problems="latest"))
    with pytest.raises(ModelNameError, match="--model /no/such/model: no such directory"):
        preflight(params(tmp_path, engine={"kind": "transformers", "model": "/no/such/model"}))
    assert main(["--n", "0", "--storage", str(tmp_path / "runs")]) == 2
    assert "invalid parameters" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_params(["--engine", "litellm"])  # no built-in model for API engines
    # a perturbed run needs problems that can be perturbed (two distinct public outputs)
    single = tmp_path / "single.jsonl"
    single.write_text(
        doubling("c")
        .model_copy(
            update={
                "public_tests": doubling().hidden_tests.model_copy(
                    update={"inputs": ["1\n"], "outputs": ["2\n"]}
                )
            }
        )
        .model_dump_json()
        + "\n"
    )
    with pytest.raises(ProblemSetError, match="no problems"):
        preflight(params(tmp_path, problems=str(single), perturbed=True))


def test_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "flows.trajectories", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    for flag in (
        "--problems",
        "--engine",
        "--api-base",
        "--n",
        "--turns",
        "--perturbed",
        "--llm-limit",
        "--sandbox-concurrency",
        "--storage",
    ):
        assert flag in result.stdout


def test_api_key_comes_from_a_prefect_secret_block(tmp_path, monkeypatch):
    from prefect.blocks.system import Secret

    monkeypatch.delenv("COBALT_BLOCK_KEY", raising=False)
    keyed = EngineConfig(kind="litellm", model="openai/gpt-4o-mini", api_key_env="COBALT_BLOCK_KEY")
    with pytest.raises(ProblemSetError, match=r"cobalt-missing-key.*not found"):
        preflight(params(tmp_path, engine=keyed, api_key_block="cobalt-missing-key"))
    Secret(value="sk-test-from-block").save("cobalt-test-key", overwrite=True)
    ready = preflight(params(tmp_path, engine=keyed, api_key_block="cobalt-test-key"))
    assert ready.engine.api_key() == "sk-test-from-block"
    assert "sk-test-from-block" not in repr(ready.engine)
