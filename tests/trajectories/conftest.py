"""Fixtures of the trajectory tests: a real sandbox (namespace backend: starts in under a second),
the tiny model (built once), and a real `transformers serve` process serving it.

The serving logic is a copy of the engine tests' fixture (nothing is shared with that file).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from trajectory_helpers import free_port

from sandbox import SandboxConfig, SyncJudge

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NAMESPACE = {"backend": "namespace", "concurrency": 2}
SERVE_START_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def judge() -> Iterator[SyncJudge]:
    """One real sandbox pool for the session (namespace isolation, 2 workers)."""
    with SyncJudge(SandboxConfig(**NAMESPACE)) as j:
        yield j


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from engines.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def serve_process(tiny_model, tmp_path_factory) -> Iterator[dict]:
    """`transformers serve <tiny model>` started on a free port (not yet waited for)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", NO_COLOR="1")
    code = "import sys; from transformers.cli.transformers import main; sys.exit(main())"
    cmd = [
        sys.executable,
        "-c",
        code,
        "serve",
        str(tiny_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--log-level",
        "warning",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield {"proc": proc, "port": port, "log": log_path, "model": tiny_model}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def served_tiny(serve_process) -> dict:
    """The served tiny model, once it answers: api_base and the LiteLLM model name."""
    proc, port, log_path = serve_process["proc"], serve_process["port"], serve_process["log"]
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"transformers serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"transformers serve not up after {SERVE_START_TIMEOUT_S}s:\n"
                f"{log_path.read_text()[-3000:]}"
            )
        time.sleep(0.3)
    # a pinned `transformers serve` names its model by its path; `openai/` picks the protocol
    return {"api_base": f"http://127.0.0.1:{port}/v1", "model": f"openai/{serve_process['model']}"}
