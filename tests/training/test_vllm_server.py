"""The training stage's own vLLM server (`training.vllm_server_gpus`, --vllm-server-gpus): the
split of GPUs, the settings validated before any work, and the server's lifetime around the
training (a real subprocess answering HTTP on CPU; vLLM itself runs only on a GPU:
`scripts/gpu/recipe.sh lora1 --shape verl --share-prompts --async --vllm-server-gpus 1`)."""

from __future__ import annotations

import contextlib
import sys
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

import cobalt.training.settings as training_config
from cobalt.training.machinery.plan import ShardingError, plan_training
from cobalt.training.machinery.vllm_server import (
    generation_server,
    server_command,
    server_env,
    split_gpus,
    visible_gpu_ids,
)
from cobalt.training.settings import TrainingConfig
from engines.machine import Machine
from engines.serving import ServerError

GIB = 2**30


def _machine(gpus: int) -> Machine:
    return Machine(gpus=gpus, gpu_bytes=80 * GIB, gpu_name="H100", host_bytes=512 * GIB, cpus=32)


def test_the_server_takes_the_gpus_after_the_training_processes():
    assert split_gpus(["0", "1", "2", "3"], 3, 1) == (["0", "1", "2"], ["3"])
    # CUDA_VISIBLE_DEVICES names the physical cards: a job pinned to 4-7 keeps to them
    visible = visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 4)
    assert split_gpus(visible, 2, 2) == (["4", "5"], ["6", "7"])
    assert visible_gpu_ids({}, 2) == ["0", "1"]
    with pytest.raises(ValueError, match="needs 3 GPUs; 2 visible"):
        split_gpus(["0", "1"], 2, 1)


