"""Training on two machines from Prefect (issue 47), as an operator runs it, on one host: a real
Prefect server, `prefect deploy` of `training-node` and `training-nodes`, a worker of the GPU pool
on each node's work queue (node-0, node-1: here two workers on one host, CPU processes over
gloo), a worker of the CPU pool for the coordinating flow, `prefect deployment run`, S3 storage
(moto) shared by the nodes; the pipeline with `--nodes 2` through the same workers. Then one
node's worker gone: the node that started fails at the
rendezvous and the coordinating flow cancels the other and fails naming it. Last, the
coordinating run cancelled as from the UI: it cancels the nodes' runs it placed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from test_deployment import REPO, free_port, poll, prefect, run_deployment, start, stop, tail

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


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_nodes_train_through_deployments_and_a_lost_node_cancels_the_run(
    server, tmp_path, s3_endpoint, s3_bucket
):
    env, logs = server
    storage = {"url": f"s3://{s3_bucket}/runs", "endpoint_url": s3_endpoint}
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

    for pool in ("cpu-pool", "gpu-pool"):
        prefect(env, "work-pool", "create", pool, "--type", "process")
    out = prefect(env, "--no-prompt", "deploy", "-n", "training-node", "-n", "training-nodes")
    assert "training/training-node" in out and "training-nodes/training-nodes" in out, out
    coordinator = start(env, ["worker", "start", "--pool", "cpu-pool"], logs / "worker.log")
    nodes = [
        start(env, ["worker", "start", "--pool", "gpu-pool", "--work-queue", f"node-{rank}"],
              logs / f"node-{rank}.log")
        for rank in (0, 1)
    ]  # fmt: skip
    training = {
        "preset": "tiny", "mode": "single_turn", "max_steps": 2, "num_processes": 1,
        "sharding": "ddp", "nodes": 2, "rendezvous_timeout_s": 30,
        "overrides": {"per_device_train_batch_size": 4, "num_generations": 2},
    }  # fmt: skip
    params = {"storage": storage, "sandbox": {"backend": "namespace", "concurrency": 2}}
    try:
        endpoint = {"rdzv_endpoint": f"127.0.0.1:{free_port()}"}
        run = run_deployment(
            env, "training-nodes/training-nodes",
            params | {"training": training | endpoint},
        )  # fmt: skip
        done = poll(env, run, timeout=900)
        assert done["state"] == "COMPLETED", (
            done,
            tail(logs / "node-0.log"),
            tail(logs / "node-1.log"),
        )
        assert done["subflows"] == [
            ["node-0-of-2", "node-0", "COMPLETED"], ["node-1-of-2", "node-1", "COMPLETED"]
        ], done  # fmt: skip

        # the pipeline with --nodes 2: its training stage placed on the two nodes' queues, the
        # policy node 0 committed evaluated on this machine
        pipeline = subprocess.run(
            [sys.executable, "-m", "flows.pipeline", "--model", "tiny", "--mode", "single_turn",
             "--nodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
             "--storage", f"s3://{s3_bucket}/pipeline", "--endpoint-url", s3_endpoint,
             "--work-dir", str(tmp_path / "pipeline-work"), "--backend", "namespace",
             "--sandbox-concurrency", "2", "--train-limit", "4", "--eval-limit", "2", "--n", "2",
             "--turns", "0", "--eval-turns", "0", "--max-new-tokens", "8", "--max-steps", "2",
             "--set", "per_device_train_batch_size=4", "--set", "num_generations=2",
             "--report-to", "none"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        out = pipeline.stdout + pipeline.stderr
        assert pipeline.returncode == 0, (out[-4000:], tail(logs / "node-0.log"))
        assert "training on 2 nodes completed: node-0-of-2, node-1-of-2" in out, out[-4000:]
        assert f"trained policy (a name --model takes): s3://{s3_bucket}/pipeline/training/" in out

        # node 1's host is gone: node 0 waits at the rendezvous, fails (twice: the training
        # task's retry; 10 s each, where the runs above give a slow start 30), node 1's run is
        # cancelled
        stop(nodes[1])
        endpoint = {"rdzv_endpoint": f"127.0.0.1:{free_port()}"}
        lone = {"max_steps": 3, "rendezvous_timeout_s": 10}
        run = run_deployment(
            env, "training-nodes/training-nodes", params | {"training": training | endpoint | lone}
        )  # fmt: skip
        lost = poll(env, run, timeout=600)

        # the coordinating run cancelled (the UI's Cancel; here `prefect flow-run cancel`) while
        # its nodes' runs wait on queues no worker serves: its worker stops it, and it cancels them
        coordinating = run_deployment(
            env, "training-nodes/training-nodes", params | {"training": training | endpoint},
            queue_prefix="idle-",
        )  # fmt: skip
        placed = wait_for_runs_on(env, ["idle-0", "idle-1"], timeout=300)
        assert placed == {"idle-0": "SCHEDULED", "idle-1": "SCHEDULED"}, placed
        prefect(env, "flow-run", "cancel", coordinating)
        cancelled = poll(env, coordinating, timeout=180)
    finally:
        for worker in (coordinator, *nodes):
            stop(worker)
    assert lost["state"] == "FAILED", lost
    assert "node 0's training run node-0-of-2 ended FAILED" in lost["message"], lost
    assert ["node-1-of-2", "node-1", "CANCELLED"] in lost["subflows"], lost

    assert cancelled["state"] in ("CANCELLED", "CRASHED"), cancelled
    assert cancelled["subflows"] == [
        ["node-0-of-2", "idle-0", "CANCELLED"], ["node-1-of-2", "idle-1", "CANCELLED"]
    ], cancelled  # fmt: skip

    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    manifests = fs.glob(f"{s3_bucket}/runs/training/*/MANIFEST.json")
    assert len(manifests) == 1, manifests  # the first run's policy; the lost run committed none
    assert fs.exists(manifests[0].rsplit("/", 1)[0] + "/model.safetensors")
