"""What the runner does to confine itself and its tests, inside the sandbox: standard library only
(its source travels with the runner's, see `runner_source.py`; the host imports it too, to find
cgroups the same way).

* `enter_namespace`: the namespace backend's jail (the Docker backend gets the same from the
  container): mount, PID, network, IPC and UTS namespaces, a read-only root, a tmpfs /tmp, a
  private POSIX message-queue mount, System V IPC bounded by the namespace's sysctls;
* `join_cgroups`: into the worker's cgroups (namespace backend), before the jail hides /sys;
* `install_seccomp`: a small BPF filter, on both backends, that denies the syscalls a test never
  needs and that reach kernel code no sandbox should expose (see `DENIED`);
* `Accounting`: the CPU time and OOM kills of the sandbox's cgroup, read around each test;
* `sweep_ipc`: removes every System V IPC object and POSIX message queue a test left.
"""

import ctypes
import errno
import os
import signal

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_KEEP = 8 | 1024 | 2048 | 4096  # noexec, noatime, nodiratime, relatime: locked, must be kept
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 22, 38
MQUEUE = "/dev/mqueue"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(
        _libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {src} on {dst}",
    )


def _bind_readonly(src, dst):
    _mount(src, dst, None, MS_BIND | MS_REC)
    keep = os.statvfs(src).f_flag & MS_KEEP
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def _drop_capabilities():
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    _check(_libc.syscall(126 if os.uname().machine == "x86_64" else 91, header, data), "capset")


def enter_namespace(cfg):
    """Unshare every namespace, build a read-only root with a tmpfs scratch, chroot into it and
    fork: the child returns as PID 1 of the new PID namespace, the parent waits and mirrors it."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare")
    if uid != 0:  # unprivileged: map ourselves to an ordinary user inside
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"1000 {uid} 1"),
            ("gid_map", f"1000 {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    # This IPC namespace's own sysctls: only root may set them (in a user namespace, uid 0 of
    # it, which an unprivileged runner is not: it maps itself to an ordinary user).
    for name, value in cfg.get("sysctls", {}).items() if uid == 0 else ():
        with open("/proc/sys/" + name.replace(".", "/"), "w") as f:
            f.write(str(value))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = cfg["root"]
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in cfg["binds"]:
        target = root + path
        if os.path.islink(path) and os.path.dirname(path) == "/":
            os.symlink(os.readlink(path), target)  # merged-usr: /bin -> usr/bin
            continue
        if not os.path.isdir(path) or os.path.exists(target):
            continue
        os.makedirs(target)
        _bind_readonly(path, target)
    for path in cfg.get("hide", ()):  # e.g. the host's site-packages: the jail has the stdlib only
        if os.path.isdir(root + path):
            _mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    os.makedirs(root + "/dev")
    for dev in ("null", "zero", "random", "urandom"):
        open(f"{root}/dev/{dev}", "w").close()
        _mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
    os.makedirs(root + MQUEUE)  # this IPC namespace's queues, where the runner can list them
    _mount("mqueue", root + MQUEUE, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/tmp")
    _mount(
        "tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_mb']}m,mode=1777"
    )
    _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    os.chroot(".")
    os.chdir("/")
    pid = os.fork()
    if pid:  # outside the new PID namespace: wait, then exit like the namespace's init
        os.close(0)
        os.close(1)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    if uid == 0:  # real root: become an unprivileged user of our own (all capabilities go)
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    else:
        _drop_capabilities()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the parent outside


# --------------------------------------------------------------------------------------------
# cgroups: found from /proc/self, joined before the jail, read through descriptors opened then.


def _unescape(path):
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")


def cgroup_dirs(pid="self"):
    """{controller: directory} of a process's own cgroups as mounted here (v1 controllers by
    name, the v2 hierarchy as ""), from /proc/<pid>/cgroup and /proc/self/mountinfo."""
    own = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    dirs = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, (fstype, _, options) = left.split(), right.split()[:3]
            if fstype == "cgroup2":
                names = [""]
            elif fstype == "cgroup":
                names = [o for o in options.split(",") if o in own and o != ""]
            else:
                continue
            root, point = _unescape(fields[3]).rstrip("/"), _unescape(fields[4])
            for name in names:
                path = own.get(name)
                if path is not None and (path + "/").startswith(root + "/"):
                    dirs.setdefault(name, os.path.normpath(point + path[len(root) :]))
    return dirs


def own_accounting():
    """The files that count CPU time and OOM kills in this process's own cgroup (a container's):
    v1's where its controllers are mounted, else v2's."""
    dirs = cgroup_dirs()
    found = {}
    for key, candidates in (
        ("cpu", (("cpuacct", "cpuacct.usage"), ("", "cpu.stat"))),
        ("oom", (("memory", "memory.oom_control"), ("", "memory.events"))),
    ):
        for controller, name in candidates:
            if controller in dirs and os.path.exists(os.path.join(dirs[controller], name)):
                found[key] = os.path.join(dirs[controller], name)
                break
    return found


def join_cgroups(procs_files):
    """Move this process into each cgroup (its `cgroup.procs` file): what it forks follows."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write(str(os.getpid()))


