"""vLLM on every GPU. The served engine (a local server that the engine starts, waits
for and stops, every request of a call sent at once through the LiteLLM engine) runs here on CPU
against a real `transformers serve` of the tiny model, the path `vllm serve --data-parallel-size
N` takes on a GPU host; the `vllm serve` command line it builds; how many engines
`data_parallel_size` resolves to, and its errors. vLLM itself runs on GPUs only
(`benchmarks/rollout_gpus.py`, docs/SCALING.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from engines import EngineConfig, GPUCountError, SamplingConfig, make_engine
from engines.reaper import alive, descendants
from engines.served_engine import Launch, ServedEngine
from engines.serving import ServerError, server_command, stop
from engines.vllm_engine import engine_kwargs, vllm_launch

A = [{"role": "user", "content": "Write a program that prints the sum of two numbers."}]
B = [{"role": "user", "content": "Read n and print n squared."}]


def texts(results):
    return [[c.text for c in row] for row in results]


def test_the_served_engine_starts_generates_and_stops_its_server(tiny_model_dir):
    from cobalt.trajectories.batching import per_call
    from cobalt.trajectories.collect import BatchConfig

    local = make_engine(EngineConfig(kind="transformers", model=str(tiny_model_dir)))
    prompt = {i: local.generate([c], SamplingConfig(max_new_tokens=1))[0][0].prompt_tokens
              for i, c in enumerate((A, B))}  # fmt: skip
    # one request at a time: `transformers serve` shares one generator between requests
    launch = Launch(
        "transformers", env={"OMP_NUM_THREADS": "1"}, concurrency=1, use_n=False, replicas=2
    )
    engine = ServedEngine(EngineConfig(kind="transformers", model=str(tiny_model_dir)), launch)
    server, log_dir = engine.server, Path(engine.log_dir)
    try:
        sampling = SamplingConfig(n=2, max_new_tokens=12, seed=3)
        first = engine.generate([A, B, A], sampling)
        again = engine.generate([A, B, A], sampling)
        assert texts(first) == texts(again)  # seeded per conversation: reproducible
        assert texts(first)[0] != texts(first)[2]  # the same conversation, its own seed
        for row, expected in zip(first, (prompt[0], prompt[1], prompt[0]), strict=True):
            assert len(row) == 2
            for c in row:
                assert c.ok, c.error
                assert c.finish_reason in ("stop", "length")
                assert c.prompt_tokens == expected  # the same chat template as in the process
                assert 1 <= c.completion_tokens <= 12
        assert engine.generate([], sampling) == []
        # the trajectory stage gives each call a chunk of problems per engine behind the server
        assert per_call(BatchConfig(chunk_size=3), engine).chunk_size == 6
        assert per_call(BatchConfig(chunk_size=3), local).chunk_size == 3
    finally:
        engine.close()
    assert server.proc.poll() is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=2)
    assert not log_dir.exists()


def test_a_server_that_does_not_start_fails_with_the_end_of_its_log(tiny_model_dir):
    launch = Launch("transformers", args=("--no-such-flag",), start_timeout_s=120)
    with pytest.raises(ServerError, match=r"(?s)transformers serve exited with \d+:.*no-such-flag"):
        ServedEngine(EngineConfig(kind="transformers", model=str(tiny_model_dir)), launch)


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def test_stopping_a_server_ends_every_process_it_started():
    """vLLM's server starts API servers and engine cores: whatever of them outlives the server's
    own shutdown (here a child that ignores SIGTERM) is killed."""
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {STUBBORN!r}])\n"
        "time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    started = _children_once_started(proc)
    stop(proc, grace_s=5)
    assert proc.poll() is not None
    _assert_ended(started)


def test_stopping_a_server_that_died_first_ends_what_it_left():
    """An API server that died on its own (killed by the kernel's OOM killer, a crash) leaves its
    engine cores running, adopted by init and no longer below it: stop() ends them through
    the process group the server led."""
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {STUBBORN!r}])\n"
        "time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    started = _children_once_started(proc)
    proc.kill()
    proc.wait()
    assert all(alive(p, t) for p, t in started.items())  # orphaned, still running
    try:
        stop(proc, grace_s=5)
        _assert_ended(started)
    finally:
        for pid, t in started.items():
            if alive(pid, t):
                os.kill(pid, signal.SIGKILL)


def _children_once_started(proc: subprocess.Popen) -> dict[int, str]:
    deadline = time.monotonic() + 60
    while not descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    started = descendants(proc.pid)
    assert len(started) == 1
    return started


def _assert_ended(started: dict[int, str]) -> None:
    deadline = time.monotonic() + 10
    while any(alive(p, t) for p, t in started.items()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p, t) for p, t in started.items())


def test_vllm_serve_mirrors_the_in_process_engine_with_data_parallel_engines():
    config = EngineConfig(
        kind="vllm",
        model="/models/m",
        data_parallel_size=4,
        gpu_memory_utilization=0.8,
        max_model_len=8192,
        dtype="bfloat16",
        extra={"load_format": "dummy", "seed": 3, "enforce_eager": True, "x": {"a": 1}},
    )
    launch = vllm_launch(config, 4)
    command = server_command("vllm", Path("/models/m"), 8000, extra_args=launch.args)
    assert command[1:6] == ["-m", "vllm.entrypoints.cli.main", "serve", "/models/m", "--host"]

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert value("--data-parallel-size") == "4"
    assert value("--generation-config") == "vllm"  # the model's sampling defaults stay off
    assert value("--port") == "8000"
    # every argument of the in-process LLM(...) is a flag of the server
    assert engine_kwargs(config) == {
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.8,
        "dtype": "bfloat16",
        "max_model_len": 8192,
        "load_format": "dummy",
        "seed": 3,
        "enforce_eager": True,
        "x": {"a": 1},
    }
    assert value("--tensor-parallel-size") == "1"
    assert value("--gpu-memory-utilization") == "0.8"
    assert value("--max-model-len") == "8192"
    assert value("--dtype") == "bfloat16"
    assert value("--load-format") == "dummy"
    assert value("--seed") == "3"
    assert value("--x") == '{"a": 1}'
    assert "--enforce-eager" in command
    # every request asks for its token ids (exact counts); `n` is honoured; all in flight
    assert launch.request_extra == {"extra_body": {"return_token_ids": True}}
    assert (launch.use_n, launch.replicas, launch.concurrency) == (True, 4, 4096)
    assert launch.route  # each request names its engine: a conversation's samples on one


def test_data_parallel_size_resolves_to_the_visible_gpus():
    from engines import resolve_data_parallel

    def engines(gpus: int, **fields) -> int:
        return resolve_data_parallel(EngineConfig(kind="vllm", model="m", **fields), gpus=gpus)

    assert engines(4) == 4  # auto: every GPU
    assert engines(4, tensor_parallel_size=2) == 2
    assert engines(1) == 1 and engines(0) == 1  # one GPU (or none yet): vLLM in the process
    assert engines(4, data_parallel_size=2) == 2  # fewer than there are
    assert engines(0, data_parallel_size=1) == 1  # 1 is never checked against the machine
    with pytest.raises(GPUCountError) as error:
        engines(2, data_parallel_size=4)
    assert str(error.value).startswith(
        "engine.data_parallel_size 4 x tensor_parallel_size 1 needs 4 GPUs but 2 are visible"
    )
    assert "pass --gpus 2 or fewer" in str(error.value)
    with pytest.raises(GPUCountError, match=r"needs 4 GPUs but 3 are visible.*--gpus 1 or fewer"):
        engines(3, data_parallel_size=2, tensor_parallel_size=2)


def test_data_parallel_size_is_checked_where_it_is_set():
    for bad in (0, 65, "all"):
        with pytest.raises(ValidationError, match="data_parallel_size"):
            EngineConfig(kind="vllm", model="m", data_parallel_size=bad)
    with pytest.raises(ValidationError, match="data_parallel_size 2 applies to kind 'vllm'"):
        EngineConfig(kind="transformers", model="m", data_parallel_size=2)
    EngineConfig(kind="auto", model="m", data_parallel_size=2)  # auto may become vllm


def test_the_gpu_count_is_not_part_of_a_stages_key(tiny_model_dir):
    """Same seeds, same sampling parameters: one GPU or four write the same distribution of
    texts, so trajectories are found again whatever the GPU count (docs/ENGINES.md)."""
    from cobalt.trajectories.stages import engine_identity

    one, four = (
        engine_identity(EngineConfig(kind="vllm", model=str(tiny_model_dir), data_parallel_size=d))
        for d in (1, 4)
    )
    assert one == four
