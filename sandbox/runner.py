"""The runner that lives inside a sandbox (a Docker container or a namespace jail).

Standard library only, Python 3.11+: it runs on the sandbox image's bare interpreter, started as
``python3 -I -S -c <this file's source> <json settings>``. It never sees expected outputs and
decides no verdicts; it executes and reports. The trusted parent compares outputs.
Long module: it is sent into the sandbox as one `-c` source (after `confine.py`'s, see
`runner_source.py`), so it stays one file.

Protocol: one JSON object per line on stdin, JSON lines back on stdout.

* ``{"op": "run", "seq", "code", "fn_name", "limits", "inputs", "suite_s", "fail_fast"}`` runs one
  program on every input, in order. It compiles the program once (a syntax error ends the run:
  ``{"seq", "compile_error", "done": true}``), then for each input forks a fresh process from this
  warm interpreter, runs the program on it under rlimits and streams one reply per test:
  ``{"seq", "test": i, "timeout_s", "exit", "signal", "timeout", "wall", "cpu", "stdout",
  "stderr", "result", "leftover", "ipc", "clean", "oom", ...}``. The run ends with
  ``{"seq", "done": true, "ran": k, "reason"}``: ``reason`` is null (every test ran), ``"time"``
  (the ``suite_s`` seconds, counted from receipt, ran out: the remaining tests were not started;
  a test's timeout is cut to what is left), ``"failed"`` (``fail_fast``: a test exited non-zero,
  was killed or timed out, which fails it whatever it printed) or ``"stopped"``;
* ``{"op": "stop", "seq"}`` stops run ``seq`` (the host found a wrong answer under fail_fast):
  the test running is killed and not reported; a stop for a run that has ended is ignored;
* ``{"op": "ping"}`` replies ``{"ok": true}``.

As PID 1 of its own PID namespace the runner cannot be killed from inside, and after each test it
kills every other process in the namespace (leftover daemons included), wipes the scratch dir and
removes the IPC objects (System V, POSIX message queues) the test left, so no state survives from
one test to the next. The next test's process is forked only after that. The CPU time it reports
is that of every process of the test (the cgroup's, where it has one: `confine.Accounting`).
"""

import _signal
import builtins
import collections
import gc
import io
import json
import linecache
import os
import resource
import select
import shutil
import signal
import stat
import sys
import time
import traceback

from sandbox import confine  # inside the sandbox: its source, inlined (runner_source.py)

# LiveCodeBench's order: `from builtins import *` undoes math.pow, operator.pow and re.compile.
PRELUDE_MODULES = [
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
    "builtins",
    "typing",
]
PROGRAM_FILE = "solution.py"
RECURSION_LIMIT = 50_000
INT_DIGITS_LIMIT = 50_000
STDERR_KEEP = 64 * 1024
ARGV = [PROGRAM_FILE]
CHILD_SIGNALS = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ)
BATCH_S = 0.005  # replies of quick tests are sent together, at most this late
OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def prelude_globals():
    """Globals of a fresh ``__main__`` after ``import m; from m import *`` of every prelude module."""
    g = {"__name__": "__main__", "__builtins__": builtins}
    for name in PRELUDE_MODULES:
        module = __import__(name)
        if name != "builtins":  # star-imported only, as LiveCodeBench does
            g[name] = module
        public = getattr(module, "__all__", None)
        if public is None:
            public = [k for k in vars(module) if not k.startswith("_")]
        for key in public:
            if hasattr(module, key):
                g[key] = getattr(module, key)
    g.setdefault("quit", sys.exit)  # `site` (off under -S) would define exit() and quit()
    return g


# --------------------------------------------------------------------------------------------
# The runner's own protection (the jail and the seccomp filter are `confine`'s).


