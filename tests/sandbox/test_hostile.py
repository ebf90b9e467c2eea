"""Hostile programs, on every backend: each is judged failing, stays contained, and leaves the pool
healthy. The programs run as one concurrent batch (`judge_many`) with short limits; each test
below states what must have happened to one of them.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox import Judge, JudgeRequest, Limits, SandboxConfig, SyncJudge, Verdict
from sandbox.backends.namespace import BASE_UID
from sandbox.models import TestSuite as Suite

PROJECT = Path(__file__).resolve().parents[2]
LIMITS = {"timeout_s": 2.0, "suite_timeout_s": 8.0, "memory_mb": 256}
CONCURRENCY = 4
SECRET_PREFIX = "cobalt-secret-"
TAG = f"cobalt-escape-{uuid.uuid4().hex[:12]}"
WRITE_TARGETS = [
    f"/{TAG}",
    f"/usr/{TAG}",
    f"/etc/{TAG}",
    f"/root/{TAG}",
    f"/home/{TAG}",
    f"/var/tmp/{TAG}",
    f"{PROJECT}/{TAG}",
]
DOUBLE = "print(int(input()) * 2)"
SYSCALLS = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    NR = dict(zip(
        ["keyctl", "add_key", "io_uring_setup", "perf_event_open", "bpf", "ptrace", "mount",
         "unshare"],
        {"x86_64": [250, 248, 425, 298, 321, 101, 165, 272],
         "aarch64": [219, 217, 425, 241, 280, 117, 40, 97]}[os.uname().machine],
    ))
    """)
IPC = SYSCALLS + textwrap.dedent("""\
    KEY, CREATE = 0xC0BA17, 0o1666  # IPC_CREAT | 0666

    def found():
        '''What an earlier program or test left: System V IPC, POSIX queues, keys.'''
        kinds = []
        if libc.shmget(KEY, 0, 0) >= 0:
            kinds.append("shm")
        if libc.semget(KEY, 0, 0) >= 0:
            kinds.append("sem")
        if libc.msgget(KEY, 0) >= 0:
            kinds.append("msg")
        if os.path.isdir("/dev/mqueue") and os.listdir("/dev/mqueue"):
            kinds.append("mqueue")
        if libc.syscall(NR["keyctl"], 10, -4, b"user", b"cobalt", 0) >= 0:  # search user keyring
            kinds.append("key")
        return kinds

    def leave():
        '''One of each: 150 MiB of shared memory (touched, left detached), a semaphore set, a
        queue holding a message, a POSIX queue, a key in the user's key ring. What it made.'''
        made = []
        shm = libc.shmget(KEY, 150 << 20, CREATE)
        addr = libc.shmat(shm, None, 0) if shm >= 0 else None
        if addr not in (None, 2**64 - 1):
            ctypes.memset(addr, 1, 150 << 20)
            libc.shmdt(ctypes.c_void_p(addr))
            made.append("shm")
        if libc.semget(KEY, 1, CREATE) >= 0:
            made.append("sem")
        queue = libc.msgget(KEY, CREATE)
        message = (1).to_bytes(8, "little") + b"secret"  # struct msgbuf: long mtype, text
        if queue >= 0 and libc.msgsnd(queue, message, 6, 0) == 0:
            made.append("msg")
        if libc.mq_open(b"/cobalt", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:
            made.append("mqueue")
        if libc.syscall(NR["add_key"], b"user", b"cobalt", b"secret", 6, -4) >= 0:
            made.append("key")
        return made
    """)
HOLD = textwrap.dedent("""\
    import os, select, sys, time, traceback

    def hold(n, work):
        '''n processes that each do `work` and stay: "held" once all n did.'''
        r, w = os.pipe()
        for _ in range(n):
            if os.fork() == 0:
                try:
                    work()
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
                os.write(w, b"x")
                time.sleep(10)
                os._exit(0)
        os.close(w)
        got, end = 0, time.monotonic() + 1.5
        while got < n and time.monotonic() < end:
            if select.select([r], [], [], 0.05)[0]:
                got += len(os.read(r, n))
        print("held" if got == n else f"{got} of {n}")
        sys.exit(0 if got == n else 3)
    """)


@dataclass
class Case:
    code: str
    inputs: list[str] = field(default_factory=lambda: ["1\n"])
    outputs: list[str] = field(default_factory=lambda: ["expected answer"])
    fn_name: str | None = None


