"""A local OpenAI-compatible server for a model directory: `transformers serve` (any machine) or
`vllm serve` (GPU, the `gpu` extra), started as a subprocess and waited for, so the LiteLLM engine
can send it many requests at once. For a model served elsewhere, point `EngineConfig.api_base`
at it instead.

    with local_server(model_dir, log_dir, device="cuda", continuous_batching=True) as server:
        engine = make_engine(EngineConfig(kind="litellm", model=server.litellm_model,
                                          api_base=server.api_base, concurrency=128))
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .cpu_threads import decide_threads
from .reaper import alive, descendants, reaper

ServerKind = Literal["transformers", "vllm"]


class ServerError(RuntimeError):
    """The server exited or did not answer in time; the message holds the end of its log."""


@dataclass
class LocalServer:
    proc: subprocess.Popen
    port: int
    log: Path
    model_dir: Path
    kind: ServerKind

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def litellm_model(self) -> str:
        """Both servers name the model by its path; `openai/` picks LiteLLM's protocol."""
        return f"openai/{self.model_dir}"

    def wait_until_up(self, timeout_s: float = 300) -> LocalServer:
        deadline = time.monotonic() + timeout_s
        health = f"http://127.0.0.1:{self.port}/health"
        while True:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"{self.kind} serve exited with {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(health, timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.kind} serve not up after {timeout_s:.0f}s:\n{self.tail()}"
                )
            time.sleep(0.3)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(
    kind: ServerKind,
    model_dir: Path,
    port: int,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    continuous_batching: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's command line; `extra_args` are appended as they are (e.g. vLLM's
    `--load-format dummy --max-model-len 8192 --gpu-memory-utilization 0.8`). vLLM runs as
    `vllm serve` (its console script's module, the interpreter's environment), which starts one
    API server per data-parallel engine."""
    if kind == "vllm":
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir)]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        return command + (["--dtype", dtype] if dtype else []) + list(extra_args)
    code = "import sys; from transformers.cli.transformers import main; sys.exit(main())"
    command = [sys.executable, "-c", code, "serve", str(model_dir), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--device", device, "--log-level", "warning"]
    if dtype:
        command += ["--dtype", dtype]
    if continuous_batching:
        command.append("--continuous-batching")
    return command + list(extra_args)


@contextmanager
def local_server(
    model_dir: str | Path,
    log_dir: str | Path,
    *,
    kind: ServerKind = "transformers",
    device: str = "cpu",
    dtype: str | None = None,
    continuous_batching: bool = False,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[LocalServer]:
    """Start the server on a free port (not yet waited for: `wait_until_up()`); stop it after,
    with every process it started (vLLM's API servers and engine cores). If this process dies
    outright while the server runs (SIGKILL: no `finally`), `reaper()`'s watchdog ends them."""
    port = free_port()
    log_path = Path(log_dir) / f"{kind}-serve-{port}.log"
    command = server_command(
        kind,
        Path(model_dir),
        port,
        device=device,
        dtype=dtype,
        continuous_batching=continuous_batching,
        extra_args=extra_args,
    )
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", **(env or {})}
    if kind == "transformers" and device == "cpu":  # a few threads, not one per core
        environment.setdefault("OMP_NUM_THREADS", str(decide_threads(environment)[0]))
    with running(command, log_path, environment) as proc:
        yield LocalServer(proc, port, log_path, Path(model_dir), kind)


@contextmanager
def running(argv: Sequence[str], log_path: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """`argv` started with its output in `log_path`, in a session of its own (a process group
    that `stop()` ends; a Ctrl-C to the caller reaches it through `stop()`) and under
    `reaper()`; stopped with every process it started when the block ends."""
    with reaper():
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM to the server (vLLM shuts its API servers and engine cores down first), SIGKILL
    after `grace_s`; then SIGKILL to every process it started that still runs: those below it
    now, and the rest of the process group it leads (both servers here start in a session of
    their own), which holds the ones it left behind when it died first: vLLM's engine cores
    outlive an API server killed outright, holding their GPUs."""
    started = descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid, start in started.items():
        if alive(pid, start):  # the same process (not a reused pid), not a zombie
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):  # no such group: it never led one, or it is empty
        os.killpg(proc.pid, signal.SIGKILL)
