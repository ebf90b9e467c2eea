"""A vLLM server of the training stage's own (`training.vllm_server_gpus`, --vllm-server-gpus).

The launch gives the training processes the first GPUs it may use and the server the next ones
(`split_gpus`), starts the server as `trl vllm-serve` would (TRL's own command builder: vLLM's
OpenAI server with the NCCL weight-transfer engine and the logprob settings TRL's client needs,
data parallel over its GPUs), starts training while the server starts (each training process
loads its model, then waits for the server: `wait_for_server`), ends training at once if the
server exits, and stops the server with every process it started when training ends, whether it
succeeded or not (and when the stage's process dies outright). TRL's server mode does the rest:
the main training process joins the server's weight-transfer group and pushes the current
weights at each generating step; each process sends its own prompts to `/v1/completions`.

    with generation_server(model, ["2", "3"], log_dir, max_model_len=1536, wait=False) as server:
        ...  # train with vllm_mode="server", vllm_server_base_url=server.url, and
             # server.exited() watched: a message once the server has ended

Plain Python, no Prefect.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engines.serving import LocalServer, ServerError, free_port, running

START_TIMEOUT_S = 900  # vLLM's start-up at 8B: weights, torch.compile, CUDA graphs (~1-3 min)


def visible_gpu_ids(environ: dict[str, str], count: int) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (else 0..count-1)."""
    shown = environ.get("CUDA_VISIBLE_DEVICES")
    if shown is not None and shown.strip():
        return [g.strip() for g in shown.split(",") if g.strip()]
    return [str(i) for i in range(count)]


def split_gpus(visible: Sequence[str], processes: int, server: int) -> tuple[list[str], list[str]]:
    """(the training processes' GPUs, the server's): the first `processes`, then `server` more."""
    if processes + server > len(visible):
        raise ValueError(
            f"training on {processes} GPU(s) beside a vLLM server on {server} needs "
            f"{processes + server} GPUs; {len(visible)} visible ({', '.join(visible) or 'none'})"
        )
    return list(visible[:processes]), list(visible[processes : processes + server])


def server_command(
    model: str | Path,
    port: int,
    gpus: int,
    max_model_len: int | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
) -> list[str]:
    """`trl vllm-serve`'s command line (TRL's builder) for `model` on `gpus` GPUs (one engine
    each), on 127.0.0.1:`port`, prefix caching on (a prompt's samples share its KV cache),
    sampling defaults vLLM's own rather than the model's generation_config.json; `quantization`
    ('fp8'): vLLM's online quantization of the model it loads, redone by vLLM's weight transfer
    at each update (it reloads the sent weights layer by layer and quantizes them again);
    `kv_cache_dtype` ('fp8'): the keys and values it caches stored in that type (None: the
    model's)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    arguments = ScriptArguments(
        model=str(model),
        host="127.0.0.1",
        port=port,
        data_parallel_size=gpus,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        log_level="warning",
        kv_cache_dtype=kv_cache_dtype or "auto",
    )
    # the sampling defaults vLLM's own, as in the colocated engine's explicit SamplingParams
    # (else the model's generation_config.json fills any field a request leaves out)
    extra = ["--generation-config", "vllm"]
    if quantization:
        extra += ["--quantization", quantization]
    return build_command(arguments, extra)


def server_env(environ: dict[str, str], gpus: Sequence[str]) -> dict[str, str]:
    """The server's environment: its GPUs only, vLLM's development endpoints on (the weight
    transfer and prefix-cache reset TRL's client calls), offline, its own compile cache."""
    return {
        **environ,
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),
        "VLLM_SERVER_DEV_MODE": "1",
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
        "VLLM_CACHE_ROOT": vllm_cache_root(0, environ) + "-server",
    }


def vllm_cache_root(device: int, environ: dict[str, str]) -> str:
    """The vLLM cache directory of a process on logical GPU `device`: vLLM's own
    (VLLM_CACHE_ROOT, else XDG_CACHE_HOME or ~/.cache, then vllm) with `cuda<device>` under it.

    vLLM 0.26 keys its torch.compile artifacts by rank only (rank_<rank>_<dp>), yet the compiled
    code names the logical GPU it was built on: a later run whose rank R sits on another GPU
    (1 node x 2 after 2 nodes x 1, 2 x 2 after 1 x 4) loads rank R's artifact and that process
    dies starting vLLM (the others then see "Connection closed by peer"). One directory per GPU
    index keeps every artifact on the GPU it was built for (vLLM's fix upstream: PR 38962)."""
    root = environ.get("VLLM_CACHE_ROOT") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm"
    )
    return os.path.join(os.path.expanduser(root), f"cuda{device}")


@dataclass
class GenerationServer:
    """The stage's server as it runs: its base URL, GPUs (physical ids) and process."""

    url: str
    gpus: list[str]
    local: LocalServer

    def exited(self) -> str | None:
        """None while the server runs; once it has ended, what to tell the user (its GPUs, its
        exit code, the end of its log)."""
        code = self.local.proc.poll()
        if code is None:
            return None
        return (
            f"the training stage's vLLM server on GPU(s) {','.join(self.gpus)} exited with "
            f"{code}:\n{self.local.tail()}"
        )


@contextmanager
def generation_server(
    model: str | Path,
    gpus: Sequence[str],
    log_dir: str | Path,
    *,
    max_model_len: int | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
    timeout_s: float = START_TIMEOUT_S,
    wait: bool = True,
    command: Callable[[int], list[str]] | None = None,
) -> Iterator[GenerationServer]:
    """Start the server on `gpus` (physical ids) and yield it (`wait`: once it answers, else at
    once, the caller watching `exited()`); stop it after. With `wait`, ServerError (with the end
    of its log, `log_dir`/vllm-server.log) if it exits or does not answer within `timeout_s`.
    `command(port)`: another server, for tests."""
    port = free_port()
    argv = (
        command(port)
        if command
        else server_command(model, port, len(gpus), max_model_len, quantization, kv_cache_dtype)
    )
    log_path = Path(log_dir) / "vllm-server.log"
    with running(argv, log_path, server_env(dict(os.environ), gpus)) as proc:
        local = LocalServer(proc, port, log_path, Path(model), "vllm")
        if wait:
            try:
                local.wait_until_up(timeout_s)
            except ServerError as exc:
                raise ServerError(
                    f"the training stage's vLLM server on GPU(s) {','.join(gpus)}: {exc}"
                ) from None
        yield GenerationServer(f"http://127.0.0.1:{port}", list(gpus), local)


def wait_for_server(url: str, timeout_s: float, poll_s: float = 1.0) -> float:
    """Wait until the server at `url` answers /health (a training process, after loading its
    model, before anything it must do together with the others); the seconds waited.
    TimeoutError naming the URL if it does not within `timeout_s`."""
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(
                f"the vLLM server at {url} did not answer within {timeout_s:.0f} s after this "
                "process loaded its model (the stage's server logs to .launch/vllm-server.log; "
                "--set vllm_server_timeout=SECONDS waits longer)"
            )
        time.sleep(poll_s)
