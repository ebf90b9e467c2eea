"""Training on two machines from Prefect, as an operator runs it, on one host: a real
Prefect server, `prefect deploy --all` (`training-node` and `training-nodes` among them), a
worker of the GPU pool on each node's work queue (node-0, node-1: here two workers on one host,
CPU processes over gloo), a worker of the CPU pool for the coordinating flow, `prefect
deployment run`, S3 storage (moto) shared by the nodes; the pipeline with `--nodes 2` through
the same workers. Then a node whose queue no worker serves: the node that started fails at the
rendezvous and the coordinating flow cancels the other and fails naming it. Last, the
coordinating run cancelled as from the UI: it cancels the nodes' runs it placed. The tests
share the server, the deployments and the workers (one xdist worker runs them in order)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_deployment import (
    REPO,
    free_port,
    poll,
    prefect,
    run_deployment,
    start,
    stop,
    tail,
)

# the state of each flow run placed on one of the queues named in argv[1] (a JSON list)
RUNS_ON = """
import json, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterWorkQueueName

queues = json.loads(sys.argv[1])
only = FlowRunFilter(work_queue_name=FlowRunFilterWorkQueueName(any_=queues))
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(flow_run_filter=only)
print(json.dumps({r.work_queue_name: r.state.type.value for r in runs if r.state}))
"""


def wait_for_runs_on(env: dict, queues: list[str], timeout: float) -> dict[str, str]:
    """Each of `queues`' flow run state once every queue has one (or what is there at timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run([sys.executable, "-c", RUNS_ON, json.dumps(queues)], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        found = json.loads(out.stdout.strip().splitlines()[-1])
        if len(found) == len(queues) or time.monotonic() > deadline:
            return found
        time.sleep(2)


pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deploy")]
TRAINING = {
    "preset": "tiny", "mode": "single_turn", "max_steps": 2, "num_processes": 1,
    "sharding": "ddp", "nodes": 2, "rendezvous_timeout_s": 30,
    "overrides": {"per_device_train_batch_size": 4, "num_generations": 2},
}  # fmt: skip


