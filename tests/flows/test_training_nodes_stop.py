"""A training-nodes run that is stopped (Ctrl-C, or SIGTERM: what a worker sends a flow run
cancelled from the UI) cancels the nodes' runs it placed, instead of leaving them to train on,
or to wait at the rendezvous until its timeout, on the GPU pool (flows/training_nodes.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the coordinating flow, as the pipeline's --nodes or the training-nodes deployment runs it
COORDINATOR = """
import sys
from cobalt.training.settings import TrainingConfig
from cobalt.training.stages import TrainingParams
from flows.training_nodes import training_nodes_flow

params = TrainingParams(
    training=TrainingConfig(nodes=2, rdzv_endpoint="127.0.0.1:29500"),
    storage={"url": sys.argv[1], "shared": True},
)
training_nodes_flow(params, node_deployment=sys.argv[2], poll_s=0.5)
"""


@pytest.mark.usefixtures("prefect_harness")
def test_a_stopped_coordinator_cancels_the_nodes_runs_it_placed(tmp_path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        # the per-node deployment on a pool no worker serves: the nodes' runs stay scheduled
        client.create_work_pool(WorkPoolCreate(name="stop-test-pool", type="process"))
        flow_id = client.create_flow_from_name("training")
        deployment = client.create_deployment(
            flow_id=flow_id,
            name="stop-test",
            work_pool_name="stop-test-pool",
            entrypoint="flows/training.py:training_flow",
        )
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(REPO)}
    coordinator = subprocess.Popen(
        [sys.executable, "-c", COORDINATOR, str(tmp_path / "runs"), "training/stop-test"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    only_ours = DeploymentFilter(id=DeploymentFilterId(any_=[deployment]))
    try:
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 120
            while len(runs := client.read_flow_runs(deployment_filter=only_ours)) < 2:
                assert coordinator.poll() is None, coordinator.stdout.read()[-3000:]
                assert time.monotonic() < deadline, "the coordinator placed no 2 runs in 120 s"
                time.sleep(0.5)
            assert {r.state.type.value for r in runs} == {"SCHEDULED"}
        coordinator.send_signal(signal.SIGTERM)
        out, _ = coordinator.communicate(timeout=60)
    finally:
        coordinator.kill()
    assert coordinator.returncode != 0, out[-3000:]
    assert "cancelled the nodes' runs still going: node-0-of-2, node-1-of-2" in out, out[-3000:]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=only_ours)
    assert sorted((r.name, r.state.type.value, r.state.message) for r in runs) == [
        ("node-0-of-2", "CANCELLED", "the run that placed it stopped"),
        ("node-1-of-2", "CANCELLED", "the run that placed it stopped"),
    ]
