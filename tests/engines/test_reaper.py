"""`engines.reaper`: no process outlives the process that started it, even one killed with
SIGKILL; one watchdog for blocks nested or side by side; a local server started by a process
that dies outright ends with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines.reaper import TICK_S, alive, descendants

REPO = Path(__file__).resolve().parents[2]


def test_the_watchdog_ends_what_a_killed_process_leaves(tmp_path: Path) -> None:
    """A process under `reaper()` with a child and a grandchild, killed with SIGKILL: both end;
    a block that ends normally leaves its children alone."""
    script = (
        "import subprocess, sys, time\n"
        "from engines.reaper import reaper\n"
        "with reaper():\n"
        "    subprocess.Popen(['bash', '-c', 'sleep 300 & sleep 300; wait'])\n"
        "    time.sleep(300 if sys.argv[1] == 'kill' else 1.5)\n"
    )
    for mode in ("kill", "exit"):
        proc = subprocess.Popen([sys.executable, "-c", script, mode], cwd=REPO)
        found: dict[int, str] = {}
        while len(found) < 4:  # the watchdog, bash and its two sleeps
            found.update(descendants(proc.pid))
            time.sleep(0.1)
        time.sleep(3 * TICK_S)  # the watchdog sees what runs at its next tick
        if mode == "kill":
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 15
        while mode == "kill" and any(alive(p, t) for p, t in found.items()):
            assert time.monotonic() < deadline, "a child outlived the killed process"
            time.sleep(0.2)
        living = [p for p, t in found.items() if alive(p, t)]
        for pid in living:
            os.kill(pid, signal.SIGKILL)
        assert len(living) == (0 if mode == "kill" else 3)  # bash, sleeps: ended by us


SHARING = """
import os, threading, time
from pathlib import Path
import engines.reaper
from engines.reaper import descendants, reaper

def watchdogs():  # this process's children running the watchdog's file
    found = []
    for pid in descendants(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        except OSError:  # ended meanwhile
            continue
        if os.path.abspath(engines.reaper.__file__).encode() in argv:
            found.append(pid)
    return sorted(found)

def started_watchdog():  # a forked child shows the parent's argv until it has exec'd: wait
    deadline = time.monotonic() + 30
    while not (found := watchdogs()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found

started, release = threading.Event(), threading.Event()

def side():
    with reaper():
        started.set()
        release.wait(30)

assert watchdogs() == []
with reaper():
    first = started_watchdog()
    assert len(first) == 1
    with reaper():
        assert watchdogs() == first
    thread = threading.Thread(target=side)
    thread.start()
    started.wait(30)
    assert watchdogs() == first
assert watchdogs() == first, "stopped while the thread's block still runs"
release.set()
thread.join(30)
deadline = time.monotonic() + 10
while watchdogs() and time.monotonic() < deadline:
    time.sleep(0.05)
assert watchdogs() == [], "still running after the last block"
with reaper():
    again = started_watchdog()
    assert len(again) == 1 and again != first
print("shared")
"""


def test_blocks_nested_or_side_by_side_share_one_watchdog() -> None:
    """One watchdog however many blocks run; it lives until the last block ends, whichever
    thread's block that is, and a block entered after it stopped starts a new one (in a process
    of its own: this one's session-wide servers hold a block open)."""
    done = subprocess.run(
        [sys.executable, "-c", SHARING], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "shared", (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )


@pytest.mark.slow
def test_a_process_killed_outright_takes_its_local_server_with_it(tiny_model_dir, tmp_path):
    """A process serving the tiny model with `local_server` (`transformers serve`) killed with
    SIGKILL, no `finally` run: the server ends with it."""
    pid_file = tmp_path / "server.pid"
    stage = f"""
import os, signal, time
from engines.serving import local_server
with local_server({str(tiny_model_dir)!r}, {str(tmp_path)!r}, env={{"OMP_NUM_THREADS": "1"}}) as s:
    s.wait_until_up(120)
    open({str(pid_file)!r}, "w").write(str(s.proc.pid))
    time.sleep(3 * {TICK_S})  # the watchdog's next ticks see the server
    os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", stage], cwd=REPO, timeout=180)
    assert done.returncode == -signal.SIGKILL
    server = int(pid_file.read_text())
    deadline = time.monotonic() + 20
    try:
        while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{server}").exists(), "the server outlived its process"
    finally:
        if Path(f"/proc/{server}").exists():
            os.kill(server, signal.SIGKILL)
