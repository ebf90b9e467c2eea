"""What the sandbox's own confinement is made of (`sandbox/confine.py`, `backends/cgroups.py`): the
seccomp program for each architecture, run by a small BPF interpreter, and the namespace backend's
cgroups: where they go, and the refusal (or the explicit opt-out) where none can be made. What a
hostile program meets is test_hostile.py's subject."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox import JudgeRequest, Limits, SandboxConfig, SandboxUnavailable, SyncJudge
from sandbox.backends.cgroups import Cgroups
from sandbox.confine import (
    ARCHES,
    CLONE,
    CLONE3,
    CLONE_NEWUSER,
    DENIED,
    X32_BIT,
    cgroup_dirs,
    seccomp_program,
)
from sandbox.models import TestSuite as Suite

PROJECT = Path(__file__).resolve().parents[2]
ALLOW, KILL = "allow", "kill"
SIGCHLD = 17


def run_bpf(prog: list[tuple[int, int, int, int]], nr: int, arch: int, arg0: int = 0) -> str:
    """What the filter answers for one syscall: allow, kill, or an errno name."""
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # ld [k]
            acc = data[k]
        elif code == 0x06:  # ret k
            if k == 0x7FFF0000:
                return ALLOW
            if k == 0x80000000:
                return KILL
            assert k >> 16 == 0x0005, hex(k)
            return errno.errorcode[k & 0xFFFF]
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_seccomp_program_denies_what_it_lists_and_nothing_else(machine):
    column, arch = ARCHES[machine]
    prog = seccomp_program(machine)
    assert len(prog) < 256  # jump offsets are one byte
    for name, numbers in DENIED.items():
        assert run_bpf(prog, numbers[column], arch) == "EPERM", name
    denied = {numbers[column] for numbers in DENIED.values()}
    ordinary = [n for n in range(0, 460) if n not in denied and n not in (CLONE[column], CLONE3)]
    assert {run_bpf(prog, n, arch) for n in ordinary} == {ALLOW}
    assert run_bpf(prog, CLONE3, arch) == "ENOSYS"  # libc falls back to clone, which is checked
    assert run_bpf(prog, CLONE[column], arch, SIGCHLD) == ALLOW  # fork
    assert run_bpf(prog, CLONE[column], arch, 0x3D0F00) == ALLOW  # a thread (CLONE_VM ...)
    assert run_bpf(prog, CLONE[column], arch, CLONE_NEWUSER | SIGCHLD) == "EPERM"
    assert run_bpf(prog, 0, 0x40000003) == KILL  # another ABI (i386)
    if machine == "x86_64":
        assert run_bpf(prog, X32_BIT | 0, arch) == "EPERM"


def test_the_filter_is_the_one_installed():
    """The runner installs `seccomp_program` for this machine (checked against the kernel's own
    view: one filter, and keyctl refused, in a process of its own)."""
    code = (
        "import ctypes, os\n"
        "from sandbox import confine\n"
        "confine._libc.prctl(confine.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)\n"
        "confine.install_seccomp()\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
        "nr = confine.DENIED['keyctl'][confine.ARCHES[os.uname().machine][0]]\n"
        "r = confine._libc.syscall(nr, 0, 0, 0, 0, 0)\n"
        "print(status['Seccomp'].strip(), status['Seccomp_filters'].strip(), r,"
        " ctypes.get_errno())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["2", "1", "-1", str(errno.EPERM)]


# -- cgroups of the namespace backend -------------------------------------------------------------

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="cgroups are made as root here")
AS_NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


@ROOT_ONLY
def test_workers_cgroups_hold_the_limits_and_go_with_the_worker():
    cgroups = Cgroups(None, quota=False)
    made = cgroups.create("w-test-0", 300, 0, 1.0)
    try:
        assert made.dirs and all(os.path.isdir(d) for d in made.dirs)
        for directory in made.dirs:
            names = set(os.listdir(directory))
            if "memory.max" in names or "memory.limit_in_bytes" in names:
                limit = "memory.max" if "memory.max" in names else "memory.limit_in_bytes"
                assert Path(directory, limit).read_text().strip() == str(300 << 20)
            if "cpuset.cpus" in names:
                assert Path(directory, "cpuset.cpus").read_text().strip() == "0"
        assert set(made.accounting) == {"cpu", "oom"}
        assert all(os.path.exists(f) for f in made.accounting.values())
    finally:
        cgroups.remove(made)
    assert not any(os.path.exists(d) for d in made.dirs)


def _make_cgroups(setting: str, barrier, failures) -> None:
    barrier.wait()
    try:
        Cgroups(setting, quota=False)
    except Exception as e:  # noqa: BLE001 - reported to the test
        failures.append(repr(e))


@ROOT_ONLY
def test_processes_of_one_run_make_the_workers_parent_cgroup_together():
    """Training ranks start their sandboxes at the same moment: each finds the parent cgroup
    missing and makes it; the later ones must take it as made, not fail (FileExistsError)."""
    import multiprocessing

    # spawn: a child forked from the test session would also run the session's exit handlers
    context = multiprocessing.get_context("spawn")
    setting = f"/cobalt-race-{os.getpid()}"
    with context.Manager() as manager:
        barrier, failures = manager.Barrier(6), manager.list()
        processes = [
            context.Process(target=_make_cgroups, args=(setting, barrier, failures))
            for _ in range(6)
        ]
        for p in processes:
            p.start()
        for p in processes:
            p.join(60)
        failed = list(failures)
    bases = Cgroups(setting, quota=False).bases.values()
    for base in bases:
        os.rmdir(base)
    assert failed == []
    assert [p.exitcode for p in processes] == [0] * 6


@ROOT_ONLY
def test_a_setting_that_leaves_the_hierarchy_is_refused():
    with pytest.raises(SandboxUnavailable, match="leaves the hierarchy"):
        Cgroups("../../../escape", quota=False)


@ROOT_ONLY
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_a_usable_cgroup_the_backend_refuses_and_names_the_fix():
    """As a user who may not make cgroups, the namespace backend refuses to start, in one line
    that names the setting (rather than run with per-process limits only)."""
    home = tempfile.mkdtemp()
    os.chmod(home, 0o755)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from sandbox.backends import make_backend\n"
        "from sandbox import SandboxConfig, SandboxUnavailable\n"
        "try:\n"
        "    make_backend(SandboxConfig(backend='namespace'))\n"
        "except SandboxUnavailable as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COBALT_SANDBOX_CGROUP"}
    proc = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", code, str(PROJECT)],
        cwd=home,
        env={**env, "HOME": home},
        capture_output=True,
        text=True,
        timeout=120,
    )
    shutil.rmtree(home, ignore_errors=True)
    if proc.returncode != 0 and "Permission denied" in proc.stderr[:300]:
        pytest.skip(f"this interpreter cannot run as nobody: {proc.stderr[:200]}")
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stderr
    assert len(lines) == 1 and "COBALT_SANDBOX_CGROUP" in lines[0], proc.stdout
    assert "COBALT_SANDBOX_CGROUP=off" in lines[0]


def test_the_opt_out_runs_without_cgroups_and_says_so(caplog, monkeypatch):
    monkeypatch.setenv("COBALT_SANDBOX_CGROUP", "off")
    config = SandboxConfig(backend="namespace", concurrency=1, use_server=False, limits=Limits())
    with caplog.at_level("WARNING"), SyncJudge(config) as judge:
        verdict = judge.judge(
            JudgeRequest(id="x", code="print(input())", tests=Suite(inputs=["1"], outputs=["1"]))
        )
    assert verdict.status == "accepted"
    assert "without cgroups" in caplog.text


def test_this_process_cgroups_are_found():
    dirs = cgroup_dirs()
    assert dirs, "no cgroup hierarchy mounted?"
    assert all(os.path.isdir(d) for d in dirs.values())
