"""A GPU worker of the cluster can start vLLM: vLLM's in-process engine starts its engine core as
a child process, which Dask's nanny-started (daemonic) workers may not have. `--cluster local:N`
starts workers that can; a daemonic one gets a one-line error naming the fix instead of vLLM's
bare AssertionError (vLLM itself needs a GPU: the check runs before it, and the child process
here is the same `multiprocessing` start vLLM makes), and vLLM spawns that process rather than
forking it. Without a Prefect server, `local:N` workers report to the flow's temporary one."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import types
from pathlib import Path

from distributed import Client, LocalCluster

from engines import EngineConfig
from engines.vllm_engine import DAEMONIC, VLLMEngine, check_can_start_children
from tasks.cluster import on_every_worker, task_runner


def start_a_child() -> str:
    """What vLLM's engine needs of its process: the vLLM check, then a child process started."""
    try:
        check_can_start_children()
        child = multiprocessing.get_context("spawn").Process(target=int)
        child.start()
        child.join(timeout=60)
        return f"child exit {child.exitcode}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def test_local_cluster_workers_can_start_vllm_engine_processes() -> None:
    with task_runner("local:1") as runner:
        [outcome] = on_every_worker(runner, start_a_child).values()
    assert outcome == "child exit 0"


def test_a_daemonic_worker_is_told_how_to_start_its_workers() -> None:

    # a nanny's default, as `dask worker` without DASK_DISTRIBUTED__WORKER__DAEMON=False
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        [outcome] = client.run(start_a_child).values()
    assert outcome == f"RuntimeError: {DAEMONIC}"
    assert "DASK_DISTRIBUTED__WORKER__DAEMON=False" in outcome


def test_vllm_starts_its_engine_core_by_spawn(monkeypatch) -> None:
    """vLLM forks its engine core unless it sees CUDA initialised, and in the pipeline's Dask
    worker the forked core could not use CUDA (docs/SCALING.md); the engine has vLLM spawn it (a
    user's own setting wins). vLLM stood in by a module that records the setting its `LLM` finds."""

    seen = []

    class LLM:
        def __init__(self, **kwargs):
            seen.append(os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"))

        def get_tokenizer(self):
            return types.SimpleNamespace(get_added_vocab=dict)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    VLLMEngine(EngineConfig(kind="vllm", model="m"))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    VLLMEngine(EngineConfig(kind="vllm", model="m"))
    assert seen == ["spawn", "fork"]


PROBE = """
import json
from prefect import flow
from prefect.client.orchestration import get_client
from tasks.cluster import on_every_worker, task_runner

def api():
    from prefect.client.orchestration import get_client
    return str(get_client(sync_client=True).api_url)

@flow
def probe():
    with task_runner("local:1") as runner:
        return api(), list(on_every_worker(runner, api).values())

print("RESULT", json.dumps(probe()))
"""


def test_local_workers_report_to_the_flows_temporary_server(tmp_path) -> None:
    """Without a Prefect server (the embedded default), the flow's process starts a temporary
    one; `local:N` workers report to it rather than each starting its own on the same
    database."""

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(repo))
    # the temporary server's start-up time as the flows' command line sets it (Prefect's 20 s
    # default timed out once on the 2-core CI machine under load, 2026-12-01)
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=repo, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, done.stdout[-2000:] + done.stderr[-2000:]
    flow_api, worker_apis = json.loads(results[0].removeprefix("RESULT "))
    assert flow_api.startswith("http://127.0.0.1:") and worker_apis == [flow_api]
