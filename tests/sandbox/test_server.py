"""`python -m sandbox serve`: judging through it, and judging without it when it is absent, dead,
silent, untrusted, killed mid-way or judging otherwise than the client would. Real servers
(subprocesses), real workers. The servers here judge with a 1 s time limit per test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox import JudgeRequest, Limits, SandboxConfig, SandboxUnavailable, SyncJudge, transport
from sandbox.client import request as control
from sandbox.models import TestSuite as Suite

PROJECT = Path(__file__).resolve().parents[2]
DOUBLE = "print(int(input()) * 2)"
TIMEOUT = 1.0  # the servers' time limit per test (`--timeout`), and their clients'


class Server:
    def __init__(self, address: str, backend: str, *extra: str):
        self.address = address
        self.log = Path(address).with_suffix(".log")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandbox",
                "serve",
                "--socket",
                address,
                "--backend",
                backend,
                "--concurrency",
                "2",
                "--timeout",
                f"{TIMEOUT:g}",
                *extra,
            ],
            cwd=PROJECT,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        deadline = time.monotonic() + 120
        while self.status() is None:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)

    def status(self) -> dict | None:
        try:
            return asyncio.run(control(self.address, {"op": "status"}, timeout=5))["status"]
        except (OSError, TimeoutError, ValueError, KeyError):
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(backend):
    """A sandbox server on a socket with a short path: a unix socket's path has a 108-byte limit,
    and the progress bar that names it is cut at the terminal's width (xdist's temporary paths
    are longer)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="sbx-")
    s = Server(f"{folder}/s.sock", backend)
    yield s
    s.stop()
    try:
        assert s.proc.returncode == 0, s.log.read_text()
        assert not os.path.exists(s.address)  # the socket is removed on the way out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def via(server_address: str | None, backend: str, **limits) -> SyncJudge:
    limits = {"timeout_s": TIMEOUT, **limits}
    return SyncJudge(
        SandboxConfig(
            backend=backend, concurrency=2, limits=Limits(**limits), server=server_address
        )
    )


def request(name: str, code: str, inputs: list[str], outputs: list[str], fn_name=None):
    tests = Suite(inputs=inputs, outputs=outputs, fn_name=fn_name)
    return JudgeRequest(id=name, code=code, tests=tests)


MIXED = [
    request("accepted", DOUBLE, ["1\n", "2\n"], ["2", "4"]),
    request("wrong", DOUBLE, ["1\n", "2\n", "3\n"], ["2", "5", "6"]),
    request("crash", "print(1 // 0)", ["\n"], ["1"]),
    request("syntax", "print(", ["\n", "\n"], ["1", "1"]),
    request("timeout", "while True:\n    pass", ["\n"], ["1"]),
    request("call", "def f(a, b):\n    return a * b\n", ["2\n3", "[1]\n2"], ["6", "[1, 1]"], "f"),
    request(
        "stateful",
        "import os\nprint(os.path.exists('/tmp/x'))\nopen('/tmp/x', 'w')",
        [""] * 2,
        ["False"] * 2,
    ),
]


def comparable(verdicts) -> list[tuple]:
    return [(v.id, v.status, v.outcomes, v.passed, v.feedback) for v in verdicts]


# -- judging through the server ------------------------------------------------------------------


def test_verdicts_through_the_server_are_those_of_a_local_pool(server, backend, judges):
    local = judges(backend, timeout_s=TIMEOUT)
    with via(server.address, backend) as remote:
        assert remote.server == server.address and remote.backend_name == backend
        for fail_fast in (False, True):
            got = remote.judge_many(MIXED, fail_fast=fail_fast)
            want = local.judge_many(MIXED, fail_fast=fail_fast)
            assert comparable(got) == comparable(want)
    assert got[4].feedback[0].endswith("time limit of 1 seconds.")  # the server's = the client's


def test_the_cli_uses_a_running_server(server, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(r.model_dump_json() + "\n" for r in MIXED[:3]))
    before = server.status()["judged"]
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox",
            "judge",
            "-i",
            str(rows),
            "-o",
            str(out),
            "--timeout",
            "1",
        ],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COBALT_SANDBOX_SOCKET": server.address},
    )
    assert proc.returncode == 0, proc.stderr
    assert f"server {server.address}" in proc.stderr  # the progress bar says where
    statuses = [json.loads(line)["status"] for line in out.read_text().splitlines()]
    assert statuses == ["accepted", "wrong_answer", "runtime_error"]
    assert server.status()["judged"] == before + 3


def test_a_client_with_other_limits_judges_with_workers_of_its_own(server, backend):
    before = server.status()
    with via(server.address, backend, memory_mb=300, scratch_mb=32) as judge:
        assert judge.server is None
        v = judge.judge(request("big", "b = bytearray(400 << 20)\nprint(1)", [""], ["1"]))
    assert v.status == "memory_limit"
    after = server.status()
    assert after["judged"] == before["judged"] and after["judging"] == before["judging"]


