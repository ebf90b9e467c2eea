"""Shared fixtures: one Prefect test harness per session, an S3 server (moto) on 127.0.0.1, the
fitted and tiny models, a served model, and a real Dask cluster (scheduler + 2 workers).

Everything stays on this machine: the Hub is off (HF_HUB_OFFLINE), Prefect's analytics are off,
and AWS credentials are dummies so botocore never asks an instance-metadata endpoint.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_serving import Served, serve_tiny_model

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ["AWS_ACCESS_KEY_ID"] = "testing"
os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
for _var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "COBALT_STORAGE"):
    os.environ.pop(_var, None)
# pytest-xdist: each worker's torch work (and the processes it starts) takes one thread, not
# engines.cpu_threads' default of up to one a core: two workers on two cores would otherwise run
# four threads of tiny-model arithmetic that cannot use them (a test that sets its own keeps it)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("COBALT_THREADS", "1")
# datasets' cache of converted files: private to the session, not the user's ~/.cache
_HF_CACHE = tempfile.mkdtemp(prefix="hf-datasets-")
atexit.register(shutil.rmtree, _HF_CACHE, True)
os.environ["HF_DATASETS_CACHE"] = _HF_CACHE


REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API (SQLite) for the whole session: it takes ~30 s to start."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (as s3fs's own tests run it); yields the endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty bucket for one test; returns its name."""
    import s3fs

    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    fs.mkdir(name)
    return name


def _unchanged(path: Path) -> Iterator[Path]:
    """Yield the shared model `path`, then fail if a test changed its files (they are shared by
    every later session on this machine: a test that changes a model copies it first)."""

    def listing() -> dict[str, tuple[int, int]]:
        return {
            str(f.relative_to(path)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in sorted(path.rglob("*"))
            if f.is_file()
        }

    before = listing()
    yield path
    assert listing() == before, f"a test changed the shared model {path}"


@pytest.fixture(scope="session")
def fitted_model() -> Iterator[dict]:
    """The embedded default's reference model (the pipeline's recipe), fitted once per machine
    (tests/shared_models.py; `make test` fits it beside the Docker install): {"path": its
    directory}. Tests only read it."""
    from shared_models import fitted_model as shared

    for path in _unchanged(shared()):
        yield {"path": path}


@pytest.fixture(scope="session")
def tiny_model() -> Iterator[Path]:
    """The random tiny model (engines.tiny, seed 0), built once per machine
    (tests/shared_models.py). Tests only read it."""
    from shared_models import tiny_model as shared

    yield from _unchanged(shared())


@pytest.fixture(scope="session")
def qwen3_toy() -> Iterator[Path]:
    """A random Qwen3-shaped model with Qwen3's real tokenizer (tests/shared_models.py), built
    once per machine; a failed download of the tokenizer fails the tests here, in one line naming
    the URL. Tests only read it."""
    from shared_models import TokenizerFetchError, qwen3_toy_model

    try:
        path = qwen3_toy_model()
    except TokenizerFetchError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield from _unchanged(path)


@pytest.fixture(scope="session")
def serve_process(tiny_model, tmp_path_factory) -> Iterator[Served]:
    """`transformers serve <tiny model>` started on a free port (not yet waited for), shared by
    the trajectory and reward-hacking tests (tests/tiny_serving.py)."""
    with serve_tiny_model(tiny_model, tmp_path_factory.mktemp("serve")) as served:
        yield served


@pytest.fixture(scope="session")
def served_tiny(serve_process) -> dict:
    """The served tiny model, once it answers: api_base and the LiteLLM model name."""
    served = serve_process.wait_until_up()
    return {"api_base": served.api_base, "model": served.model}


def _spawn(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture
def dask_cluster(prefect_harness, tmp_path) -> Iterator[dict[str, Any]]:
    """`dask scheduler` and two `dask worker` processes (no nanny: a killed worker stays dead),
    each worker single-threaded, reporting to this session's Prefect API; yields the scheduler's
    address and the worker processes."""
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "OMP_NUM_THREADS": "1",
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "3",
    }
    scheduler = _spawn(
        "distributed.cli.dask_scheduler",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-dashboard",
        env=env,
        log=tmp_path / "scheduler.log",
    )
    workers = [
        _spawn(
            "distributed.cli.dask_worker",
            address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            "--name",
            f"w{i}",
            "--local-directory",
            str(tmp_path / f"w{i}"),
            env=env,
            log=tmp_path / f"worker{i}.log",
        )
        for i in range(2)
    ]
    try:
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield {"address": address, "workers": workers}
    finally:
        for process in [*workers, scheduler]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


FSDP_ON_CPU = REPO / "tests" / "support" / "fsdp_on_cpu"


@pytest.fixture
def fsdp_on_cpu(monkeypatch):
    """FSDP on CPU processes (tests/support/fsdp_on_cpu): `fsdp_on_cpu(mode)` with mode "1"
    (accelerate's gate and the plan's refusal lifted) or "plan" (the refusal only)."""

    def lift(mode: str) -> None:
        from cobalt.training.machinery import plan

        path = os.environ.get("PYTHONPATH", "")
        monkeypatch.setenv("PYTHONPATH", f"{FSDP_ON_CPU}:{REPO}:{path}")
        monkeypatch.setenv("COBALT_TEST_FSDP_ON_CPU", mode)
        monkeypatch.setattr(plan, "check_fsdp_devices", lambda sharding, gpus: None)

    return lift
