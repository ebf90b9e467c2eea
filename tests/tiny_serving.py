"""A real `transformers serve` process serving the tiny model on 127.0.0.1, for the tests of the
LiteLLM path (engine and trajectory tests share it). Offline: no Hub, no price-list download."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVE_START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    log: Path
    model_dir: Path

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        """A pinned `transformers serve` names its model by its path; `openai/` picks the protocol."""
        return f"openai/{self.model_dir}"

    def wait_until_up(self) -> Served:
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"transformers serve exited with {self.proc.returncode}:\n"
                    f"{self.log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"transformers serve not up after {SERVE_START_TIMEOUT_S}s:\n"
                    f"{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.3)


@contextmanager
def serve_tiny_model(model_dir: Path, log_dir: Path) -> Iterator[Served]:
    """Start `transformers serve <model_dir>` on a free port (not yet waited for); stop it after."""
    port = free_port()
    log_path = log_dir / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", NO_COLOR="1")
    code = "import sys; from transformers.cli.transformers import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "serve", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--device", "cpu", "--log-level", "warning"]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield Served(proc, port, log_path, model_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
