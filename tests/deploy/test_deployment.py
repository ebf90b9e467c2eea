"""Deployments end to end, as an operator runs them: a real Prefect server,
`prefect deploy` from `prefect.yaml`, a process worker on `cpu-pool`, `prefect deployment run`,
and the run's outputs and artifacts checked afterwards: the `data` deployment, and every
deployment registered with the `pipeline` one run to completion.

Every Prefect process gets an explicit environment (its own PREFECT_HOME and PREFECT_API_URL,
no PREFECT_* inherited), so this test never touches the session's `prefect_harness`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
RUN_TIMEOUT = 180  # seconds for the flow run to reach a final state

# what `python -m flows.data` runs without --source: the bundled samples (relative to the repo
# root, the working directory the pull step sets) with min_tests=1, verified in the namespace
# sandbox (no Docker here), 2 programs at once on this 2-core machine
SAMPLE_SOURCES = [
    {"uri": "samples/apps_sample.jsonl", "kind": "taco", "name": "apps_sample", "role": "train"},
    {
        "uri": "samples/codecontests_sample.jsonl",
        "kind": "codecontests",
        "name": "codecontests_sample",
        "role": "train",
    },
    {"uri": "samples/lcb_sample.jsonl", "kind": "lcb", "name": "lcb_sample", "role": "test"},
]
# what the samples give with min_tests=1 and the default seed (as in tests/data/test_flow.py)
EXPECTED_SETS = {"train": 4, "dev": 0, "test": 183, "train_perturbed": 2, "dev_perturbed": 0}

# run in a child process with the test server's environment: final state, artifact keys and the
# runs it started as subflows (run_deployment: name, work queue, state)
POLL = """
import json, sys, time
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId,
)

flow_run_id, timeout = sys.argv[1], float(sys.argv[2])
with get_client(sync_client=True) as client:
    deadline = time.monotonic() + timeout
    while True:
        run = client.read_flow_run(flow_run_id)
        if (run.state and run.state.is_final()) or time.monotonic() > deadline:
            break
        time.sleep(2)
    artifacts = client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
    )
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    ids = {t.id for t in tasks}
    children = [c for c in client.read_flow_runs() if c.parent_task_run_id in ids]