class Accounting:
    """CPU seconds and OOM kills of the sandbox's cgroup (the runner and every process of its
    tests), through descriptors opened before the jail: `cpu` is `cpuacct.usage` (v1, ns) or
    `cpu.stat` (v2, usage_usec); `oom` is `memory.oom_control` or `memory.events` (oom_kill)."""

    def __init__(self, files):
        cpu, oom = files.get("cpu"), files.get("oom")
        self.cpu_fd = os.open(cpu, os.O_RDONLY) if cpu else None
        self.cpu_v1 = bool(cpu and cpu.endswith("cpuacct.usage"))
        self.oom_fd = os.open(oom, os.O_RDONLY) if oom else None

    def sample(self):
        """(cgroup CPU seconds or None, this process's own CPU seconds, OOM kills or None)."""
        usage = os.times()
        cpu = None
        if self.cpu_fd is not None:
            text = os.pread(self.cpu_fd, 4096, 0)
            cpu = int(text) / 1e9 if self.cpu_v1 else _field(text, b"usage_usec") / 1e6
        oom = _field(os.pread(self.oom_fd, 4096, 0), b"oom_kill") if self.oom_fd else None
        return cpu, usage.user + usage.system, oom

    @staticmethod
    def since(before, after):
        """CPU seconds of everything in the cgroup but this process, and whether the OOM killer
        struck, between two samples (None, False without a cgroup)."""
        cpu = None
        if before[0] is not None:
            cpu = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
        return cpu, before[2] is not None and after[2] > before[2]


def _field(text, name):
    for line in text.split(b"\n"):
        if line.startswith(name + b" "):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------------------------
# seccomp: one classic-BPF program, checked against the architecture first.

# name: (x86_64, aarch64) numbers. Key rings (they live in the kernel, not in any namespace),
# io_uring, perf events, eBPF, ptrace and cross-process memory access, mounts of every kind,
# namespaces, file handles, the kernel log.
DENIED = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "perf_event_open": (298, 241),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "syslog": (103, 116),
}
CLONE = (56, 220)  # allowed unless its flags (first argument) ask for a namespace
CLONE3 = 435  # its flags sit in memory the filter cannot read: ENOSYS, so libc falls back to clone
CLONE_NAMESPACES = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER) | (
    CLONE_NEWPID | CLONE_NEWNET
)
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # AUDIT_ARCH_*
X32_BIT = 0x40000000  # x86_64's x32 ABI: the same numbers with this bit set

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine):
    """The filter as (code, jt, jf, k) instructions: seccomp_data is nr (offset 0), arch (4), ...,
    args[0] (16, its low 32 bits on these little-endian machines)."""
    column, arch = ARCHES[machine]
    denied = sorted({numbers[column] for numbers in DENIED.values()})
    prog = [
        (_LD_W_ABS, 0, 0, 4),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _KILL_PROCESS),  # another ABI (i386, 32-bit arm): other numbers
        (_LD_W_ABS, 0, 0, 0),
    ]
    # The checks, then: [0] allow, [1] load clone's flags, [2] test them, [3] allow, [4] EPERM,
    # [5] ENOSYS; a check jumps (when it matches) over the checks after it to one of these.
    checks = [("deny", nr) for nr in denied] + [("clone3", CLONE3), ("clone", CLONE[column])]
    if column == 0:
        checks.insert(0, ("x32", X32_BIT))
    for k, (kind, nr) in enumerate(checks):
        target = {"x32": 4, "deny": 4, "clone3": 5, "clone": 1}[kind]
        prog.append((_JGE if kind == "x32" else _JEQ, len(checks) - k - 1 + target, 0, nr))
    prog += [
        (_RET, 0, 0, _ALLOW),
        (_LD_W_ABS, 0, 0, 16),
        (_JSET, 1, 0, CLONE_NAMESPACES),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EPERM),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
    ]
    return prog


def install_seccomp():
    """Install the filter on this process; every process it forks inherits it (for good: a
    filter can be added to, never removed). Needs no_new_privs (set by `harden`)."""
    prog = seccomp_program(os.uname().machine)
    cells = (_SockFilter * len(prog))(*(_SockFilter(*p) for p in prog))
    fprog = _SockFprog(len(prog), cells)
    _check(_libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "seccomp filter")


# --------------------------------------------------------------------------------------------
# IPC left by a test: System V objects and POSIX message queues of this IPC namespace.

IPC_RMID = 0
# (control function, its INFO command, its STAT_ANY command, which int of the INFO reply
#  counts the objects in use: shm_info.used_ids, msginfo.msgpool, seminfo.semusz)
_SYSV = (("shmctl", 14, 15, 0), ("msgctl", 12, 13, 0), ("semctl", 19, 20, 7))
_ipc_buffer = ctypes.create_string_buffer(512)


def _ipc_call(name, ident, command, buffer):
    fn = getattr(_libc, name)
    if name == "semctl":
        return fn(ident, 0, command, buffer)
    return fn(ident, command, buffer)


def sweep_ipc():
    """Remove every System V IPC object (shared memory, message queue, semaphore set) and POSIX
    message queue of this IPC namespace: (how many there were, whether all are gone). Only for
    a runner in an IPC namespace of its own (both backends give it one)."""
    found, ok = 0, True
    words = (ctypes.c_int * (len(_ipc_buffer) // 4)).from_buffer(_ipc_buffer)
    for name, info, stat_any, word in _SYSV:
        top = _ipc_call(name, 0, info, _ipc_buffer)
        if top < 0 or words[word] <= 0:
            continue
        used, removed = words[word], 0
        found += used
        for index in range(top + 1):
            ident = _ipc_call(name, index, stat_any, _ipc_buffer)
            if ident >= 0 and _ipc_call(name, ident, IPC_RMID, None) == 0:
                removed += 1
        ok = ok and removed >= used
    try:
        queues = os.listdir(MQUEUE)
    except OSError:
        queues = []
    for queue in queues:
        found += 1
        try:
            os.unlink(os.path.join(MQUEUE, queue))
        except OSError:
            ok = False
    return found, ok
