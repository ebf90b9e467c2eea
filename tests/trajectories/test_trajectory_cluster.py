"""The trajectories flow on a real Dask cluster (scheduler + 2 worker processes started here,
prefect-dask's DaskTaskRunner): the same records as a run in the flow's own process, and a worker
killed in the middle of a shard loses nothing and duplicates nothing (Dask reruns the task on the
other worker; the shard resumes from the records it had fsynced). The cluster is the `dask_cluster`
fixture of tests/conftest.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect_states import task_run_states
from trajectory_helpers import REPO

from cobalt.trajectories.stages import TrajectoryParams
from flows.trajectories import trajectories_flow

STEPS = ("initial", "multiturn", "evaluation")
VOLATILE = {"created_at", "seconds", "wall_s"}  # when and how long: not what was computed


def params(storage: Path, fitted: Path, **overrides: Any) -> TrajectoryParams:
    return TrajectoryParams.model_validate(
        {
            "problems": f"{REPO}/samples/synthetic_test.jsonl:taco",
            "limit": 16,
            "engine": {"kind": "transformers", "model": str(fitted)},
            "collect": {
                "sampling": {"n": 4, "temperature": 0.6, "max_new_tokens": 96, "seed": 0},
                "turns": 2,
                "system_prompt": "",
            },
            "batch": {"chunk_size": 2, "shard_size": 4},  # 4 shards per step
            "sandbox": {"backend": "namespace", "concurrency": 1},
            "storage": {"url": str(storage)},
            **overrides,
        }
    )


def content(path: Path) -> list[Any]:
    """The records of a JSONL, in order, without the fields that say when or how long."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return [strip(json.loads(line)) for line in path.read_text().splitlines()]


def step_records(summary: Any, step: str) -> Path:
    return Path(getattr(summary, step).uri) / "records.jsonl"


def partial_shards(storage: Path, step: str) -> list[Path]:
    """Shard files of `step` that hold records but are not committed yet (a task mid-run)."""
    found = []
    for path in (storage / "trajectories" / step).glob("*/shards/*/records.jsonl"):
        if path.stat().st_size and not (path.parent / "MANIFEST.json").exists():
            found.append(path)
    return found


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_cluster_run_equals_a_local_run_and_survives_a_killed_worker(
    tmp_path, fitted_model, dask_cluster
):
    import torch

    fitted = fitted_model["path"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' setting: same arithmetic, same samples
    try:
        local = trajectories_flow(params(tmp_path / "local", fitted))
    finally:
        torch.set_num_threads(threads)

    storage = tmp_path / "cluster"
    result: dict[str, Any] = {}

    def run_on_cluster() -> None:
        state = trajectories_flow(
            params(storage, fitted, cluster=dask_cluster["address"]), return_state=True
        )
        result["state"] = state

    thread = threading.Thread(target=run_on_cluster)
    thread.start()
    killed_mid_shard: list[Path] = []
    deadline = time.monotonic() + 600
    while thread.is_alive() and time.monotonic() < deadline:
        busy = partial_shards(storage, "multiturn")
        if len(busy) == 2:  # both workers inside a multiturn shard: kill one of them
            killed_mid_shard = busy
            os.killpg(dask_cluster["workers"][0].pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    thread.join(timeout=600)
    assert killed_mid_shard, "the workers were never both inside a multiturn shard"
    assert dask_cluster["workers"][0].wait(timeout=10) == -signal.SIGKILL

    state = result["state"]
    assert state.is_completed(), state.message
    remote = state.result()
    for step in STEPS:
        lines = step_records(remote, step).read_text().splitlines()
        ids = [json.loads(line)["problem_id"] for line in lines]
        assert len(ids) == len(set(ids)) == 16, step  # every problem once
        assert content(step_records(remote, step)) == content(step_records(local, step)), step
    assert remote.table == local.table
    # the shard that was cut short was finished elsewhere, each of its problems written once
    for shard in killed_mid_shard:
        assert (shard.parent / "MANIFEST.json").exists()
        ids = [json.loads(line)["problem_id"] for line in shard.read_text().splitlines()]
        assert len(ids) == len(set(ids)) == 4
    states = task_run_states(state.state_details.flow_run_id)
    shard_runs = [name for name in states if "-merge-" not in name]
    assert len(shard_runs) == 12 and set(states.values()) == {"Completed"}, states
    # the engines the shards opened in the workers were closed with the stage (a served engine
    # would keep a node's GPUs from the training stage after it)
    from distributed import Client

    from cobalt.trajectories.stages import close_engines

    with Client(dask_cluster["address"], timeout=60) as client:
        left = client.run(close_engines)
    assert left and set(left.values()) == {0}, left