@pytest.fixture(scope="module")
def nodes(server, cpu_worker, tmp_path_factory, s3_endpoint) -> Iterator[dict[str, Any]]:
    """Trajectories collected into S3 storage (moto), with the session's deployments and its
    worker of the CPU pool (the coordinating flows), a worker of the GPU pool on each node's
    queue (node-0, node-1); yields what the tests need and stops the node workers."""
    import s3fs

    env, logs = server
    tmp_path = tmp_path_factory.mktemp("nodes")
    bucket = "training-nodes"
    s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True).mkdir(bucket)
    storage = {"url": f"s3://{bucket}/runs", "endpoint_url": s3_endpoint}
    problems = tmp_path / "problems.jsonl"
    sys.path.insert(0, str(REPO / "tests" / "trajectories"))
    from trajectory_helpers import doubling

    problems.write_text("".join(doubling(f"p{i}").model_dump_json() + "\n" for i in range(4)))
    collect = subprocess.run(
        [sys.executable, "-m", "flows.trajectories", "--problems", str(problems), "--storage",
         storage["url"], "--endpoint-url", s3_endpoint, "--backend", "namespace", "--n", "2",
         "--turns", "0", "--max-new-tokens", "8", "--work-dir", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stderr[-3000:]

    workers = [
        start(env, ["worker", "start", "--pool", "gpu-pool", "--work-queue", f"node-{rank}"],
              logs / f"node-{rank}.log")
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        yield {
            "env": env, "logs": logs, "tmp": tmp_path, "bucket": bucket, "endpoint": s3_endpoint,
            "params": {"storage": storage, "sandbox": {"backend": "namespace", "concurrency": 2}},
        }  # fmt: skip
    finally:
        for worker in workers:
            stop(worker)


def test_the_pipeline_trains_on_two_nodes_through_the_deployments(nodes):
    """The pipeline with --nodes 2: its training stage runs `training-nodes`' placement, the
    node runs on node-0 and node-1 complete, node 0 commits one policy to the shared storage,
    and this machine evaluates it. (~100 s: a small pipeline run, and for each node a flow run's
    Python process and its training process.)"""
    env, logs, bucket, endpoint = nodes["env"], nodes["logs"], nodes["bucket"], nodes["endpoint"]
    pipeline = subprocess.run(
        [sys.executable, "-m", "flows.pipeline", "--model", "tiny", "--mode", "single_turn",
         "--nodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
         "--storage", f"s3://{bucket}/pipeline", "--endpoint-url", endpoint,
         "--work-dir", str(nodes["tmp"] / "pipeline-work"), "--backend", "namespace",
         "--sandbox-concurrency", "2", "--train-limit", "4", "--eval-limit", "2", "--n", "2",
         "--turns", "0", "--eval-turns", "0", "--max-new-tokens", "8", "--max-steps", "2",
         "--set", "per_device_train_batch_size=4", "--set", "num_generations=2",
         "--report-to", "none"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = pipeline.stdout + pipeline.stderr
    assert pipeline.returncode == 0, (out[-4000:], tail(logs / "node-0.log"))
    assert "training on 2 nodes completed: node-0-of-2, node-1-of-2" in out, out[-4000:]
    assert f"trained policy (a name --model takes): s3://{bucket}/pipeline/training/" in out

    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    manifests = fs.glob(f"{bucket}/pipeline/training/*/MANIFEST.json")
    assert len(manifests) == 1, manifests  # node 0's alone
    assert fs.exists(manifests[0].rsplit("/", 1)[0] + "/model.safetensors")


def test_a_lost_node_fails_the_run_and_cancels_the_other(nodes):
    """Node 1's host is gone (no worker serves its queue): node 0 waits at the rendezvous and
    fails (twice: the training task's retry, 10 s each), and the coordinating flow cancels node
    1's run, fails naming node 0's, and no policy is committed."""
    env, logs = nodes["env"], nodes["logs"]
    alone = start(env, ["worker", "start", "--pool", "gpu-pool", "--work-queue", "lost-0"],
                  logs / "lost-0.log")  # fmt: skip
    lone = {"max_steps": 3, "rendezvous_timeout_s": 10}
    endpoint = {"rdzv_endpoint": f"127.0.0.1:{free_port()}"}
    try:
        run = run_deployment(
            env, "training-nodes/training-nodes",
            nodes["params"] | {"training": TRAINING | endpoint | lone},
            queue_prefix="lost-",
        )  # fmt: skip
        lost = poll(env, run, timeout=600)
    finally:
        stop(alone)
    assert lost["state"] == "FAILED", (lost, tail(logs / "lost-0.log"))
    assert "node 0's training run node-0-of-2 ended FAILED" in lost["message"], lost
    assert "only 1 of 2 nodes joined at the rendezvous" in lost["message"], lost
    assert ["node-1-of-2", "lost-1", "CANCELLED"] in lost["subflows"], lost

    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=nodes["endpoint"], skip_instance_cache=True)
    assert fs.glob(f"{nodes['bucket']}/runs/training/*/MANIFEST.json") == []


def test_a_cancelled_coordinating_run_cancels_the_runs_it_placed(nodes):
    """The coordinating run cancelled (the UI's Cancel; here `prefect flow-run cancel`) while its
    nodes' runs wait on queues no worker serves: its worker stops it, and it cancels them."""
    env = nodes["env"]
    endpoint = {"rdzv_endpoint": f"127.0.0.1:{free_port()}"}
    coordinating = run_deployment(
        env, "training-nodes/training-nodes", nodes["params"] | {"training": TRAINING | endpoint},
        queue_prefix="idle-",
    )  # fmt: skip
    placed = wait_for_runs_on(env, ["idle-0", "idle-1"], timeout=300)
    assert placed == {"idle-0": "SCHEDULED", "idle-1": "SCHEDULED"}, placed
    prefect(env, "flow-run", "cancel", coordinating)
    cancelled = poll(env, coordinating, timeout=180)
    assert cancelled["state"] in ("CANCELLED", "CRASHED"), cancelled
    assert cancelled["subflows"] == [
        ["node-0-of-2", "idle-0", "CANCELLED"], ["node-1-of-2", "idle-1", "CANCELLED"]
    ], cancelled  # fmt: skip
