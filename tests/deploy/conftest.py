"""The deployment tests' Prefect server (a real `prefect server start`, its own PREFECT_HOME),
one for the session, every deployment of prefect.yaml deployed to it once, and one worker of
`cpu-pool`: the tests that use them run on one xdist worker (group "deploy"), one after
another; a test that needs more workers starts and stops them itself."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_deployment import free_port, prefect, prefect_env, start, stop, tail, work_pool


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[tuple[dict[str, str], Path]]:
    """`prefect server start` on a free port with its own PREFECT_HOME (SQLite); yields the
    environment of its clients and the folder of the logs."""
    tmp_path = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(tmp_path / "prefect-home", api_url)
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    logs = tmp_path / "logs"
    logs.mkdir()
    # no UI, no scheduler (the deployment's weekly schedule would only add idle scheduled runs)
    args = ["server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    proc = start(server_env, [*args, "--no-scheduler"], logs / "server.log")
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "the server exited\n" + tail(logs / "server.log")
            try:
                with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no /api/health\n" + tail(logs / "server.log")
            time.sleep(0.5)
        yield env, logs
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def deployed(server) -> str:
    """`cpu-pool` and `gpu-pool` created and `prefect deploy --all` run, as an operator deploys
    the project; returns what `prefect deploy` printed."""
    env, _ = server
    for pool in ("cpu-pool", "gpu-pool"):
        work_pool(env, pool)
    return prefect(env, "--no-prompt", "deploy", "--all", timeout=240)


@pytest.fixture(scope="session")
def cpu_worker(server, deployed) -> Iterator[None]:
    """A process worker of `cpu-pool` (log: worker.log) for every deployment test's runs."""
    env, logs = server
    worker = start(env, ["worker", "start", "--pool", "cpu-pool"], logs / "worker.log")
    try:
        yield
    finally:
        stop(worker)