print(json.dumps({
    "state": run.state.type.value if run.state else None,
    "message": run.state.message if run.state else None,
    "artifacts": {a.key: a.type for a in artifacts if a.key},
    "subflows": sorted((c.name, c.work_queue_name, c.state.type.value) for c in children),
}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect_env(home: Path, api_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_CLI_PROMPT="false",
        PREFECT_WORKER_QUERY_SECONDS="2",  # pick the run up quickly (default 10 s)
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        COBALT_REPO=str(REPO),
    )
    env.pop("COBALT_STORAGE", None)
    return env


def prefect(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [*PREFECT, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def work_pool(env: dict[str, str], name: str) -> None:
    """The process work pool `name` on the session's server (created, or kept as it is)."""
    prefect(env, "work-pool", "create", name, "--type", "process", "--overwrite")


def start(env: dict[str, str], args: list[str], log: Path) -> subprocess.Popen:
    """A long-running Prefect process in its own process group, output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [*PREFECT, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)  # its own group: the worker's flow-run children too
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_deployment(env: dict[str, str], name: str, params: dict, **flow_params) -> str:
    """`prefect deployment run NAME --params ...` (`params`, and any other parameter of the
    flow as a keyword); returns the flow run id."""
    given = json.dumps({"params": params, **flow_params})
    out = prefect(env, "deployment", "run", name, "--params", given)
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
    assert match, out
    return match.group(1)


def poll(env: dict[str, str], flow_run_id: str, timeout: float = RUN_TIMEOUT) -> dict:
    """The run's final state, message, artifact keys and subflow runs (polled in a child
    process)."""
    out = subprocess.run(
        [sys.executable, "-c", POLL, flow_run_id, str(timeout)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for(env: dict[str, str], flow_run_id: str, logs: Path, timeout: float = RUN_TIMEOUT):
    """`poll`, the run Completed."""
    result = poll(env, flow_run_id, timeout)
    assert result["state"] == "COMPLETED", f"{result}\n" + tail(logs / "worker.log")
    return result


def tail(log: Path, n: int = 60) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return f"--- {log.name} ---\n" + "\n".join(lines[-n:])


@pytest.mark.slow
@pytest.mark.xdist_group("deploy")
@pytest.mark.usefixtures("cpu_worker")
def test_data_deployment_runs_on_a_worker(server, tmp_path):
    env, logs = server
    storage = tmp_path / "storage"
    params = {
        "sources": SAMPLE_SOURCES,
        "rules": {"min_tests": 1},
        "sandbox": {"backend": "namespace", "concurrency": 2},
        "storage": {"url": str(storage)},
    }
    flow_run_id = run_deployment(env, "data/data", params)
    result = wait_for(env, flow_run_id, logs)

    # the problem sets were committed in the storage the run was given
    latest = json.loads((storage / "datasets" / "problemsets" / "LATEST.json").read_text())
    sets = Path(latest["uri"])
    manifest = json.loads((sets / "MANIFEST.json").read_text())
    assert {name: t["rows"] for name, t in manifest["tables"].items()} == EXPECTED_SETS
    assert all((sets / path).is_file() for path in manifest["files"].values()), manifest["files"]
    manifests = sorted(p.relative_to(storage) for p in storage.glob("datasets/**/MANIFEST.json"))
    assert len(manifests) >= 4, manifests  # per-source stages + the problem sets
    # and the run reported its counts as artifacts
    assert result["artifacts"].get("data-counts") == "table", result
    assert result["artifacts"].get("data-summary") == "markdown", result


DEPLOYMENTS = (
    "data/data",
    "trajectories/trajectories",
    "trajectories/nightly-evaluation",
    "training/training",
    "training/training-multi-gpu",
    "training/training-node",
    "training-nodes/training-nodes",
    "trajectories/trajectories-cluster",
    "reward-hacking/reward-hacking",
    "pipeline/pipeline",
    "pipeline/pipeline-gpu",
    "pipeline/pipeline-gpu4",
)


def test_prefect_yaml_lists_every_deployment_with_valid_parameters():
    """No server: every deployment of prefect.yaml is in DEPLOYMENTS (and back), and its
    parameters validate against its flow's params model, as a worker would build them."""
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    names = []
    for deployment in spec["deployments"]:
        path, name = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        names.append(f"{flow.name}/{deployment['name']}")
        model = typing.get_type_hints(flow.fn)["params"]
        model.model_validate(deployment["parameters"]["params"])  # raises on a bad field
    assert sorted(names) == sorted(DEPLOYMENTS)


@pytest.mark.parametrize("path", sorted((REPO / "scripts/gpu/params").glob("*.json")), ids=str)
def test_the_gpu_runs_parameters_validate(path: Path, tmp_path: Path):
    """The parameters `scripts/gpu/worker.sh deploy` hands pipeline-gpu (docs/SCALING.md) are
    PipelineParams a worker accepts: a GPU call is not spent on a typo."""
    from trl import GRPOConfig

    from cobalt.pipeline import PipelineParams
    from cobalt.training.grpo import check_generation_batch

    params = PipelineParams.model_validate(json.loads(path.read_text())["params"])
    if params.training.mode == "single_turn" and params.train_limit:
        # one row per problem: enough for a whole generation batch (else TRL runs no step)
        kwargs = params.training.grpo_kwargs(tmp_path) | {"bf16": False, "use_cpu": True}
        args = GRPOConfig(**kwargs)
        check_generation_batch(params.train_limit, args.generation_batch_size, args.num_generations)


@pytest.mark.slow
@pytest.mark.xdist_group("deploy")
@pytest.mark.usefixtures("cpu_worker")
def test_every_deployment_registers_and_the_pipeline_runs_on_a_worker(
    server, deployed, tmp_path, fitted_model
):
    """Every deployment of prefect.yaml registers (`prefect deploy --all`, the session's), and
    `pipeline` runs on a process worker to the end (artifacts, summary, policy). Over 60 s: a
    small pipeline in the worker's flow-run process."""
    env, logs = server
    storage = tmp_path / "storage"
    for name in DEPLOYMENTS:
        assert name in deployed, (name, deployed)
    # the deployment's embedded default, smaller: the shared fitted model stands in for the
    # fit (the same recipe), fewer problems, 4 samples a problem when evaluating, one step
    params = {
        "reference": str(fitted_model["path"]),
        "train_limit": 8,
        "eval_limit": 4,
        "eval_samples": 4,
        "training": {
            "preset": "tiny",
            "max_steps": 1,
            "overrides": {
                "num_generations": 4,
                "per_device_train_batch_size": 4,
                "max_completion_length": 96,
            },
        },
        "sandbox": {"backend": "namespace", "concurrency": 2},
        "storage": {"url": str(storage)},
    }
    flow_run_id = run_deployment(env, "pipeline/pipeline", params)
    result = wait_for(env, flow_run_id, logs, timeout=600)

    assert {"pipeline-stages", "pipeline-before-after", "pipeline-summary"} <= set(
        result["artifacts"]
    ), result
    summary = json.loads(next(storage.glob("pipeline/*/summary.json")).read_text())
    assert [s["stage"] for s in summary["stages"]][-1] == "evaluation after (test set, trained)"
    assert {r["turn"] for r in summary["before_after"]} == {0, 1, 2}
    training = next(storage.glob("training/*/MANIFEST.json")).parent
    assert (training / "config.json").exists() and (training / "log_history.json").exists()