def test_a_client_asks_for_judging_only(server, backend):
    """A client of the same user cannot make the server start other workers: the backend, the
    image and the limits are the server's."""

    async def session() -> tuple[dict, dict[int, dict]]:
        reader, writer = await transport.connect(server.address, 5)
        hello = transport.decode(await reader.readline())
        program = request("x", DOUBLE, ["1\n"], ["2"]).model_dump(mode="json")
        asks = {"backend": "namespace", "limits": {"memory_mb": 65536, "max_processes": 4096}}
        for n, extra in ((1, {"config": asks}), (2, {"limits": asks["limits"]}), (3, {})):
            writer.write(transport.encode({"op": "judge", "id": n, "request": program, **extra}))
        await writer.drain()
        replies: dict[int, dict] = {}
        while len(replies) < 3:
            reply = transport.decode(await reader.readline())
            if "id" in reply:
                replies[reply["id"]] = reply
        writer.close()
        return hello, replies

    hello, replies = asyncio.run(session())
    assert hello["judging"] == {
        "backend": backend,
        "image": SandboxConfig().image if backend == "docker" else None,
        "limits": Limits(timeout_s=TIMEOUT).model_dump(mode="json"),
    }
    for refused in (replies[1], replies[2]):
        assert "verdict" not in refused and "judging only" in refused["error"]
    assert replies[3]["verdict"]["status"] == "accepted"
    assert server.status()["judging"] == hello["judging"]


def test_concurrent_clients(server, backend):
    results: dict[int, list] = {}

    def client(k: int) -> None:
        requests = [
            request(f"{k}-{i}", DOUBLE, [f"{i}\n", f"{k}\n"], [str(2 * i), str(2 * k)])
            for i in range(15)
        ]
        with via(server.address, backend) as remote:
            assert remote.server == server.address
            results[k] = remote.judge_many(requests)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2]
    assert all(v.status == "accepted" for verdicts in results.values() for v in verdicts)


def test_missing_sandbox_is_reported_not_hidden(server):
    config = SandboxConfig(
        backend="docker",
        image="cobalt-sandbox:does-not-exist",
        limits=Limits(timeout_s=TIMEOUT),
        server=server.address,
    )
    with pytest.raises(SandboxUnavailable), SyncJudge(config) as judge:
        judge.judge(request("x", DOUBLE, ["1\n"], ["2"]))


def test_a_second_server_on_the_same_socket_refuses(server):
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox", "serve", "--socket", server.address, "-j", "1"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3 and "already listens" in proc.stderr
    assert server.status() is not None


# -- without a server ----------------------------------------------------------------------------


def judged_locally(address: str | None, backend: str = "namespace") -> None:
    with via(address, backend) as judge:
        assert judge.server is None
        assert judge.judge(request("x", DOUBLE, ["21\n"], ["42"])).status == "accepted"


def test_no_server_there(tmp_path):
    judged_locally(str(tmp_path / "nobody.sock"))


def test_a_dead_servers_socket_file(tmp_path):
    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)  # the file stays after the socket closes: connecting is refused
    s.close()
    os.chmod(path, 0o600)
    judged_locally(path)


def test_a_server_that_never_greets(tmp_path):
    path = str(tmp_path / "silent.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    os.chmod(path, 0o600)
    s.listen()
    try:
        start = time.perf_counter()
        judged_locally(path)
        assert time.perf_counter() - start < 15
    finally:
        s.close()


def test_a_socket_others_may_use_is_not_trusted(tmp_path):
    server = Server(str(tmp_path / "open.sock"), "namespace")
    try:
        os.chmod(server.address, 0o666)
        judged_locally(server.address)
        assert server.status() is None  # the control client refuses it too
    finally:
        server.stop()


def test_use_server_false_and_the_env_switch(server, backend, monkeypatch):
    config = SandboxConfig(backend=backend, server=server.address, use_server=False)
    with SyncJudge(config) as judge:
        assert judge.server is None
    limits = Limits(timeout_s=TIMEOUT)
    monkeypatch.setenv("COBALT_SANDBOX_SOCKET", "off")
    with SyncJudge(SandboxConfig(backend=backend, limits=limits)) as judge:
        assert judge.server is None
    monkeypatch.setenv("COBALT_SANDBOX_SOCKET", server.address)
    with SyncJudge(SandboxConfig(backend=backend, limits=limits)) as judge:
        assert judge.server == server.address


def test_a_server_killed_mid_run_leaves_the_judging_to_the_client(tmp_path):
    server = Server(str(tmp_path / "doomed.sock"), "namespace")
    slow = [
        request(f"p{i}", "import time\ntime.sleep(0.05)\n" + DOUBLE, [f"{i}\n"], [str(2 * i)])
        for i in range(60)
    ]
    with via(server.address, "namespace") as judge:
        assert judge.server == server.address
        killer = threading.Timer(0.5, server.proc.kill)
        killer.start()
        verdicts = judge.judge_many(slow)
        killer.join()
        assert judge.server is None  # it went on with workers of its own
    assert server.proc.wait(timeout=10) == -signal.SIGKILL
    assert [v.status for v in verdicts] == ["accepted"] * len(slow)


def test_serve_help_and_control(server):
    help_text = subprocess.run(
        [sys.executable, "-m", "sandbox", "serve", "--help"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for words in ("--socket", "COBALT_SANDBOX_SOCKET", "--stop", "--status", "--timeout"):
        assert words in help_text
    judge_help = subprocess.run(
        [sys.executable, "-m", "sandbox", "judge", "--help"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--server" in judge_help and "--no-server" in judge_help
    status = subprocess.run(
        [sys.executable, "-m", "sandbox", "serve", "--socket", server.address, "--status"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(status)["pid"] == server.proc.pid