def test_the_server_runs_as_trl_serves_it_on_its_own_gpus():
    command = server_command("/models/qwen", 8123, 2, max_model_len=1536)
    at = command.index("serve")
    assert command[at + 1] == "/models/qwen"
    # one engine a GPU, the context training feeds it, prefix caching for a prompt's samples
    for flag, value in (
        ("--data-parallel-size", "2"),
        ("--max-model-len", "1536"),
        ("--port", "8123"),
    ):
        assert command[command.index(flag) + 1] == value
    assert "--enable-prefix-caching" in command
    # a request's unset sampling fields take vLLM's defaults, as the colocated engine's do, not
    # the model's generation_config.json (Qwen3's top_k 20 would change the samples)
    assert command[command.index("--generation-config") + 1] == "vllm"
    assert "--weight-transfer-config" in command  # TRL's client pushes the weights through it
    assert "--quantization" not in command  # the model's own precision unless asked
    fp8 = server_command("/models/qwen", 8123, 1, quantization="fp8")
    assert fp8[fp8.index("--quantization") + 1] == "fp8"
    assert command[command.index("--kv-cache-dtype") + 1] == "auto"  # the model's dtype
    fp8_kv = server_command("/models/qwen", 8123, 1, kv_cache_dtype="fp8")
    assert fp8_kv[fp8_kv.index("--kv-cache-dtype") + 1] == "fp8"
    assert "--quantization" not in fp8_kv  # the weights stay as they are
    env = server_env({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HOME": "/root"}, ["2", "3"])
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # the weight-transfer endpoints


def test_settings_that_cannot_work_together_are_refused_before_any_work(monkeypatch):
    monkeypatch.setattr(training_config, "vllm_available", lambda: True)
    paper = {"preset": "paper", "mode": "single_turn", "lora": {}}
    with pytest.raises(ValidationError, match="generation is transformers: drop one"):
        TrainingConfig(**paper, vllm_server_gpus=1, generation="transformers")
    with pytest.raises(ValidationError, match=r"vllm_server_base_url .* names yours: drop one"):
        TrainingConfig(**paper, vllm_server_gpus=1, vllm_server_base_url="http://gpu-box:8000")
    with pytest.raises(ValidationError, match="built for one node"):
        TrainingConfig(**paper, vllm_server_gpus=1, nodes=2, rdzv_endpoint="10.0.0.1:29400")
    with pytest.raises(ShardingError, match="take 3 GPUs: this machine has 2; pass --gpus 1"):
        plan_training(
            TrainingConfig(**paper, num_processes=2, vllm_server_gpus=1), None, _machine(2)
        )
    with pytest.raises(ShardingError, match="needs GPUs and this machine has none"):
        plan_training(TrainingConfig(**paper, vllm_server_gpus=1), None, _machine(0))
    with pytest.raises(ValueError, match=r"needs vllm_server_base_url .* or vllm_server_gpus"):
        TrainingConfig(**paper, generation="vllm_server").grpo_kwargs("out", None, 1)


def test_the_plan_says_where_generation_runs(monkeypatch):
    monkeypatch.setattr(training_config, "vllm_available", lambda: True)
    config = TrainingConfig(
        preset="paper",
        mode="single_turn",
        lora={},
        num_processes=2,
        vllm_server_gpus=2,
        async_generation=True,
    )
    plan = plan_training(config, None, _machine(4))
    assert (plan.processes, plan.server_gpus, plan.generation) == (2, 2, "vllm_server")
    text = plan.describe()
    assert "a vLLM server of the run's own (2 GPUs after the training processes'" in text
    assert "overlapped with training, one step off" in text
    kwargs = config.grpo_kwargs("out", None, 4)
    assert kwargs["vllm_mode"] == "server" and "vllm_server_base_url" not in kwargs  # set at launch


def test_fp8_generation_is_a_servers_and_turns_on_the_importance_sampling_correction(
    monkeypatch,
):
    """fp8 sampling is vLLM's online quantization of a server's model: the stage's own server
    (started with --quantization fp8) or the user's; refused where TRL builds the engine itself
    (colocated) or on GPUs without fp8 kernels, before any work. The sampler then is not the
    model the trainer computes, so TRL's importance-sampling correction comes on unless set."""
    monkeypatch.setattr(training_config, "vllm_available", lambda: True)
    paper = {"preset": "paper", "mode": "single_turn", "lora": {}}
    with pytest.raises(ValidationError, match="add --vllm-server-gpus K") as raised:
        TrainingConfig(**paper, fp8_generation=True)
    assert "training.fp8_generation" in str(raised.value)
    with pytest.raises(ValidationError, match="add --vllm-server-gpus K"):
        TrainingConfig(**paper, fp8_generation=True, generation="vllm_colocate")
    own = TrainingConfig(**paper, vllm_server_gpus=1, fp8_generation=True)
    kwargs = own.grpo_kwargs("out", None, 2)
    assert kwargs["vllm_importance_sampling_correction"] is True
    # per token, capped: TRL's default product over a sequence would weigh fp8's completions
    # by ~exp(-14) at 200 tokens (measured on an H200); a mode the user sets stays theirs
    assert kwargs["vllm_importance_sampling_mode"] == "token_truncate"
    theirs = own.model_copy(update={"overrides": {"vllm_importance_sampling_mode": "token_mask"}})
    assert theirs.grpo_kwargs("out", None, 2)["vllm_importance_sampling_mode"] == "token_mask"
    yours = TrainingConfig(
        **paper, generation="vllm_server", vllm_server_base_url="http://h:8000", fp8_generation=True
    )
    assert yours.grpo_kwargs("out")["vllm_importance_sampling_correction"] is True
    kept_off = own.model_copy(update={"vllm_is_correction": False})
    assert kept_off.grpo_kwargs("out", None, 2)["vllm_importance_sampling_correction"] is False
    bf16 = TrainingConfig(**paper, vllm_server_gpus=1)
    assert bf16.grpo_kwargs("out", None, 2)["vllm_importance_sampling_correction"] is False
    assert "vllm_importance_sampling_mode" not in bf16.grpo_kwargs("out", None, 2)

    hopper = Machine(2, 141 * GIB, "NVIDIA H200", 512 * GIB, 32, gpu_capability=(9, 0))
    text = plan_training(own, None, hopper).describe()
    assert (
        "sampling in fp8 (vLLM's online quantization); importance-sampling correction "
        "token_truncate" in text
    )
    assert "fp8" not in plan_training(bf16, None, hopper).describe()
    ampere = Machine(2, 80 * GIB, "NVIDIA A100", 512 * GIB, 32, gpu_capability=(8, 0))
    with pytest.raises(ShardingError, match=r"capability 8\.9 or more .* is 8\.0: drop --fp8"):
        plan_training(own, None, ampere)
    plan_training(bf16, None, ampere)  # bf16 sampling runs there


def test_an_fp8_kv_cache_is_a_servers_and_turns_on_the_importance_sampling_correction(
    monkeypatch,
):
    """The KV cache in fp8 is a vLLM server's setting (the stage's own started with
    --kv-cache-dtype fp8, or the user's); refused colocated (TRL's engine has no such setting)
    and on GPUs without fp8 kernels, before any work. Its samples are not the trainer's model
    either, so the correction comes on as with fp8 weights; the plan line says what is fp8."""
    monkeypatch.setattr(training_config, "vllm_available", lambda: True)
    paper = {"preset": "paper", "mode": "single_turn", "lora": {}}
    with pytest.raises(ValidationError, match=r"has no KV cache setting.*add --vllm-server-gpus"):
        TrainingConfig(**paper, fp8_kv_cache=True)
    own = TrainingConfig(**paper, vllm_server_gpus=1, fp8_kv_cache=True)
    kwargs = own.grpo_kwargs("out", None, 2)
    assert kwargs["vllm_importance_sampling_correction"] is True
    assert kwargs["vllm_importance_sampling_mode"] == "token_truncate"
    yours = TrainingConfig(
        **paper, generation="vllm_server", vllm_server_base_url="http://h:8000", fp8_kv_cache=True
    )
    assert yours.grpo_kwargs("out")["vllm_importance_sampling_correction"] is True
    hopper = Machine(2, 141 * GIB, "NVIDIA H200", 512 * GIB, 32, gpu_capability=(9, 0))
    text = plan_training(own, None, hopper).describe()
    assert "keys and values cached in fp8; importance-sampling correction token_truncate" in text
    assert "online quantization" not in text  # the weights are not quantized
    both = own.model_copy(update={"fp8_generation": True})
    assert (
        "sampling in fp8 (vLLM's online quantization), keys and values cached in fp8"
        in plan_training(both, None, hopper).describe()
    )
    ampere = Machine(2, 80 * GIB, "NVIDIA A100", 512 * GIB, 32, gpu_capability=(8, 0))
    with pytest.raises(ShardingError, match=r"fp8_kv_cache: .* is 8\.0: drop --fp8-kv-cache"):
        plan_training(own, None, ampere)


def test_fp8_generation_is_a_flag_of_the_training_and_pipeline_flows(monkeypatch):
    from flows.pipeline import parse_params as pipeline_params
    from flows.training import parse_params as training_params

    monkeypatch.setattr(training_config, "vllm_available", lambda: True)
    argv = ["--vllm-server-gpus", "1", "--fp8-generation"]
    assert training_params(argv).training.fp8_generation is True
    assert pipeline_params(argv).training.fp8_generation is True
    assert training_params(argv[:2]).training.fp8_generation is False
    kv = ["--vllm-server-gpus", "1", "--fp8-kv-cache"]
    assert training_params(kv).training.fp8_kv_cache is True
    assert pipeline_params(kv).training.fp8_kv_cache is True
    assert training_params(kv[:2]).training.fp8_kv_cache is False


def _health_server(root: Path):
    """A real HTTP server whose /health answers 200 (a file of that name), on the given port."""
    root.mkdir(exist_ok=True)
    (root / "health").write_text("ok")
    return lambda port: [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(root),
    ]


def test_the_server_answers_while_training_runs_and_is_stopped_after(tmp_path):
    with (
        generation_server(
            "m", ["1"], tmp_path, command=_health_server(tmp_path / "www"), timeout_s=60
        ) as server,
        urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply,
    ):
        assert reply.status == 200 and server.exited() is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{server.url}/health", timeout=2)


def test_a_failed_training_still_stops_the_server(tmp_path):
    with (
        pytest.raises(RuntimeError, match="training failed"),
        generation_server(
            "m", ["1"], tmp_path, command=_health_server(tmp_path / "www"), timeout_s=60
        ) as server,
    ):
        raise RuntimeError("training failed")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{server.url}/health", timeout=2)


def _slow_server(root: Path, delay_s: float):
    """`_health_server`, answering only after `delay_s` (vLLM's start-up, in short)."""
    root.mkdir(exist_ok=True)
    (root / "health").write_text("ok")
    code = (
        "import runpy, sys, time; time.sleep(float(sys.argv[1])); "
        "sys.argv = ['http.server', sys.argv[2], '--bind', '127.0.0.1', '--directory', "
        "sys.argv[3]]; "
        "runpy.run_module('http.server', run_name='__main__')"
    )
    return lambda port: [sys.executable, "-c", code, str(delay_s), str(port), str(root)]


def test_training_starts_while_the_server_starts_and_waits_for_it(tmp_path):
    """The launch does not wait for the server (wait=False): the training processes load their
    model meanwhile, then each waits until the server answers, before any collective."""
    import time

    from cobalt.training.machinery.vllm_server import wait_for_server

    started = time.monotonic()
    with generation_server(
        "m", ["1"], tmp_path, command=_slow_server(tmp_path / "www", 2.0), wait=False
    ) as server:
        assert time.monotonic() - started < 1.5  # yielded before the server answers
        assert server.exited() is None
        waited = wait_for_server(server.url, timeout_s=60, poll_s=0.2)
        assert waited > 0.5
        with urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply:
            assert reply.status == 200
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{server.url}/health", timeout=2)


def test_a_server_that_never_answers_is_named_with_the_setting_that_waits_longer():
    from cobalt.training.machinery.vllm_server import wait_for_server
    from engines.serving import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError) as raised:
        wait_for_server(url, timeout_s=0.5, poll_s=0.1)
    message = str(raised.value)
    assert url in message and "vllm-server.log" in message
    assert "--set vllm_server_timeout=SECONDS" in message and "\n" not in message


def test_a_server_that_dies_while_training_runs_stops_the_training_and_says_why(tmp_path):
    """Training started beside a starting server: the server exits (here after 1 s, as vLLM
    would on a GPU it cannot use), and the training's launcher and every process under it are
    stopped at once, the error naming the server's GPUs, exit code and log; not a training
    process waiting 15 minutes for a server that is gone."""
    import os
    import time

    from cobalt.training.launch import LaunchError, run_watched

    def dies(port: int) -> list[str]:
        code = "import sys, time; time.sleep(1); print('CUDA error: no kernel image'); sys.exit(7)"
        return [sys.executable, "-u", "-c", code]

    pid_file = tmp_path / "training.pid"
    child = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    # the launcher's own child: stopping the launcher must take it too
    launcher = [sys.executable, "-c", f"import subprocess, sys; subprocess.call([sys.executable, '-c', {child!r}])"]  # fmt: skip
    started = time.monotonic()
    with (
        generation_server("m", ["2", "3"], tmp_path, command=dies, wait=False) as server,
        (tmp_path / "launch.log").open("wb") as sink,
        pytest.raises(LaunchError) as raised,
    ):
        run_watched(launcher, dict(os.environ), sink, server.exited, 2, poll_s=0.2)
    assert time.monotonic() - started < 60
    first, *rest = str(raised.value).splitlines()
    assert first == (
        "training on 2 processes stopped: the training stage's vLLM server on GPU(s) 2,3 "
        "exited with 7:"
    )
    assert "CUDA error: no kernel image" in "\n".join(rest)
    state = _state_after(int(pid_file.read_text()), within_s=10)
    assert state in ("gone", "Z"), f"a training process outlived its stopped launch ({state})"


def test_a_watched_launch_that_ends_returns_its_exit_code(tmp_path):
    import os

    from cobalt.training.launch import run_watched

    with (tmp_path / "launch.log").open("wb") as sink:
        code = [sys.executable, "-c", "import sys; sys.exit(4)"]
        assert run_watched(code, dict(os.environ), sink, lambda: None, 1, poll_s=0.1) == 4
        assert run_watched(code, dict(os.environ), sink, None, 1) == 4


def test_a_server_that_dies_at_start_up_names_its_gpus_and_shows_its_log(tmp_path):
    def dies(port: int) -> list[str]:
        code = (
            "import os, sys; print('no engine on', os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(3)"
        )
        return [sys.executable, "-c", code]

    with (
        pytest.raises(
            ServerError, match=r"(?s)vLLM server on GPU\(s\) 2,3: .*exited with 3.*no engine on 2,3"
        ),
        generation_server("m", ["2", "3"], tmp_path, command=dies, timeout_s=60),
    ):
        pytest.fail("the body ran without a server")
    assert (tmp_path / "vllm-server.log").is_file()


class CompletionsServer:
    """The part of vLLM's OpenAI server TRL's client uses to sample (`/health`, `/v1/models`,
    `/v1/completions` with token-id prompts and `return_token_ids`): each row's completion is
    its prompt reversed, the sampled token's logprob -0.5. Every request body is kept."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send({"data": [{"id": "/models/policy"}]} if "models" in self.path else {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append(body)
                choices = []
                for prompt in body["prompt"]:
                    tokens = list(reversed(prompt))
                    choices.append(
                        {
                            "prompt_token_ids": prompt,
                            "token_ids": tokens,
                            "logprobs": {
                                "tokens": [f"token_id:{t}" for t in tokens],
                                "token_logprobs": [-0.5] * len(tokens),
                                "top_logprobs": [None] * len(tokens),
                            },
                        }
                    )
                self._send({"choices": choices})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_each_process_asks_the_server_for_its_own_rows_with_trls_sampling_settings(monkeypatch):
    from types import SimpleNamespace

    import trl.generation.vllm_client as client

    from cobalt.training.machinery.overlap import VLLMServer

    # TRL's client refuses to start without vLLM installed; asking for samples is plain HTTP
    monkeypatch.setattr(client, "is_vllm_available", lambda *a, **k: True)

    served = CompletionsServer()
    try:
        # TRL's VLLMGeneration as a process other than the main one holds it: no client
        settings = SimpleNamespace(
            vllm_client=None,
            server_base_url=served.url,
            server_host="0.0.0.0",
            server_port=8000,
            server_timeout=10.0,
            repetition_penalty=1.1,
            temperature=0.7,
            top_p=0.9,
            top_k=0,
            min_p=None,
            max_completion_length=8,
            logprobs=0,
            structured_outputs_regex=None,
            generation_kwargs={"logit_bias": {"7": -100.0}},
        )
        generator = VLLMServer(SimpleNamespace(vllm_generation=settings))
        rows = [[1, 2, 3], [1, 2, 3], [4, 5]]  # a prompt's samples are rows of their own
        out = generator.run(rows)
    finally:
        served.httpd.shutdown()
    (request,) = served.requests
    assert request["prompt"] == rows and request["n"] == 1
    sent = {k: request[k] for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens")}
    assert sent == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "max_tokens": 8}
    assert request["repetition_penalty"] == 1.1 and request["logit_bias"] == {"7": -100.0}
    assert out["prompt_ids"] == rows
    assert out["completion_ids"] == [[3, 2, 1], [3, 2, 1], [5, 4]]
    assert out["logprobs"] == [[-0.5] * 3, [-0.5] * 3, [-0.5] * 2]


def test_a_stage_killed_outright_takes_its_server_with_it(tmp_path):
    """The stage's process killed with SIGKILL while its server runs: the server ends, and so
    does the process the server started that ignores SIGTERM and would outlive it (vLLM's
    engine core holding its GPU after its API server is gone: vLLM issues 55510, 44751)."""
    import os
    import signal
    import subprocess

    pid_file, core_file, www = tmp_path / "server.pid", tmp_path / "core.pid", tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok")
    core = tmp_path / "core.py"  # ignores SIGTERM, as an engine core busy starting up
    core.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    server = tmp_path / "server.py"  # answers /health; starts the core
    server.write_text(
        "import os, runpy, subprocess, sys\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "subprocess.Popen([sys.executable, sys.argv[4], sys.argv[5]])\n"
        "sys.argv = ['http.server', sys.argv[2], '--bind', '127.0.0.1', '--directory', "
        "sys.argv[3]]\n"
        "runpy.run_module('http.server', run_name='__main__')\n"
    )
    stage = f"""
import os, signal, sys, time
from cobalt.training.machinery.vllm_server import generation_server
def serve(port):
    return [sys.executable, {str(server)!r}, {str(pid_file)!r}, str(port), {str(www)!r},
            {str(core)!r}, {str(core_file)!r}]
with generation_server('m', ['1'], {str(tmp_path)!r}, command=serve, timeout_s=60):
    while not os.path.exists({str(core_file)!r}):
        time.sleep(0.05)
    time.sleep(1.5)  # the watchdog's next ticks see the core
    os.kill(os.getpid(), signal.SIGKILL)  # no finally, no stop(): the kernel ends the stage
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", stage],
        cwd=root,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == -signal.SIGKILL
    served, cored = int(pid_file.read_text()), int(core_file.read_text())
    try:
        assert _state_after(served, within_s=20) in ("gone", "Z"), "the server outlived its stage"
        state = _state_after(cored, within_s=20)
        assert state in ("gone", "Z"), f"the server's child outlived the stage (state {state})"
    finally:
        for pid in (served, cored):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _state_after(pid: int, within_s: float) -> str:
    """A process's state once it has ended or `within_s` has passed: "gone", "Z" (ended, not
    yet reaped by its parent) or the state it still runs in (Linux /proc)."""
    import os
    import time

    deadline = time.monotonic() + within_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except FileNotFoundError:
        return "gone"


def _fp8_script():
    """scripts/gpu/fp8_generation.py as a module."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "fp8_generation.py"
    spec = importlib.util.spec_from_file_location("fp8_generation", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations there
    spec.loader.exec_module(module)
    return module


def test_the_generation_script_reads_what_a_batch_made_vllm_do():
    """Per batch, the script reports vLLM's own counters from /metrics: preemptions (the KV
    cache full) and the prefix cache's hit share, each series summed over its engines' labels,
    as the difference across the batch; a server without /metrics leaves them out."""
    module = _fp8_script()
    exposition = "\n".join(
        [
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0',
            'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0',
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0',
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0',
            "vllm:num_preemptions_created 1.7e9",  # another series of that name's prefix
        ]
    )
    before = module.metric_totals(exposition)
    assert before == {
        "preemptions": 5.0,
        "prefix_cache_queries": 1000.0,
        "prefix_cache_hits": 250.0,
    }
    after = {"preemptions": 9.0, "prefix_cache_queries": 17000.0, "prefix_cache_hits": 15250.0}
    assert module.counted(before, after) == {"preemptions": 4, "prefix_cache_hit_share": 0.938}
    assert module.counted({}, {}) == {}
    assert module.counters("http://127.0.0.1:9") == {}  # nothing listening


def test_the_fp8_script_measures_drift_from_the_trainers_probabilities(tmp_path, tiny_model):
    """scripts/gpu/fp8_generation.py's measure on CPU, with the tiny model: a sampler that is
    the model itself (its log-probabilities of completions it drew) shows no drift; one whose
    every token is 0.5 nats more sure shows 0.5 a token, completions weighed by exp(-0.5 x their
    length), and TRL's sequence_mask bound read from TRL's own config."""
    import torch
    from transformers import AutoModelForCausalLM

    module = _fp8_script()
    model_dir = tiny_model
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompts = module.prompts_of(1024, 2, 6)
    bias = {5: 1.5}
    out: dict = {"prompt_ids": prompts, "completion_ids": [], "logprobs": []}
    generator = torch.Generator().manual_seed(0)
    for prompt in prompts:
        for _ in range(2):  # 2 samples a prompt, drawn from the model with the bias
            ids, logps = list(prompt), []
            for _ in range(5):
                with torch.no_grad():
                    logits = model(torch.tensor([ids])).logits[0, -1].float()
                logits[5] += 1.5
                probs = torch.log_softmax(logits, -1)
                token = int(torch.multinomial(probs.exp(), 1, generator=generator))
                ids.append(token)
                logps.append([float(probs[token])])
            out["completion_ids"].append(ids[len(prompt) :])
            out["logprobs"].append(logps)
    same = module.drift(model_dir, out, 2, 4, bias, dtype=torch.float32)
    assert same["sequences"] == 4 and same["tokens"] == 20
    assert same["token_abs_diff_mean"] < 1e-4 and same["sequence_mask_dropped"] == 0
    assert same["sequence_mask_bounds"] == [None, 3.0]  # TRL 1.16's defaults
    surer = {**out, "logprobs": [[[lp[0] + 0.5] for lp in row] for row in out["logprobs"]]}
    drifted = module.drift(model_dir, surer, 2, 4, bias, dtype=torch.float32)
    assert drifted["token_abs_diff_mean"] == pytest.approx(0.5, abs=1e-3)
    assert drifted["token_diff_mean"] == pytest.approx(-0.5, abs=1e-3)
    assert drifted["sequence_log_ratio_abs_mean"] == pytest.approx(2.5, abs=1e-2)
    shape = module.Shape.parse("verl:3:5:7:64", 1024)
    assert (len(shape.prompts), len(shape.prompts[0]), shape.kwargs) == (3, 7, {})
    assert module.Shape.parse("x:1:1:4:8:/no/such/file", 1024).kwargs == {"ignore_eos": True}
