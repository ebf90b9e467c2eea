"""Training on two machines from Prefect (issue 47), as an operator runs it, on one host: a real
Prefect server, `prefect deploy` of `training-node` and `training-nodes`, a worker of the GPU pool
on each node's work queue (node-0, node-1: here two workers on one host, CPU processes over
gloo), a worker of the CPU pool for the coordinating flow, `prefect deployment run`, S3 storage
(moto) shared by the nodes; the pipeline with `--nodes 2` through the same workers. Then one
node's worker gone: the node that started fails at the
rendezvous and the coordinating flow cancels the other and fails naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_deployment import REPO, free_port, poll, prefect, run_deployment, start, stop, tail


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

        # node 1's host is gone: node 0 waits at the rendezvous, fails, node 1's run is cancelled
        stop(nodes[1])
        endpoint = {"rdzv_endpoint": f"127.0.0.1:{free_port()}"}
        run = run_deployment(
            env, "training-nodes/training-nodes",
            params | {"training": training | endpoint | {"max_steps": 3}},
        )  # fmt: skip
        lost = poll(env, run, timeout=600)
    finally:
        for worker in (coordinator, *nodes):
            stop(worker)
    assert lost["state"] == "FAILED", lost
    assert "node 0's training run node-0-of-2 ended FAILED" in lost["message"], lost
    assert ["node-1-of-2", "node-1", "CANCELLED"] in lost["subflows"], lost

    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    manifests = fs.glob(f"{s3_bucket}/runs/training/*/MANIFEST.json")
    assert len(manifests) == 1, manifests  # the first run's policy; the lost run committed none
    assert fs.exists(manifests[0].rsplit("/", 1)[0] + "/model.safetensors")