def harden():
    """No privilege gain through exec, and no ptrace or /proc access to this process."""
    confine._libc.prctl(confine.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    confine._libc.prctl(confine.PR_SET_DUMPABLE, 0, 0, 0, 0)
    # PID 1 gets only the signals it handles: Python's SIGINT handler would let a test's
    # os.kill(1, SIGINT) end the runner. Tests restore the default (see `_child`).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# --------------------------------------------------------------------------------------------
# The channel to the host.


class Channel:
    """JSON lines from the host on `rfd`, replies on `wfd`. While a test runs the runner watches
    for a `stop`, so messages are read ahead and queue here until taken."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd = rfd, wfd
        self.buffer = bytearray()
        self.messages = collections.deque()
        self.eof = False
        self.held = b""  # replies not written yet (see `hold`)
        self.held_since = 0.0

    def fill(self):
        """Read what the host sent (blocks until something arrives)."""
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            self.eof = True
            return
        start = len(self.buffer)  # the buffer held no newline before this chunk
        self.buffer += chunk
        end = self.buffer.find(b"\n", start)
        while end >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            if line.strip():
                self.messages.append(_parse(line))
            end = self.buffer.find(b"\n")

    def drain(self):
        """Read what has arrived, without blocking."""
        while not self.eof and select.select([self.rfd], [], [], 0)[0]:
            self.fill()

    def next(self):
        """The next message (blocking), or None at the end of input."""
        while not self.messages and not self.eof:
            self.fill()
        return self.messages.popleft() if self.messages else None

    def stop_requested(self, seq):
        """Whether the host asked to stop run `seq` or went away. Stale stops are dropped."""
        stop = self.eof
        if any(m.get("op") == "stop" for m in self.messages):
            kept = collections.deque()
            for m in self.messages:
                if m.get("op") == "stop":
                    stop = stop or m.get("seq") == seq
                else:
                    kept.append(m)
            self.messages = kept
        return stop

    def send(self, *replies):
        self.write(b"".join(json.dumps(r).encode() + b"\n" for r in replies))

    def hold(self, reply):
        """Keep a reply to write later, with others: `flush` writes them in one go."""
        if not self.held:
            self.held_since = time.monotonic()
        self.held += json.dumps(reply).encode() + b"\n"

    def flush(self, *replies):
        data = self.held + b"".join(json.dumps(r).encode() + b"\n" for r in replies)
        self.held = b""
        if data:
            self.write(data)

    def flush_due(self):
        """When the held replies must go out: BATCH_S after the first of them (or None)."""
        return self.held_since + BATCH_S if self.held else None

    def write(self, data):
        data = memoryview(data)
        while data:
            data = data[os.write(self.wfd, data) :]


def _parse(line):
    try:
        msg = json.loads(line)
    except ValueError as e:
        return {"op": "invalid", "error": f"not JSON: {e}"}
    return msg if isinstance(msg, dict) else {"op": "invalid", "error": "not an object"}


# --------------------------------------------------------------------------------------------
# Running a program's tests.


class Runner:
    def __init__(self, workdir, accounting=None, sweep_ipc=False):
        self.workdir = workdir
        self.accounting = accounting or confine.Accounting({})
        self.sweep_ipc = sweep_ipc  # only in an IPC namespace of its own: it removes them all
        self.scratch = os.path.join(workdir, "work")
        self.iodir = os.path.join(workdir, "io")
        for d in (self.scratch, self.iodir):
            os.makedirs(d, exist_ok=True)
        self.files = {
            k: os.path.join(self.iodir, k) for k in ("stdin", "stdout", "stderr", "result")
        }
        self.globals = prelude_globals()
        # Made once here rather than in each test's process (see `_standard_streams`).
        self.streams = _standard_streams(workdir)
        # The interpreter's own streams stay referenced: a test's process that replaces them
        # must not pay for finalizing them.
        self._interpreter_streams = (sys.stdin, sys.stdout, sys.stderr)
        self.globals.update(
            zip(("stdin", "stdout", "stderr"), self.streams, strict=True), argv=ARGV
        )
        sys.setrecursionlimit(RECURSION_LIMIT)
        sys.set_int_max_str_digits(INT_DIGITS_LIMIT)
        self.code = None
        self.fn_name = None
        self.limits = {}
        self.batch = False  # gather replies (see `run`)
        self.is_init = os.getpid() == 1

    # -- program ------------------------------------------------------------------------------
    def load(self, source, fn_name):
        """Compile a program; None, or the syntax error's report."""
        self.code, self.fn_name = None, fn_name
        try:
            try:
                self.code = compile(source, PROGRAM_FILE, "exec", dont_inherit=True)
            except SyntaxError as e:
                if "'return' outside function" not in str(e):
                    raise
                self.code = compile(
                    _returns_to_exits(source), PROGRAM_FILE, "exec", dont_inherit=True
                )
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
            return "".join(traceback.format_exception_only(type(e), e))
        linecache.cache[PROGRAM_FILE] = (len(source), None, source.splitlines(True), PROGRAM_FILE)
        return None

    def run(self, msg, channel):
        """Run one program on each of its inputs, one fresh process per test, and stream a reply
        per test and then `done` (see the module docstring)."""
        seq = msg.get("seq")
        deadline = time.monotonic() + float(msg["suite_s"])
        self.limits = msg["limits"]
        error = self.load(msg["code"], msg.get("fn_name"))
        if error is not None:
            channel.send({"seq": seq, "compile_error": error, "done": True})
            return
        inputs, fail_fast = msg["inputs"], bool(msg.get("fail_fast"))
        done = {"seq": seq, "done": True, "ran": 0, "reason": None}
        # Replies are written while the next test runs (off its critical path) and, unless the
        # host may have to stop us (fail_fast), gathered for up to BATCH_S into one write.
        self.batch = not fail_fast
        for i, test_input in enumerate(inputs):
            timeout = min(float(self.limits["timeout_s"]), deadline - time.monotonic())
            if timeout <= 0:
                done["reason"] = "time"
                break
            channel.drain()
            if channel.stop_requested(seq):
                done["reason"] = "stopped"
                break
            reply = self.run_test(test_input, timeout, channel, seq)
            if reply is None:  # stopped while it ran: killed, not reported
                done.update(reason="stopped", **self._clean_up())
                break
            done["ran"] += 1
            reply.update(seq=seq, test=i, timeout_s=timeout, **self._clean_up())
            channel.hold(reply)
            if fail_fast and _certain_failure(reply):
                done["reason"] = "failed"
                break
        channel.flush(done)

    # -- test ---------------------------------------------------------------------------------
    def fork_test(self, rlimits):
        """Fork the test's process: it sets itself up (signals, session, rlimits, OOM score,
        io files) and runs the program at once: nothing to wait for, no extra wake-up."""
        pid = os.fork()
        if pid == 0:
            try:
                self._child(rlimits)
            finally:
                os._exit(70)
        return pid

    def _rlimits(self, timeout):
        lim = self.limits
        memory = int(lim["memory_mb"]) << 20
        stack = min(memory, 256 << 20)
        output = int(lim["output_bytes"]) + 1
        cpu = int(timeout) + 1
        rlimits = [
            (resource.RLIMIT_AS, (memory, memory)),
            (resource.RLIMIT_FSIZE, (output, output)),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_NOFILE, (256, 256)),
            (resource.RLIMIT_STACK, (stack, stack)),
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        ]
        if lim.get("nproc"):
            rlimits.append((resource.RLIMIT_NPROC, (int(lim["nproc"]), int(lim["nproc"]))))
        return rlimits

    def run_test(self, test_input, timeout, channel, seq):
        """Run one test in a fresh process: what it did, or None if the host stopped the run
        meanwhile (the process is killed, and its leftovers too). Replies held by the channel
        are written while it runs."""
        self.call_input = test_input if self.fn_name else ""
        fd = os.open(self.files["stdin"], OUTPUT_FLAGS, 0o600)
        try:
            data = memoryview(b"" if self.fn_name else test_input.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        rlimits = self._rlimits(timeout)
        before = self.accounting.sample()
        start = time.perf_counter()  # the test's time includes its process's set-up (< 1 ms)
        pid = self.fork_test(rlimits)
        fd = os.pidfd_open(pid)
        if not self.batch or (channel.held and time.monotonic() >= channel.flush_due()):
            channel.flush()
        try:
            timed_out, stopped = self._wait(fd, start + timeout, channel, seq)
        finally:
            os.close(fd)
        if timed_out or stopped:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - start
        leftover = self._kill_leftovers(pid)
        if stopped:
            return None
        # every process of the test, waited for or not (the cgroup's), else the one we waited for
        group_cpu, oom = confine.Accounting.since(before, self.accounting.sample())
        cpu = max(usage.ru_utime + usage.ru_stime, group_cpu or 0.0)
        reply = {
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "timeout": timed_out or cpu > timeout,
            "wall": wall,
            "cpu": cpu,
            "max_rss_kb": usage.ru_maxrss,
            "oom": oom,
            "leftover": leftover,
        }
        cap = int(self.limits["output_bytes"])
        out = self._read(self.files["stdout"], cap)
        reply["stdout"] = out[:cap].decode("utf-8", "replace")
        reply["stdout_truncated"] = len(out) > cap
        reply["stderr"] = self._read(self.files["stderr"], STDERR_KEEP, tail=True).decode(
            "utf-8", "replace"
        )
        result = self._read(self.files["result"], cap + 1)
        reply["result"] = result.decode("utf-8", "replace") if result else None
        return reply

    @staticmethod
    def _wait(pidfd, end, channel, seq):
        """Wait for the test process to exit until `end` (perf_counter), watching the host for a
        stop and writing held replies when they are due: (timed out, stopped)."""
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not channel.eof:
            poller.register(channel.rfd, select.POLLIN)
        while True:
            left = end - time.perf_counter()
            if left <= 0:
                return True, False
            if channel.held:  # a slow test: its predecessors' replies go out meanwhile
                left = min(left, max(0.0, channel.flush_due() - time.monotonic()))
            events = poller.poll(left * 1000)
            if not events:
                channel.flush()
                continue
            for fd, _ in events:
                if fd == pidfd:
                    return False, False
            channel.fill()
            if channel.eof:
                poller.unregister(channel.rfd)
            if channel.stop_requested(seq):
                return False, True

    def _child(self, rlimits):
        # Runs in the test's fresh copy of the runner. Every page it writes costs a copy, so it
        # keeps to plain os calls: what can be made once is made in the runner (see __init__).
        for sig in CHILD_SIGNALS:
            _signal.signal(sig, _signal.SIG_DFL)
        os.setsid()
        os.closerange(0, 1 << 16)  # the host's channel above all: nothing of the runner's stays
        for which, value in rlimits:
            _setrlimit(which, value)
        confine._libc.prctl(confine.PR_SET_DUMPABLE, 1, 0, 0, 0)  # its own /proc, not the runner's
        try:  # the kernel's OOM killer takes the test, not the runner
            fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
            os.write(fd, b"1000")
            os.close(fd)
        except OSError:
            pass
        fds = [os.open(self.files["stdin"], os.O_RDONLY | os.O_NOFOLLOW)]
        for k in ("stdout", "stderr", "result"):  # new files in the freshly made io dir
            fds.append(os.open(self.files[k], OUTPUT_FLAGS, 0o600))
        for target, fd in enumerate(fds):  # the lowest free fds: normally 0-3 already
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        os.chdir(self.scratch)
        sys.stdin, sys.stdout, sys.stderr = self.streams
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = self.streams
        sys.argv = ARGV
        os._exit(self._execute(self.call_input))

    def _execute(self, test_input):
        g = self.globals  # this process is a copy: the runner's globals are the program's own
        code = 0
        try:
            exec(self.code, g)
            if self.fn_name:
                self._call(g, test_input)
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException as e:  # noqa: BLE001 - the program's own error, reported as stderr
            _print_user_traceback(e)
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - closed or broken stdout: output is what it is
                code = code or 1
        return code

    def _call(self, g, test_input):
        lines = [line for line in test_input.split("\n") if line.strip()]
        args = [json.loads(line) for line in lines]
        cls = g.get("Solution")
        if isinstance(cls, type) and hasattr(cls, self.fn_name):
            fn = getattr(cls(), self.fn_name)
        elif callable(g.get(self.fn_name)):
            fn = g[self.fn_name]
        else:
            raise NameError(
                f"function {self.fn_name!r} is not defined (neither "
                f"Solution().{self.fn_name} nor a top-level {self.fn_name})"
            )
        value = fn(*args)
        try:
            text = json.dumps(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"return value of {self.fn_name} is not JSON data: {e}") from None
        with io.FileIO(3, "w", closefd=False) as f:
            f.write(text.encode())

    # -- cleanup ------------------------------------------------------------------------------
    def _kill_leftovers(self, pid):
        """Kill what the test left behind: its session, and as PID 1 every process but us."""
        count = 0
        try:
            os.killpg(pid, signal.SIGKILL)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
        if self.is_init:
            try:
                os.kill(-1, 0)
                count += 1
                os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(-1, os.WNOHANG) == (0, 0):
                        time.sleep(0.001)
                except ChildProcessError:
                    break
        return count

    def _clean_up(self):
        """After a test: the scratch dir wiped, the IPC objects it left removed (counted: any is
        a leftover), and whether all of that succeeded."""
        clean, ipc = self._wipe_scratch(), 0
        if self.sweep_ipc:
            ipc, removed = confine.sweep_ipc()
            clean = clean and removed
        return {"clean": clean, "ipc": ipc}

    def _wipe_scratch(self):
        """Empty the whole writable tmpfs and make the scratch and io dirs anew: the test may
        have written, replaced or chmod-ed anything in it. False if that failed."""
        try:
            for name in os.listdir(self.workdir):
                path = os.path.join(self.workdir, name)
                try:
                    os.unlink(path)  # a file, a link, a FIFO...
                except IsADirectoryError:
                    _remove_dir(path)
            os.mkdir(self.scratch)
            os.mkdir(self.iodir)
            return True
        except OSError:
            return False

    @staticmethod
    def _read(path, limit, tail=False):
        """Up to `limit` bytes of an output file (`limit` + 1 to tell it was longer), or its last
        `limit` bytes; b"" unless it is a plain file: the test may have swapped in a FIFO (which
        would block the runner) or a link."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return b""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b""
            want = limit if tail else limit + 1
            if tail and st.st_size > limit:
                os.lseek(fd, st.st_size - limit, os.SEEK_SET)
            chunks = []
            while want > 0 and (chunk := os.read(fd, min(want, 1 << 20))):
                chunks.append(chunk)
                want -= len(chunk)
            return b"".join(chunks)
        except OSError:
            return b""
        finally:
            os.close(fd)


def _returns_to_exits(source):
    """Scripts written as a function body ('return' at top level, accepted by the APPS and
    LiveCodeBench judges, which wrap stdin programs in a function): each such `return` becomes
    `raise SystemExit`, which ends the program the same way and keeps module-level globals."""
    import ast

    tree = ast.parse(source, PROGRAM_FILE)

    class TopLevelReturns(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            return node

        visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

        def visit_Return(self, node):
            exit_call = ast.Raise(exc=ast.Name(id="SystemExit", ctx=ast.Load()), cause=None)
            return ast.copy_location(exit_call, node)

    return ast.fix_missing_locations(TopLevelReturns().visit(tree))


def _standard_streams(directory):
    """sys.stdin, sys.stdout and sys.stderr of the programs: text streams on fds 0, 1 and 2,
    which in a test's process are its io files. Made once, in the runner, while fds 0-2 are
    regular files at offset 0 as a test's are (so they behave exactly as streams made there);
    the runner never uses them, and each test's process gets them untouched."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    path = os.path.join(directory, ".streams")
    try:
        for target in (0, 1, 2):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, target)
            os.close(fd)
        stdin = io.TextIOWrapper(
            io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"
        )
        stdout = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16),
            encoding="utf-8",
            errors="backslashreplace",
        )
        stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            write_through=True,
        )
    finally:
        for target, fd in zip((0, 1, 2), saved, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.unlink(path)
    return stdin, stdout, stderr


def _remove_dir(path):
    try:
        os.rmdir(path)  # the scratch dir, usually: empty
    except OSError:
        try:  # the io dir, usually: a few plain files
            for name in os.listdir(path):
                os.unlink(os.path.join(path, name))
            os.rmdir(path)
        except OSError:  # more than that, or permissions the test took away

            def force(func, p, _exc):
                os.chmod(os.path.dirname(p), 0o700)
                if os.path.isdir(p) and not os.path.islink(p):
                    os.chmod(p, 0o700)
                func(p)

            os.chmod(path, 0o700)
            shutil.rmtree(path, onerror=force)


def _certain_failure(reply):
    """Whether a test failed whatever it printed (the host's rule: a pass needs exit 0, no
    timeout, no signal and no output past the cap), so fail_fast can stop without asking."""
    return reply["timeout"] or reply["exit"] != 0 or reply["stdout_truncated"]


def _setrlimit(which, value):
    try:
        resource.setrlimit(which, value)
    except (ValueError, OSError):  # above the hard limit we were given: clamp to it
        hard = resource.getrlimit(which)[1]
        resource.setrlimit(which, (min(value[0], hard) if hard >= 0 else value[0], hard))


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(exc):
    """Print the traceback with only the program's own frames (the runner's are noise)."""
    _trim_tracebacks(exc)
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    for t in _chain(te):
        t.stack = traceback.StackSummary.from_list(
            [f for f in t.stack if f.filename == PROGRAM_FILE]
        )
    try:
        sys.stderr.write("".join(te.format()))
    except BaseException:  # noqa: BLE001
        pass


def _trim_tracebacks(exc, keep=50):
    """Keep the outermost and innermost `keep` frames: the traceback module takes seconds (of the
    test's time limit) to format the ~50,000 frames of a RecursionError."""
    for e in _chain(exc):
        tbs, tb = [], e.__traceback__
        while tb is not None:
            tbs.append(tb)
            tb = tb.tb_next
        if len(tbs) > 2 * keep:
            tbs[keep - 1].tb_next = tbs[-keep]


def _chain(te):
    seen = set()
    while te is not None and id(te) not in seen:
        seen.add(id(te))
        yield te
        te = te.__cause__ or te.__context__


def serve(runner, channel):
    handlers = {
        "run": lambda msg: runner.run(msg, channel),
        "ping": lambda msg: channel.send({"ok": True}),
        "stop": lambda msg: None,  # for a run that has already ended
    }
    while (msg := channel.next()) is not None:
        try:
            handler = handlers.get(msg.get("op"))
            if handler is None:
                raise ValueError(msg.get("error") or f"unknown op {msg.get('op')!r}")
            handler(msg)
        except Exception as e:  # noqa: BLE001 - report; the host replaces this worker
            channel.send({"error": f"runner: {type(e).__name__}: {e}"})


def main():
    cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    channel = Channel(os.dup(0), os.dup(1))
    cgroup = cfg.get("cgroup") or {}
    confine.join_cgroups(cgroup.get("procs", ()))  # the namespace backend's (before the jail)
    if cfg.get("cpu") is not None:  # the namespace backend's pinning (Docker's: a cpuset)
        os.sched_setaffinity(0, {cfg["cpu"]})
    files = confine.own_accounting() if cgroup.get("own") else cgroup.get("accounting", {})
    accounting = confine.Accounting(files)
    if cfg.get("namespace"):
        confine.enter_namespace(cfg)
    harden()
    confine.install_seccomp()
    runner = Runner(cfg.get("workdir", "/tmp"), accounting, bool(cfg.get("ipc")))
    gc.freeze()
    channel.send({"ready": True, "pid": os.getpid(), "uid": os.getuid()})
    serve(runner, channel)


if __name__ == "__main__":
    main()
