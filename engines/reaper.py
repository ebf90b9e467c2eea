"""No process outlives the process that started it, even one killed with SIGKILL (then nothing of
its own runs: no `finally`, no atexit). Its children and their children (Prefect's temporary API
server, the sandbox's worker processes, a vLLM server and its engine cores, Dask's local
workers) would be left running, adopted by init, a vLLM engine core holding its GPU. A flow's
command line runs under `reaper()` (flows/cli.py); so does every local server while it runs
(`engines.serving.local_server`, the training stage's `generation_server`), whoever started it:
a deployment's flow run, a notebook, a script.

`reaper()` starts a watchdog for the block it wraps: this file run by a fresh interpreter (stdlib
only, `python -I -S`), in a session of its own so that a Ctrl-C to the terminal does not end it
first. Every `TICK_S` it records the watched process's descendants (pid and start time, from
/proc); when that process is gone (the watchdog is adopted, or its pipe closes) it ends the
recorded ones still running, with their own descendants: SIGTERM, then SIGKILL after `GRACE_S`.
When the block ends normally the watchdog just exits (Prefect stops its server at exit). A child
started and killed within one tick can be missed. Linux only (/proc); elsewhere a no-op. Docker's
sandbox containers are the engine's children, not ours: they exit when their input closes.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

TICK_S = 0.5
GRACE_S = 5.0
STOP = b"q"  # what the watched process writes when the block ends normally


@contextlib.contextmanager
def reaper() -> Iterator[None]:
    """While the block runs, a watchdog ends this process's descendants if this process dies.
    Blocks nested or run side by side (threads) share one watchdog: the first starts it, the
    last to end stops it."""
    if not (sys.platform.startswith("linux") and os.path.isdir("/proc/self/task")):
        yield
        return
    pid = os.getpid()  # a forked child starts a watchdog of its own
    with _lock:
        count, watchdog = _watchdogs.get(pid, (0, None))
        if watchdog is None:
            watchdog = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(pid)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,  # never holds the caller's pipes open
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        _watchdogs[pid] = (count + 1, watchdog)
    try:
        yield
    finally:
        with _lock:
            count, watchdog = _watchdogs.pop(pid)
            if count > 1:
                _watchdogs[pid] = (count - 1, watchdog)
            else:
                _stop(watchdog)


_lock = threading.Lock()
_watchdogs: dict[int, tuple[int, subprocess.Popen]] = {}  # this process's: blocks inside, it


def _stop(watchdog: subprocess.Popen) -> None:
    """The block ended normally: the watchdog leaves every process as it is and exits."""
    assert watchdog.stdin is not None
    with contextlib.suppress(OSError):
        watchdog.stdin.write(STOP)
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


# --- the watchdog (runs in its own interpreter: stdlib only) ----------------------------------


def stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), fields[19]


def alive(pid: int, started: str) -> bool:
    """The process that started at `started` still runs (not a zombie, not a reused pid)."""
    found = stat(pid)
    return found is not None and found[0] != "Z" and found[2] == started


def children(pid: int) -> list[int]:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:  # a thread that ended, or a kernel without the children file
            return [p for p in _all_pids() if (s := stat(p)) and s[1] == pid]
    return found


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(pid: int) -> dict[int, str]:
    """Every descendant of `pid` now, with its start time."""
    found: dict[int, str] = {}
    todo = children(pid)
    while todo:
        child = todo.pop()
        if child in found or (s := stat(child)) is None:
            continue
        found[child] = s[2]
        todo += children(child)
    return found


def end(processes: dict[int, str]) -> None:
    """SIGTERM each process still running (and its descendants), SIGKILL after GRACE_S."""
    targets = {p: t for p, t in processes.items() if alive(p, t)}
    for pid in list(targets):
        targets.update(descendants(pid))
    targets.pop(os.getpid(), None)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, started in targets.items():
            if alive(pid, started):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(alive(p, t) for p, t in targets.items()):
            time.sleep(0.1)


def watch(pid: int) -> None:
    """Record `pid`'s descendants until it is gone (end them) or says STOP (leave them)."""
    recorded: dict[int, str] = {}
    me = os.getpid()
    while True:
        ready, _, _ = select.select([0], [], [], TICK_S)
        if ready:
            data = os.read(0, 1)
            if data == STOP:
                return
            if not data:  # every write end closed: the watched process is gone
                break
        if os.getppid() != pid:  # adopted: the watched process is gone
            break
        recorded = {p: t for p, t in recorded.items() if alive(p, t)}  # the living, orphans too
        recorded.update(descendants(pid))
        recorded.pop(me, None)
    end(recorded)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