def cases(port: int, host_ips: list[str], secret: str) -> dict[str, Case]:
    d = textwrap.dedent
    return {
        "infinite_loop": Case("while True:\n    pass"),
        "sleep": Case("import time\ntime.sleep(100)"),
        "fork_bomb": Case(
            d("""\
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """)
        ),
        "thread_bomb": Case(
            d("""\
            import threading, time
            threading.stack_size(64 << 10)  # small stacks: the process limit, not memory, stops it
            threads = []
            while True:
                t = threading.Thread(target=time.sleep, args=(100,))
                t.start()
                threads.append(t)
            """)
        ),
        "memory_bytearray": Case(
            d("""\
            b = bytearray()
            while True:
                b += bytes(64 << 20)
            """)
        ),
        "memory_strings": Case(
            d("""\
            chunks = []
            while True:
                chunks.append("x" * (64 << 20))
            """)
        ),
        "huge_output": Case(
            d("""\
            chunk = "x" * (1 << 20)
            for _ in range(1024):  # 1 GiB
                print(chunk)
            """)
        ),
        "huge_stderr": Case(
            d("""\
            import sys
            chunk = "x" * (1 << 20)
            for _ in range(1024):
                sys.stderr.write(chunk)
            """)
        ),
        "disk_fill": Case(
            d("""\
            with open("fill", "wb") as f:
                for _ in range(1024):
                    f.write(bytes(1 << 20))
            print("expected answer")
            """)
        ),
        "recursion_unbounded": Case("def f(n):\n    return f(n + 1) + 1\nprint(f(0))"),
        "recursion_c_stack": Case(
            d("""\
            import sys, functools
            sys.setrecursionlimit(10 ** 8)
            @functools.lru_cache(maxsize=None)
            def f(n):
                return f(n + 1) + 1
            print(f(0))
            """)
        ),
        "int_100000_digits": Case("print(10 ** 100000)", outputs=["1" + "0" * 100000]),
        "net_internet": Case(
            d("""\
            import socket
            s = socket.create_connection(("1.1.1.1", 80), timeout=1)
            print("connected")
            """),
            outputs=["connected"],
        ),
        "net_host": Case(
            d(f"""\
            import socket
            for ip in {host_ips!r}:
                try:
                    socket.create_connection((ip, {port}), timeout=0.3)
                    print("connected")
                except OSError as e:
                    pass
            """),
            outputs=["connected"],
        ),
        "write_outside": Case(
            d(f"""\
            import os
            for path in {WRITE_TARGETS!r} + [os.path.expanduser("~/{TAG}")]:
                try:
                    with open(path, "w") as f:
                        f.write("escaped")
                    print(path, "OK")
                except OSError as e:
                    print(path, type(e).__name__)
            """),
            outputs=["all written"],
        ),
        "read_secret": Case(
            d(f"""\
            import os, re, sys
            pattern = re.compile(rb"{SECRET_PREFIX}[0-9a-f]{{32}}")
            skip = {{"/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/lib32", "/libx32",
                    "/bin", "/sbin", sys.base_prefix}}
            found, scanned = set(), 0
            for value in os.environ.values():
                found.update(pattern.findall(value.encode()))
            for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
                for part in ("environ", "cmdline"):
                    try:
                        found.update(pattern.findall(open(f"/proc/{{pid}}/{{part}}", "rb").read()))
                    except OSError:
                        pass
            for top, dirs, files in os.walk("/"):
                dirs[:] = [x for x in dirs if os.path.join(top, x) not in skip]
                for name in files:
                    path = os.path.join(top, name)
                    try:
                        if os.path.getsize(path) < 1 << 20:
                            found.update(pattern.findall(open(path, "rb").read()))
                            scanned += 1
                    except OSError:
                        pass
            print(b" ".join(sorted(found)).decode() or "none")
            print(scanned)
            """),
            outputs=[secret],
        ),
        "list_proc": Case(
            d("""\
            import os
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
            cmdlines = []
            for p in pids:
                try:
                    cmdlines.append(open(f"/proc/{p}/cmdline", "rb").read())
                except OSError:
                    pass
            print(len(pids), any(b"pytest" in c for c in cmdlines))
            """),
            outputs=["many True"],
        ),
        "list_project": Case(
            f"import os\nprint(*sorted(os.listdir({str(PROJECT)!r})))",
            outputs=[" ".join(sorted(os.listdir(PROJECT)))],
        ),
        "exit_0_before_print": Case("import sys\nsys.exit(0)\nprint('expected answer')"),
        "os_exit_0_before_print": Case("import os\nos._exit(0)\nprint('expected answer')"),
        "sigkill_self": Case("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
        "kill_parent": Case(
            d("""\
            import os, signal, time
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(0.1)
            print("alive")
            """)
        ),
        "signal_pid_1": Case(
            d("""\
            import os, signal, time
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                        signal.SIGQUIT, signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(1, sig)
                except OSError:
                    pass
            time.sleep(0.2)
            print("alive")
            """)
        ),
        "kill_everything": Case(
            d("""\
            import os, signal, time
            try:
                os.kill(-1, signal.SIGKILL)  # every process it can see but PID 1 and itself
            except ProcessLookupError:
                pass  # there were none
            time.sleep(0.1)
            print("alive")
            """)
        ),
        "patch_builtins": Case(
            d("""\
            import builtins
            if getattr(builtins, "cobalt_patched", False):
                print("leaked")
            else:
                builtins.cobalt_patched = True
                print("fresh")
                builtins.print = lambda *args, **kwargs: None
                builtins.input = lambda *args: "patched"
                builtins.int = str
            """),
            inputs=["", ""],
            outputs=["fresh", "fresh"],
        ),
        "eq_always_true": Case(
            d("""\
            class Liar:
                def __eq__(self, other):
                    return True
            class Solution:
                def solve(self, x):
                    return Liar()
            """),
            inputs=["1"],
            outputs=["5"],
            fn_name="solve",
        ),
        "int_subclass_eq_always_true": Case(
            d("""\
            class Liar(int):
                def __eq__(self, other):
                    return True
                __hash__ = int.__hash__
                def __repr__(self):
                    return "5"
                __str__ = __repr__
            def solve(x):
                return Liar(0)
            """),
            inputs=["1"],
            outputs=["5"],
            fn_name="solve",
        ),
        "close_stdout_after_print": Case("import os\nprint('expected answer')\nos.close(1)"),
        "close_stdout_before_print": Case("import os\nos.close(1)\nprint('expected answer')"),
        "close_stdout_empty_expected": Case("import os\nos.close(1)", outputs=[""]),
        "non_utf8_output": Case("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')"),
        "syntax_error": Case("def broken(:\n    pass"),
        "syntax_null_byte": Case("print(1)\0"),
        "syntax_deep_nesting": Case("x = " + "(" * 5000 + "1" + ")" * 5000),
        "syntax_long_unary_chain": Case("print(" + "-" * 200_000 + "1)"),
        "fifo_as_stdout": Case(
            "import os\nos.remove('/tmp/io/stdout')\nos.mkfifo('/tmp/io/stdout')\nprint('x')"
        ),
        "read_past_stdin": Case("a = input()\nb = input()\nprint(a, b)"),
        # one memory limit for the whole sandbox, whatever holds the memory
        "memory_memfd": Case(
            d("""\
            import os
            chunk, fds = b"x" * (7 << 20), []  # each file under the file size limit (8 MiB)
            for _ in range(230):  # 1.6 GiB
                fds.append(os.memfd_create("x"))
                os.write(fds[-1], chunk)
            print("held")
            """),
            outputs=["held"],
        ),
        "memory_processes": Case(
            HOLD + "hold(3, lambda: globals().update(block=b'x' * (200 << 20)))  # 600 MiB\n",
            outputs=["held"],
        ),
        "memory_shared": Case(
            SYSCALLS
            + HOLD
            + d("""\
            def attach():
                shm = libc.shmget(0, 150 << 20, 0o1600)
                if shm < 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                ctypes.memset(libc.shmat(shm, None, 0), 1, 150 << 20)
            hold(4, attach)  # 600 MiB, 150 MiB per process
            """),
            outputs=["held"],
        ),
        # one CPU, whatever the test asks for
        "cpu_repin": Case(
            d("""\
            import os
            try:
                os.sched_setaffinity(0, range(1024))
            except OSError as e:
                print("refused:", e)
            print(len(os.sched_getaffinity(0)))
            """),
            outputs=["1"],
        ),
        # what a sandboxed test never needs and the kernel should not be exposed to
        "forbidden_syscalls": Case(
            SYSCALLS
            + d("""\
            buf = ctypes.create_string_buffer(256)
            allowed = []
            for name, nr in NR.items():
                if libc.syscall(nr, 0, buf, 0, 0, 0) != -1 or ctypes.get_errno() != 1:  # EPERM
                    allowed.append(name)
            print(*allowed or ["none"])
            """),
            outputs=["none"],
        ),
        "ipc_between_tests": Case(
            IPC
            + d("""\
            if kinds := found():
                print("leaked:", *kinds)
            else:
                leave()
                print("fresh")
            """),
            inputs=["", ""],
            outputs=["fresh", "fresh"],
        ),
    }


@dataclass
class Batch:
    verdicts: dict[str, Verdict]
    secret: str
    connections: list
    healthy: Verdict
    healthy_seconds: float
    mem_before: int
    mem_lowest: int
    escaped_files: list[str]
    leftovers_on_host: list[str]
    runners_on_host: int
    key_users: list[int]
    requests: dict[str, JudgeRequest]
    judge: SyncJudge


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no MemAvailable in /proc/meminfo")


def key_users() -> list[int]:
    """Uids of this process's block of namespace-worker uids that hold keys in the host kernel
    (/proc/key-users: "uid: usage nkeys/nikeys ...")."""
    first = BASE_UID + (os.getpid() % 65536) * 256
    uids = []
    for line in Path("/proc/key-users").read_text().splitlines():
        uid = int(line.split(":")[0])
        if first <= uid < first + 256:
            uids.append(uid)
    return uids


def host_ips() -> list[str]:
    ips = {"127.0.0.1", "172.17.0.1"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
            ips.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(ips)


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid: (uid, parent pid, name) of every process of this host."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        table[int(pid)] = (
            int(fields["Uid"].split()[0]),
            int(fields["PPid"]),
            fields["Name"].strip(),
        )
    return table


def our_runners(table: dict[int, tuple[int, int, str]]) -> set[int]:
    """Runner processes of this test session's pools (other sessions on the host have their own):
    namespace runners are our descendants running as a jail user (61000+) under a parent that is
    not one; docker runners are PID 1 of the containers labelled with our pid."""

    def ancestors(pid: int):
        while pid in table and pid > 1:
            pid = table[pid][1]
            yield pid

    me = os.getpid()
    runners = {
        pid
        for pid, (uid, ppid, _) in table.items()
        if BASE_UID <= uid < BASE_UID + (1 << 24)
        and ppid in table
        and table[ppid][0] < 61000
        and me in ancestors(pid)
    }
    try:
        import docker

        from sandbox.backends.docker import LABEL

        client = docker.from_env()
        owner = f"{LABEL}={socket.gethostname()}:{me}"
        runners |= {
            c.attrs["State"]["Pid"]
            for c in client.containers.list(filters={"label": owner}, ignore_removed=True)
        }
    except Exception:  # no engine: no docker runners
        pass
    runners.discard(0)  # a container that is stopping has no process any more
    return runners


def sandboxed_processes() -> list[str]:
    """Processes still running that programs of this session started: descendants of a runner
    (an idle runner has none: a test's process is forked when the test starts)."""
    table = process_table()
    runners = our_runners(table)
    left = []
    for pid, (_, ppid, name) in table.items():
        parent = ppid
        while parent in table and parent > 1 and parent not in runners:
            parent = table[parent][1]
        if parent in runners:
            left.append(f"pid {pid} {name} (runner {parent})")
    return left


@pytest.fixture(scope="module")
def batch(backend, judges, tmp_path_factory) -> Batch:
    secret = SECRET_PREFIX + secrets.token_hex(16)
    (tmp_path_factory.mktemp("secret") / "expected_outputs.txt").write_text(secret)
    listener = socket.create_server(("0.0.0.0", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    programs = cases(port, host_ips(), secret)
    requests = [
        JudgeRequest(
            id=name, code=c.code, tests=Suite(inputs=c.inputs, outputs=c.outputs, fn_name=c.fn_name)
        )
        for name, c in programs.items()
    ]
    lowest, stop = [mem_available()], threading.Event()

    def watch_memory() -> None:
        while not stop.wait(0.02):
            lowest[0] = min(lowest[0], mem_available())

    with pytest.MonkeyPatch.context() as env:
        env.setenv("COBALT_TEST_SECRET", secret)  # as if the host held credentials
        judge = judges(backend, concurrency=CONCURRENCY, **LIMITS)
        mem_before = lowest[0] = mem_available()
        watcher = threading.Thread(target=watch_memory, daemon=True)
        watcher.start()
        try:
            verdicts = judge.judge_many(requests)
        finally:
            stop.set()
            watcher.join()
        start = time.perf_counter()
        healthy = judge.judge(
            JudgeRequest(id="after", code=DOUBLE, tests=Suite(inputs=["21\n"], outputs=["42"]))
        )
        healthy_seconds = time.perf_counter() - start
    connections = []
    try:
        connections.append(listener.accept())
    except BlockingIOError:
        pass
    listener.close()
    escaped = [p for p in [*WRITE_TARGETS, os.path.expanduser(f"~/{TAG}")] if os.path.exists(p)]
    for path in escaped:
        os.remove(path)
    return Batch(
        {v.id: v for v in verdicts},
        secret,
        connections,
        healthy,
        healthy_seconds,
        mem_before,
        lowest[0],
        escaped,
        sandboxed_processes(),
        len(our_runners(process_table())),
        key_users(),
        {r.id: r for r in requests},
        judge,
    )


def output_of(verdict: Verdict, test: int = 0) -> str:
    """The program's output as the wrong-answer report shows it."""
    report = verdict.feedback[test]
    assert "Program output:\n" in report, report
    shown = report.split("Program output:\n", 1)[1].rsplit("\nExpected output:\n", 1)[0]
    return shown.removesuffix("\n")


def outcome(batch: Batch, name: str) -> str:
    verdict = batch.verdicts[name]
    assert not verdict.accepted and not any(verdict.passed), (name, verdict.feedback)
    return verdict.outcomes[0]


# -- the pool and the host afterwards ------------------------------------------------------------


def test_no_hostile_program_breaks_the_sandbox(batch):
    errors = {k: v.feedback for k, v in batch.verdicts.items() if "sandbox_error" in v.outcomes}
    assert not errors


def test_pool_judges_a_normal_program_within_a_second_after_the_batch(batch):
    assert batch.healthy.status == "accepted", batch.healthy.feedback
    assert batch.healthy_seconds < 1.0


def test_no_sandboxed_process_survives_the_batch(batch):
    assert batch.runners_on_host >= 1  # the check sees the runners whose children it looks for
    assert batch.leftovers_on_host == []


def test_host_memory_did_not_collapse(batch):
    budget = CONCURRENCY * Limits(**LIMITS).worker_memory_mb << 20  # what the workers may hold
    assert batch.mem_before - batch.mem_lowest < budget + (1 << 30)


def test_no_key_reached_the_host_kernel(batch):
    assert batch.key_users == []


# -- time, processes, memory, output -------------------------------------------------------------


@pytest.mark.parametrize("name", ["infinite_loop", "sleep"])
def test_endless_programs_time_out(batch, name):
    assert outcome(batch, name) == "timeout"
    assert f"time limit of {LIMITS['timeout_s']:g} seconds" in batch.verdicts[name].feedback[0]
    assert batch.verdicts[name].seconds < LIMITS["timeout_s"] + 1.5


def test_fork_bomb_is_stopped(batch):
    assert outcome(batch, "fork_bomb") in ("timeout", "runtime_error")


def test_thread_bomb_is_stopped_by_the_process_limit(batch):
    assert outcome(batch, "thread_bomb") == "runtime_error"
    assert "can't start new thread" in batch.verdicts["thread_bomb"].feedback[0]


@pytest.mark.parametrize("name", ["memory_bytearray", "memory_strings"])
def test_memory_bombs_hit_the_memory_limit(batch, name):
    status = outcome(batch, name)
    if status == "timeout":  # on a loaded host the allocations can outlast 2 s: once more, alone
        status = batch.judge.judge(batch.requests[name]).status
    assert status == "memory_limit"


@pytest.mark.parametrize("name", ["memory_memfd", "memory_processes"])
def test_memory_held_outside_the_address_space_hits_the_limit_of_the_sandbox(batch, name):
    """memfd files and several processes, each under its address-space limit, together beyond
    the sandbox's memory: the OOM killer takes the test, and the verdict says why."""
    status = outcome(batch, name)
    if status != "memory_limit":  # a loaded host: the parent gave up waiting first; once alone
        status = batch.judge.judge(batch.requests[name]).status
    assert status == "memory_limit", batch.verdicts[name].feedback


def test_shared_memory_is_bounded_by_the_sandbox(batch):
    status = outcome(batch, "memory_shared")
    feedback = batch.verdicts["memory_shared"].feedback[0]
    assert status == "memory_limit" or (
        status == "runtime_error" and "No space left on device" in feedback  # kernel.shmall
    ), feedback


def test_a_test_cannot_leave_its_cpu(batch):
    verdict = batch.verdicts["cpu_repin"]
    assert verdict.status == "accepted", verdict.feedback


def test_syscalls_a_test_never_needs_are_denied(batch):
    verdict = batch.verdicts["forbidden_syscalls"]
    assert verdict.status == "accepted", verdict.feedback  # else it names those let through


def test_ipc_objects_do_not_reach_the_next_test(batch):
    verdict = batch.verdicts["ipc_between_tests"]
    assert verdict.status == "accepted", verdict.feedback


@pytest.mark.parametrize("name", ["huge_output", "huge_stderr", "disk_fill"])
def test_huge_output_is_stopped_at_the_output_limit(batch, name):
    assert outcome(batch, name) == "output_limit"
    assert batch.verdicts[name].seconds < LIMITS["timeout_s"] + 1.5


def test_unbounded_recursion_is_a_runtime_error(batch):
    assert outcome(batch, "recursion_unbounded") == "runtime_error"
    assert "RecursionError" in batch.verdicts["recursion_unbounded"].feedback[0]


def test_c_stack_overflow_is_contained(batch):
    assert outcome(batch, "recursion_c_stack") in ("runtime_error", "memory_limit", "timeout")


def test_printing_a_100000_digit_integer_fails(batch):
    assert outcome(batch, "int_100000_digits") == "runtime_error"
    assert "Exceeds the limit (50000 digits)" in batch.verdicts["int_100000_digits"].feedback[0]


# -- network and files ---------------------------------------------------------------------------


def test_no_network_to_the_internet(batch):
    assert outcome(batch, "net_internet") == "runtime_error"


def test_no_network_to_the_host(batch):
    assert outcome(batch, "net_host") == "wrong_answer"
    assert batch.connections == []


def test_files_outside_the_sandbox_cannot_be_written(batch):
    assert outcome(batch, "write_outside") == "wrong_answer"
    attempts = output_of(batch.verdicts["write_outside"]).splitlines()
    assert len(attempts) == len(WRITE_TARGETS) + 1
    assert not [a for a in attempts if a.endswith(" OK")]
    assert batch.escaped_files == []


def test_expected_outputs_and_host_secrets_cannot_be_read(batch):
    assert outcome(batch, "read_secret") == "wrong_answer"  # the walk finished and found nothing
    found, scanned = output_of(batch.verdicts["read_secret"]).splitlines()
    assert found == "none"
    assert int(scanned) > 0


def test_host_processes_are_invisible(batch):
    if outcome(batch, "list_proc") == "wrong_answer":  # docker: the container's own /proc
        count, sees_pytest = output_of(batch.verdicts["list_proc"]).split()
        assert int(count) <= 4 and sees_pytest == "False"
    else:  # namespace: no /proc at all
        assert "FileNotFoundError" in batch.verdicts["list_proc"].feedback[0]


def test_project_directory_is_invisible(batch):
    assert outcome(batch, "list_project") == "runtime_error"
    assert "FileNotFoundError" in batch.verdicts["list_project"].feedback[0]


# -- exits, signals, stdout ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["exit_0_before_print", "os_exit_0_before_print"])
def test_exiting_before_printing_is_a_wrong_answer(batch, name):
    assert outcome(batch, name) == "wrong_answer"


def test_killing_itself_is_a_runtime_error(batch):
    assert outcome(batch, "sigkill_self") == "runtime_error"


@pytest.mark.parametrize("name", ["kill_parent", "signal_pid_1", "kill_everything"])
def test_runner_survives_signals_from_the_program(batch, name):
    assert outcome(batch, name) == "wrong_answer"
    assert output_of(batch.verdicts[name]) == "alive"


def test_patched_builtins_do_not_reach_the_next_test(batch):
    verdict = batch.verdicts["patch_builtins"]
    assert verdict.status == "accepted", verdict.feedback


def test_return_value_with_lying_eq_never_passes(batch):
    assert outcome(batch, "eq_always_true") == "runtime_error"
    assert "not JSON data" in batch.verdicts["eq_always_true"].feedback[0]


def test_int_subclass_with_lying_eq_is_compared_by_value(batch):
    assert outcome(batch, "int_subclass_eq_always_true") == "wrong_answer"
    assert "Returned value:\n0\n" in batch.verdicts["int_subclass_eq_always_true"].feedback[0]


@pytest.mark.parametrize("name", ["close_stdout_after_print", "close_stdout_before_print"])
def test_closing_stdout_loses_the_output_and_fails(batch, name):
    assert outcome(batch, name) == "runtime_error"


def test_closing_stdout_with_nothing_to_print_is_like_printing_nothing(batch):
    assert batch.verdicts["close_stdout_empty_expected"].status == "accepted"


def test_non_utf8_output_is_a_wrong_answer(batch):
    assert outcome(batch, "non_utf8_output") == "wrong_answer"
    assert output_of(batch.verdicts["non_utf8_output"]) == "\ufffd\ufffd"


@pytest.mark.parametrize(
    "name", ["syntax_error", "syntax_null_byte", "syntax_deep_nesting", "syntax_long_unary_chain"]
)
def test_programs_that_do_not_compile_are_syntax_errors(batch, name):
    assert outcome(batch, name) == "syntax_error"


def test_swapping_stdout_for_a_fifo_loses_the_output_without_blocking_the_runner(batch):
    assert outcome(batch, "fifo_as_stdout") == "wrong_answer"
    assert batch.verdicts["fifo_as_stdout"].seconds < LIMITS["timeout_s"]


def test_reading_past_the_end_of_stdin_is_a_runtime_error(batch):
    assert outcome(batch, "read_past_stdin") == "runtime_error"
    assert "EOFError" in batch.verdicts["read_past_stdin"].feedback[0]


# -- leftovers -----------------------------------------------------------------------------------

DAEMON = textwrap.dedent("""\
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                with open("/tmp/cobalt-daemon", "a") as f:
                    f.write("x")
                time.sleep(0.02)
        os._exit(0)
    print("done")
    """)
OBSERVER = textwrap.dedent("""\
    import os, time
    time.sleep(0.3)
    print("daemon alive" if os.path.exists("/tmp/cobalt-daemon") else "clean")
    """)


def test_leftover_daemon_is_killed_and_its_worker_replaced(backend, judges):
    judges(backend)  # skips here when the backend is unavailable

    async def scenario():
        config = SandboxConfig(
            backend=backend, concurrency=1, limits=Limits(timeout_s=2), use_server=False
        )
        async with Judge(config) as judge:
            suite = Suite(inputs=[""], outputs=["done"])
            daemon = await judge.judge(JudgeRequest(id="daemon", code=DAEMON, tests=suite))
            observer = await judge.judge(
                JudgeRequest(
                    id="observer", code=OBSERVER, tests=Suite(inputs=[""], outputs=["clean"])
                )
            )
            return daemon, observer, judge.pool.replaced, sandboxed_processes()

    daemon, observer, replaced, survivors = asyncio.run(scenario())
    assert daemon.status == "accepted"  # judged on its own output...
    assert replaced == 1  # ...but its worker was recycled
    assert observer.status == "accepted", observer.feedback
    assert survivors == []


LEAVER = IPC + "print(*leave())"
SEEKER = IPC + textwrap.dedent("""\
    kinds = found()
    block = b"x" * (150 << 20)  # the memory of what was left is back, too
    print(*kinds or ["clean"])
    """)


def test_a_program_starts_on_a_clean_worker(backend, judges):
    """A program that leaves IPC objects (and tries a key) on its worker, then an unrelated one
    on the same pool of one worker: it finds nothing, and has the memory it needs."""
    judges(backend)

    async def scenario():
        config = SandboxConfig(
            backend=backend,
            concurrency=1,
            limits=Limits(timeout_s=2, memory_mb=256),
            use_server=False,
        )
        async with Judge(config) as judge:
            leaver = await judge.judge(
                JudgeRequest(
                    id="leaver",
                    code=LEAVER,
                    tests=Suite(inputs=[""], outputs=["shm sem msg mqueue"]),
                )
            )
            seeker = await judge.judge(
                JudgeRequest(id="seeker", code=SEEKER, tests=Suite(inputs=[""], outputs=["clean"]))
            )
            return leaver, seeker, judge.pool.replaced

    leaver, seeker, replaced = asyncio.run(scenario())
    assert leaver.status == "accepted", leaver.feedback  # it made all but the key...
    assert replaced == 1  # ...and its worker was replaced, as the runner saw what it left
    assert seeker.status == "accepted", seeker.feedback


CHILD_SPINS = textwrap.dedent("""\
    import os, time
    if os.fork() == 0:  # burns CPU; its parent never waits for it
        end = time.process_time() + 0.6
        while time.process_time() < end:
            pass
        open("spun", "w").close()
        os._exit(0)
    end = time.monotonic() + 5
    while not os.path.exists("spun") and time.monotonic() < end:
        time.sleep(0.01)
    print("done")
    """)


def test_cpu_time_counts_every_process_of_the_test(backend, judges):
    """The runner's report (what the judge's timeout rule reads) counts a child the test never
    waited for: wait4 alone would show the parent's few milliseconds."""
    judges(backend)

    async def scenario():
        config = SandboxConfig(backend=backend, concurrency=1, use_server=False)
        async with Judge(config) as judge, judge.pool.worker() as worker:
            worker.tainted = True  # the child is left as a zombie: this worker goes afterwards
            run = {
                "op": "run",
                "seq": 1,
                "code": CHILD_SPINS,
                "fn_name": None,
                "limits": config.limits.for_runner(),
                "inputs": [""],
                "suite_s": 10,
                "fail_fast": False,
            }
            await worker.send(run, timeout=30)
            return [await worker.receive(timeout=30) for _ in range(2)]

    test, done = asyncio.run(scenario())
    assert test["stdout"] == "done\n" and done["done"]
    assert test["cpu"] >= 0.55


def test_host_environment_is_not_passed_into_the_sandbox(backend, judges, monkeypatch):
    judges(backend)
    secret = SECRET_PREFIX + secrets.token_hex(16)
    monkeypatch.setenv("COBALT_TEST_SECRET", secret)
    code = "import os\nprint(os.environ.get('COBALT_TEST_SECRET', 'unset'))"

    async def scenario():
        config = SandboxConfig(backend=backend, concurrency=1, use_server=False)
        async with Judge(config) as judge:
            return await judge.judge(
                JudgeRequest(id="env", code=code, tests=Suite(inputs=[""], outputs=[secret]))
            )

    verdict = asyncio.run(scenario())
    assert verdict.outcomes == ["wrong_answer"]
    assert output_of(verdict) == "unset"


@pytest.mark.skipif(os.getuid() != 0, reason="as root, namespace workers get uids of their own")
def test_namespace_pools_of_one_process_share_no_uid(judges):
    """RLIMIT_NPROC counts per uid: a fork bomb in one pool must not starve another (a server
    holds several pools)."""
    code = "import os, time\ntime.sleep(0.2)\nprint(os.getuid())"
    seen = []
    for limits in ({}, {"scratch_mb": 32}):
        judge = judges("namespace", **limits)
        requests = [
            JudgeRequest(id=str(i), code=code, tests=Suite(inputs=[""], outputs=["x"]))
            for i in range(6)
        ]
        seen.append({output_of(v) for v in judge.judge_many(requests)})
    assert len(seen[0]) == len(seen[1]) == 2  # both workers of each pool ran
    assert not seen[0] & seen[1]
    assert all(BASE_UID <= int(uid) < BASE_UID + (1 << 24) for uid in seen[0] | seen[1])


def test_jail_roots_of_a_killed_process_are_removed_by_the_next_backend(tmp_path, monkeypatch):
    """A process killed with live namespace workers never runs their cleanup; the next backend
    on the machine removes its empty jail roots and leaves a live process's alone."""
    import signal
    import subprocess
    import sys
    import tempfile

    from sandbox.backends.namespace import NamespaceBackend

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from sandbox import SandboxConfig, SyncJudge\n"
            "judge = SyncJudge(SandboxConfig(backend='namespace', concurrency=2, use_server=False))\n"
            "judge.__enter__()\n"
            "print('ready', flush=True)\n"
            "import time; time.sleep(60)\n",
        ],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left and all(name.startswith(f"cobalt-jail-{holder.pid}-") for name in left), left
    live = tmp_path / f"cobalt-jail-{os.getpid()}-x"
    live.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    NamespaceBackend(Limits(), cgroup="off")
    assert [p.name for p in tmp_path.iterdir()] == [live.name]
