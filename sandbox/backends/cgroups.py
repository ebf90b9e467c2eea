"""Cgroups of the namespace backend: one per worker, holding its runner and every process of its
tests, as a Docker container holds them.

Each gets a memory limit (`Limits.worker_memory_mb`, no swap), which counts what rlimits cannot:
several processes, shared memory, memfd and tmpfs pages; one CPU as a cpuset (a CPU quota when
workers are not pinned); and the runner reads its CPU time and OOM kills around each test.

Where (env COBALT_SANDBOX_CGROUP: a setting of the machine, not of a config, so no cache key
depends on it): a parent cgroup under which each worker's is made, named like a cgroup path:
relative to this process's own cgroup, or absolute (from the hierarchy's root). Default: cgroup v2 where its memory and cpuset controllers are
available, under `/cobalt-sandbox` (v2 allows no processes in a cgroup whose children get
controllers, so not under our own), else the v1 memory, cpuset and cpuacct hierarchies, under
`cobalt-sandbox` in our own cgroup of each. `off` runs without (memory per process only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

from sandbox.confine import cgroup_dirs
from sandbox.pool import SandboxUnavailable

DEFAULT_V1 = "cobalt-sandbox"
DEFAULT_V2 = "/cobalt-sandbox"
PERIOD_US = 100_000
HINT = (
    "the namespace backend needs cgroups for its memory and CPU limits: run it as root with "
    "cgroup v2 (memory and cpuset controllers) or the v1 memory, cpuset and cpuacct hierarchies "
    "writable, or set COBALT_SANDBOX_CGROUP to a cgroup delegated to this user (cgroup v2, those "
    "controllers enabled, no process in it); COBALT_SANDBOX_CGROUP=off runs without them (memory "
    "limited per process only, see docs/SANDBOX.md)"
)


@dataclass
class WorkerCgroup:
    dirs: list[str]
    procs: list[str]  # the `cgroup.procs` files the runner writes itself into
    accounting: dict[str, str] = field(default_factory=dict)  # {"cpu": file, "oom": file}


class Cgroups:
    """Finds where workers' cgroups can go (or raises SandboxUnavailable naming the fix), makes
    and removes them."""

    def __init__(self, setting: str | None, quota: bool):
        self.quota = quota  # unpinned workers: a CPU quota (the cpu controller) too
        dirs = cgroup_dirs()
        need = ["memory", "cpuset"] + (["cpu"] if quota else [])
        v2 = dirs.get("")
        if v2 is not None and set(need) <= _available_v2(v2):
            self.version = 2
            self.bases = {"": self._prepare_v2(v2, setting or DEFAULT_V2, need)}
        elif all(c in dirs for c in [*need, "cpuacct"]):
            self.version = 1
            self.bases = {
                c: self._prepare_v1(c, dirs[c], setting or DEFAULT_V1) for c in [*need, "cpuacct"]
            }
        else:
            raise SandboxUnavailable(
                f"{HINT} (found neither cgroup v2 with {'+'.join(need)} nor v1 hierarchies for "
                f"{', '.join([*need, 'cpuacct'])})"
            )
        self.remove_stale()

    # -- the parent of the workers' cgroups -------------------------------------------------------
    @staticmethod
    def _resolve(own: str, setting: str) -> str:
        mount = _mount_point(own)
        path = os.path.normpath(
            os.path.join(mount, setting.lstrip("/"))
            if setting.startswith("/")
            else os.path.join(own, setting)
        )
        if not (path + "/").startswith(mount + "/"):
            raise SandboxUnavailable(f"COBALT_SANDBOX_CGROUP={setting!r} leaves the hierarchy")
        return path

    def _prepare_v2(self, own: str, setting: str, need: list[str]) -> str:
        base = self._resolve(own, setting)
        mount = _mount_point(own)
        chain = [base]
        while chain[-1] != mount:
            chain.append(os.path.dirname(chain[-1]))
        try:
            os.makedirs(base, exist_ok=True)
            enable = " ".join(f"+{c}" for c in need)
            for directory in reversed(chain):  # from the root down: each lends to its children
                _write(os.path.join(directory, "cgroup.subtree_control"), enable)
        except OSError as e:
            raise SandboxUnavailable(f"{HINT} ({base}: {e.strerror or e})") from e
        return base

    def _prepare_v1(self, controller: str, own: str, setting: str) -> str:
        base = self._resolve(own, setting)
        missing = []
        path = base
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        try:
            for directory in reversed(missing):
                # exist_ok: another process of the run (a training rank) may make it first
                os.makedirs(directory, exist_ok=True)
                if controller == "cpuset":  # a new v1 cpuset has no CPU and no memory node
                    _inherit_cpuset(directory)
            _probe(base)
        except OSError as e:
            raise SandboxUnavailable(f"{HINT} ({base}: {e.strerror or e})") from e
        return base

    # -- one worker's ------------------------------------------------------------------------------
    def create(self, name: str, memory_mb: int, cpu: int | None, cpus: float) -> WorkerCgroup:
        """The cgroup(s) of worker `name`: memory (no swap), one CPU or a quota of `cpus`."""
        made = WorkerCgroup([], [])
        memory = memory_mb << 20
        try:
            for controller, base in self.bases.items():
                directory = os.path.join(base, name)
                if os.path.isdir(directory):
                    _remove(directory)  # a stale one of a dead process with our pid
                os.mkdir(directory)
                made.dirs.append(directory)
                made.procs.append(os.path.join(directory, "cgroup.procs"))
                self._limit(controller, directory, memory, cpu, cpus)
        except OSError as e:
            self.remove(made)
            raise SandboxUnavailable(f"could not make the worker's cgroup {name}: {e}") from e
        files = (
            {"cpu": "cpu.stat", "oom": "memory.events"}
            if self.version == 2
            else {"cpu": "cpuacct.usage", "oom": "memory.oom_control"}
        )
        by_controller = {"cpu": "cpuacct", "oom": "memory"}
        for key, filename in files.items():
            base = self.bases[""] if self.version == 2 else self.bases[by_controller[key]]
            made.accounting[key] = os.path.join(base, name, filename)
        return made

    def _limit(self, controller: str, directory: str, memory: int, cpu, cpus: float) -> None:
        v2 = self.version == 2
        if controller in ("memory", ""):
            _write(os.path.join(directory, "memory.max" if v2 else "memory.limit_in_bytes"), memory)
            swap = "memory.swap.max" if v2 else "memory.memsw.limit_in_bytes"
            if os.path.exists(os.path.join(directory, swap)):  # no swap (where it is accounted)
                _write(os.path.join(directory, swap), 0 if v2 else memory)
        if controller in ("cpuset", ""):
            if not v2:
                _inherit_cpuset(directory)
            if cpu is not None:
                _write(os.path.join(directory, "cpuset.cpus"), cpu)
        if self.quota and controller in ("cpu", ""):
            quota = max(1000, int(cpus * PERIOD_US))
            if v2:
                _write(os.path.join(directory, "cpu.max"), f"{quota} {PERIOD_US}")
            else:
                _write(os.path.join(directory, "cpu.cfs_period_us"), PERIOD_US)
                _write(os.path.join(directory, "cpu.cfs_quota_us"), quota)

    def remove(self, made: WorkerCgroup) -> None:
        """Remove a worker's cgroups once its runner is gone (killing whatever is left in them)."""
        for directory in reversed(made.dirs):
            with contextlib.suppress(OSError):
                _remove(directory)

    def remove_stale(self) -> None:
        """Remove workers' cgroups left by processes that died without cleaning up."""
        for base in self.bases.values():
            for entry in os.listdir(base):
                pid = entry[1:].partition("-")[0]
                if entry.startswith("w") and pid.isdigit() and not pid_alive(int(pid)):
                    with contextlib.suppress(OSError):
                        _remove(os.path.join(base, entry))


