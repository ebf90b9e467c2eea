"""Which CPU a worker runs on.

A test is a chain of wake-ups (the runner forks, the test's process runs and exits, the runner
wakes), and on a small VM each one that crosses CPUs is slow. So each worker, and every process it
forks, stays on one CPU: the least used of those this process may run on, starting from a CPU that
depends on the pid, so that two processes do not start on the same one. (Measured on the 2-core VM:
25% more tests/s with two workers; docs/RESULTS.md, the sandbox.) `SandboxConfig.pin_cpus` turns it
off, for hosts where other work shares these CPUs and the scheduler should move ours.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

_use: Counter[int] = Counter()
_lock = threading.Lock()


def take_cpu() -> int:
    cpus = sorted(os.sched_getaffinity(0))
    start = os.getpid() % len(cpus)
    with _lock:
        cpu = min(cpus[start:] + cpus[:start], key=lambda c: _use[c])
        _use[cpu] += 1
    return cpu


def release_cpu(cpu: int | None) -> None:
    if cpu is not None:
        with _lock:
            _use[cpu] -= 1
