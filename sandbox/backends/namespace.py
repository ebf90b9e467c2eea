"""Namespace backend: the runner jails itself with Linux namespaces, a cgroup and seccomp.

For machines without Docker (GPU workers, laptops). The runner joins a cgroup of its worker's
own (memory and CPU limits, CPU accounting: `cgroups.py`), unshares user (when not root), mount,
PID, network, IPC and UTS namespaces, bounds System V IPC with its IPC namespace's sysctls,
chroots into a read-only view of the interpreter's directories with a tmpfs scratch, runs tests
as an unprivileged user with no capabilities, under the seccomp filter of `confine.py`.
Processes per worker are bounded by RLIMIT_NPROC (each worker has a uid of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from sandbox.backends.cgroups import Cgroups, pid_alive, worker_name
from sandbox.backends.cpus import release_cpu, take_cpu
from sandbox.backends.ipc import ipc_sysctls
from sandbox.models import Limits
from sandbox.pool import MAX_REPLY_BYTES, Backend, SandboxUnavailable, Worker
from sandbox.runner_source import RUNNER_SOURCE

log = logging.getLogger(__name__)

BASE_UID = 61000  # as root, a worker runs as BASE_UID + (pid % 65536) * 256 + its slot
_slots: set[int] = set()  # slots of this process's live workers, whatever pool they are in
_slots_lock = threading.Lock()


def _take_uid() -> tuple[int, int]:
    """An unprivileged uid of the worker's own (slot, uid), so RLIMIT_NPROC (counted per uid) is
    shared with no other worker: not of another process (each has its own block of 256 uids),
    nor of another pool of this one (a server holds several)."""
    with _slots_lock:
        slot = next((k for k in range(256) if k not in _slots), None)
        if slot is None:
            raise SandboxUnavailable("more than 256 namespace workers in one process")
        _slots.add(slot)
    return slot, BASE_UID + (os.getpid() % 65536) * 256 + slot


def _release_uid(slot: int) -> None:
    with _slots_lock:
        _slots.discard(slot)


ROOT_PREFIX = "cobalt-jail-"


def remove_stale_roots() -> None:
    """Remove the empty jail roots of processes that died without cleaning up (killed: their
    workers' `close` never ran). A root is named after the pid that made it."""
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.listdir(tmp):
            pid = entry[len(ROOT_PREFIX) :].partition("-")[0]
            if entry.startswith(ROOT_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):  # not empty or not ours: left alone
                    os.rmdir(os.path.join(tmp, entry))


SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/nonexistent",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def interpreter_dirs() -> list[str]:
    """Directories the jailed base interpreter needs (never a virtualenv's: stdlib only)."""
    dirs = {sys.base_prefix, sys.base_exec_prefix}
    return sorted(d for d in dirs if not any(d.startswith(s + "/") or d == s for s in SYSTEM_DIRS))


def site_packages() -> list[str]:
    """The base interpreter's third-party package dirs, hidden inside the jail."""
    return sorted(
        {
            p
            for p in sysconfig.get_paths(
                vars={"base": sys.base_prefix, "platbase": sys.base_prefix}
            ).values()
            if p.endswith(("site-packages", "dist-packages"))
        }
    )


class NamespaceBackend(Backend):
    name = "namespace"

    def __init__(
        self,
        limits: Limits,
        python: str | None = None,
        pin: bool = False,
        cpus: float = 1.0,
        cgroup: str | None = None,
    ):
        self.limits = limits
        self.pin = pin
        self.cpus = cpus
        self.python = python or str(Path(sys._base_executable).resolve())
        self._roots: list[str] = []
        remove_stale_roots()
        self.cgroups: Cgroups | None = None
        if cgroup == "off":
            log.warning(
                "namespace sandbox without cgroups (COBALT_SANDBOX_CGROUP=off): memory is limited "
                "per process only, and CPU time to the processes a test waits for"
            )
        else:
            self.cgroups = Cgroups(cgroup, quota=not pin)  # SandboxUnavailable names the fix

    async def spawn(self, index: int) -> Worker:
        root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-")
        self._roots.append(root)
        slot, uid = _take_uid()
        cpu = take_cpu() if self.pin else None
        cgroups, cgroup = self.cgroups, None
        cfg = {
            "namespace": True,
            "root": root,
            "binds": list(SYSTEM_DIRS) + interpreter_dirs(),
            "hide": site_packages(),
            "tmp_mb": self.limits.scratch_mb,
            "uid": uid,
            "cpu": cpu,
            "workdir": "/tmp",
            "ipc": True,
            "sysctls": ipc_sysctls(self.limits),
        }
        try:
            if cgroups is not None:
                cgroup = await asyncio.to_thread(
                    cgroups.create,
                    worker_name(slot),
                    self.limits.worker_memory_mb,
                    cpu,
                    self.cpus,
                )
                cfg["cgroup"] = {"procs": cgroup.procs, "accounting": cgroup.accounting}
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                "-S",
                "-c",
                RUNNER_SOURCE,
                json.dumps(cfg),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=MAX_REPLY_BYTES,
                env=SANDBOX_ENV,  # never the host's: it may hold credentials
            )
        except BaseException:
            if cgroups is not None and cgroup is not None:
                cgroups.remove(cgroup)
            _release_uid(slot)
            release_cpu(cpu)
            raise
        assert proc.stdin and proc.stdout and proc.stderr

        async def write(data: bytes) -> None:
            proc.stdin.write(data)
            await proc.stdin.drain()

        async def close() -> None:
            proc.stdin.close()  # the runner exits at end of input...
            try:
                await asyncio.wait_for(proc.wait(), 2)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # ...or dies with its parent (PR_SET_PDEATHSIG)
                await proc.wait()
            if cgroups is not None and cgroup is not None:  # empty: its PID namespace is gone
                await asyncio.to_thread(cgroups.remove, cgroup)
            _release_uid(slot)  # its PID namespace, and every process of that uid, are gone
            release_cpu(cpu)
            with contextlib.suppress(OSError):
                os.rmdir(root)
            with contextlib.suppress(ValueError):
                self._roots.remove(root)

        worker = Worker(
            index,
            proc.stdout.readline,
            write,
            close,
            enforce_nproc=True,
            name=f"namespace-worker-{index}",
        )
        try:
            await worker.handshake(timeout=30)
        except Exception as e:
            await worker.close()
            err = (await proc.stderr.read()).decode(errors="replace").strip()
            raise SandboxUnavailable(
                f"the namespace sandbox could not start: {err.splitlines()[-1] if err else e}. "
                "It needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
                "and user.max_user_namespaces > 0) or root."
            ) from e
        return worker

    async def aclose(self) -> None:
        for root in self._roots:
            with contextlib.suppress(OSError):
                os.rmdir(root)
