"""The runner's streamed protocol, spoken directly (one `run` per program, one reply per test).

The runner here is a plain subprocess with a scratch dir of its own (no jail: isolation is
test_hostile.py's subject); the judge's side of the protocol is checked end to end at the bottom,
on every backend.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import JudgeRequest
from sandbox.models import TestSuite as Suite
from sandbox.runner_source import RUNNER_SOURCE

LIMITS = {"timeout_s": 2.0, "memory_mb": 512, "output_bytes": 1 << 20}
ECHO = "print(input())"


class Runner:
    def __init__(self, workdir: Path):
        workdir.mkdir()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                RUNNER_SOURCE,
                json.dumps({"workdir": str(workdir)}),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.read()["ready"]
        self.seq = 0

    def send(self, message: dict) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        assert self.proc.stdout
        return json.loads(self.proc.stdout.readline())

    def run(self, code: str, inputs: list[str], **fields) -> list[dict]:
        """Send one program; every message back until `done`."""
        self.seq += 1
        self.send(
            {
                "op": "run",
                "seq": self.seq,
                "code": code,
                "fn_name": fields.pop("fn_name", None),
                "limits": LIMITS,
                "inputs": inputs,
                "suite_s": fields.pop("suite_s", 30),
                "fail_fast": fields.pop("fail_fast", False),
            }
        )
        stop_after = fields.pop("stop_after", None)
        assert not fields
        replies = []
        while True:
            replies.append(reply := self.read())
            assert reply.get("seq") == self.seq, reply
            if stop_after is not None and reply.get("test") == stop_after:
                self.send({"op": "stop", "seq": self.seq})
            if reply.get("done"):
                return replies

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0


@pytest.fixture
def runner(tmp_path: Path):
    r = Runner(tmp_path / "runner")
    yield r
    r.close()


def reports(replies: list[dict]) -> list[dict]:
    return [r for r in replies if "test" in r]


def test_one_reply_per_test_in_order_then_done(runner):
    replies = runner.run(ECHO, ["a\n", "b\n", "c\n"])
    assert [r["test"] for r in reports(replies)] == [0, 1, 2]
    assert [r["stdout"] for r in reports(replies)] == ["a\n", "b\n", "c\n"]
    assert all(r["exit"] == 0 and r["clean"] and r["timeout_s"] == 2.0 for r in reports(replies))
    assert replies[-1] == {"seq": 1, "done": True, "ran": 3, "reason": None}


def test_each_test_gets_a_fresh_process(runner):
    code = "import os\nprint(os.getpid())\nopen('left', 'w').write('x')\nprint(os.listdir('.'))"
    pids = [r["stdout"].split("\n")[0] for r in reports(runner.run(code, ["", "", ""]))]
    assert len(set(pids)) == 3
    assert all(r["stdout"].endswith("['left']\n") for r in reports(runner.run(code, [""] * 2)))


def test_a_syntax_error_ends_the_run_before_any_test(runner):
    [reply] = runner.run("print(", ["1", "2"])
    assert reply["done"] and "SyntaxError" in reply["compile_error"]


def test_fail_fast_stops_by_itself_after_a_test_that_failed_whatever_it_printed(runner):
    code = "import sys\nx = input()\nprint(x)\nsys.exit(int(x))"
    replies = runner.run(code, ["0\n", "3\n", "0\n"], fail_fast=True)
    assert [r["exit"] for r in reports(replies)] == [0, 3]
    assert replies[-1]["reason"] == "failed" and replies[-1]["ran"] == 2
    replies = runner.run(code, ["0\n", "3\n", "0\n"])  # without fail_fast every test runs
    assert [r["exit"] for r in reports(replies)] == [0, 3, 0]


def test_stop_kills_the_running_test_and_ends_the_run(runner):
    code = "import time\nx = input()\nif x == 'slow':\n    time.sleep(30)\nprint(x)"
    start = time.perf_counter()
    replies = runner.run(code, ["fast\n", "slow\n", "fast\n"], stop_after=0)
    assert time.perf_counter() - start < 5
    assert [r["test"] for r in reports(replies)] == [0]
    assert replies[-1]["done"] and replies[-1]["reason"] == "stopped"
    # a stop that arrives after its run ended is ignored; the next run is unaffected
    runner.send({"op": "stop", "seq": runner.seq})
    assert reports(runner.run(ECHO, ["x\n"]))[0]["stdout"] == "x\n"


def test_suite_time_cuts_the_last_timeout_and_skips_the_rest(runner):
    replies = runner.run("import time\ntime.sleep(0.4)\nprint(1)", [""] * 8, suite_s=1.0)
    ran = reports(replies)
    assert 2 <= len(ran) <= 3
    assert 0.9 < ran[0]["timeout_s"] <= 1.0 and ran[1]["timeout_s"] < 0.7
    assert replies[-1]["reason"] == "time" and replies[-1]["ran"] == len(ran)


def test_call_based_inputs_go_to_the_function_not_stdin(runner):
    code = "import sys\ndef add(a, b):\n    return [a + b, len(sys.stdin.read())]"
    replies = runner.run(code, ["1\n2", "[1]\n[2]"], fn_name="add")
    assert [r["result"] for r in reports(replies)] == ["[3, 0]", "[[1, 2], 0]"]


def test_a_bad_message_is_an_error_and_the_runner_carries_on(runner):
    runner.proc.stdin.write(b"{not json\n")
    runner.proc.stdin.flush()
    assert "error" in runner.read()
    runner.send({"op": "nope"})
    assert "unknown op" in runner.read()["error"]
    runner.send({"op": "ping"})
    assert runner.read() == {"ok": True}
    assert reports(runner.run(ECHO, ["y\n"]))[0]["stdout"] == "y\n"


def test_large_inputs_stream_in_one_request(runner):
    big = "x" * (3 << 20)
    replies = runner.run("print(len(input()))", [big + "\n", "ab\n"])
    assert [r["stdout"] for r in reports(replies)] == [f"{len(big)}\n", "2\n"]


# -- the judge's side, end to end --------------------------------------------------------------


def verdict(judge, code: str, inputs: list[str], outputs: list[str], **kw):
    request = JudgeRequest(id="p", code=code, tests=Suite(inputs=inputs, outputs=outputs))
    return judge.judge(request, **kw)


def test_fail_fast_on_a_wrong_answer_skips_the_rest_without_reports(judge):
    code = "import time\nx = input()\nif x == '9':\n    time.sleep(30)\nprint(x)"
    start = time.perf_counter()
    v = verdict(judge, code, ["1", "2", "9", "4"], ["1", "0", "9", "4"], fail_fast=True)
    assert v.outcomes == ["passed", "wrong_answer", "skipped", "skipped"]
    assert v.feedback[2:] == ["", ""]
    assert time.perf_counter() - start < 4  # the sleeping test was stopped, not waited for


def test_fail_fast_after_a_crash_or_a_timeout(backend, judges):
    judge = judges(backend, timeout_s=1.0)
    crash = "x = input()\nif x == '2':\n    raise ValueError(x)\nprint(x)"
    v = verdict(judge, crash, ["1", "2", "3"], ["1", "2", "3"], fail_fast=True)
    assert v.outcomes == ["passed", "runtime_error", "skipped"] and v.status == "runtime_error"
    loop = "x = input()\nwhile x == '2':\n    pass\nprint(x)"
    v = verdict(judge, loop, ["1", "2", "3"], ["1", "2", "3"], fail_fast=True)
    assert v.outcomes == ["passed", "timeout", "skipped"]
    v = verdict(judge, loop, ["1", "2", "3"], ["1", "2", "3"])
    assert v.outcomes == ["passed", "timeout", "passed"]


def test_many_tests_of_one_program_in_one_request(judge):
    n = 300
    v = verdict(judge, ECHO, [f"{i}\n" for i in range(n)], [str(i) for i in range(n)])
    assert v.status == "accepted" and len(v.outcomes) == n
