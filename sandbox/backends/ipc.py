"""System V IPC bounds of a worker's IPC namespace (both backends give each worker its own).

Shared memory outlives the process that made it, so it is both a channel from one test to the
next and memory that the worker's cgroup keeps charged after the test is gone. The runner removes
what a test left (`confine.sweep_ipc`), and these sysctls bound it meanwhile: a segment goes
with its last process (`shm_rmid_forced`), and all of them together hold at most the test's
memory limit, so the runner keeps its own share of the cgroup's memory; message queues, whose
messages also count against the cgroup, are few.
"""

from __future__ import annotations

import resource

from sandbox.models import Limits


def ipc_sysctls(limits: Limits) -> dict[str, int]:
    memory = limits.memory_mb << 20
    return {
        "kernel.shm_rmid_forced": 1,
        "kernel.shmmax": memory,
        "kernel.shmall": memory // resource.getpagesize(),
        "kernel.msgmni": 16,
    }