def worker_name(slot: int) -> str:
    return f"w{os.getpid()}-{slot}"


def _available_v2(own: str) -> set[str]:
    """Controllers the v2 hierarchy has (those not bound to a v1 hierarchy, on hybrid hosts)."""
    try:
        with open(os.path.join(_mount_point(own), "cgroup.controllers")) as f:
            return set(f.read().split())
    except OSError:
        return set()


def _mount_point(directory: str) -> str:
    """The mount point of the cgroup hierarchy `directory` is in."""
    path = directory
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _inherit_cpuset(directory: str) -> None:
    parent = os.path.dirname(directory)
    for name in ("cpuset.mems", "cpuset.cpus"):
        with open(os.path.join(directory, name)) as f:
            if f.read().strip():
                continue
        with open(os.path.join(parent, name)) as f:
            _write(os.path.join(directory, name), f.read().strip())


def _probe(base: str) -> None:
    """Raise OSError unless a child cgroup can be made (and removed) under `base`."""
    probe = os.path.join(base, f"probe-{os.getpid()}")
    os.mkdir(probe)
    os.rmdir(probe)


def _remove(directory: str) -> None:
    """rmdir a cgroup, killing the processes still in it (a worker that died mid-test)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            os.rmdir(directory)
            return
        except OSError as e:
            if e.errno == 2 or time.monotonic() > deadline:  # ENOENT: already gone
                if e.errno == 2:
                    return
                raise
        with contextlib.suppress(OSError), open(os.path.join(directory, "cgroup.procs")) as f:
            for pid in f.read().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists (another user's counts: EPERM)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
