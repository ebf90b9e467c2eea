"""Peer judges for the throughput benchmark, written in our own code after the peers' designs.

* `CobaltStyleJudge` (the Cobalt release's evaluator): every test gets a new
  `multiprocessing.Process`, which runs bubblewrap around a **fresh** `python3` interpreter (stdin
  fed, stdout captured, killed at the timeout); up to `concurrency` tests run at once; outputs are
  compared in the parent.
* `LcbStyleJudge` (LiveCodeBench's `check_correctness` / `run_test`): programs are spread over a
  `ProcessPoolExecutor` of `concurrency` workers; each program gets one `multiprocessing.Process`
  (and a `multiprocessing.Manager` list for its results, as upstream); that process runs all the
  program's tests **in-process**, one after another, with stdin/stdout swapped and a SIGALRM timer
  per test, after a LiveCodeBench-like `reliability_guard` (which is not a sandbox).

Both apply our verdict rules (the runner's standard-library prelude, top-level `return` accepted,
exit status 0 required, `sandbox.compare` for outputs) and run every test of every program (no
stop at the first failure), so they do the same work as our judge and a verdict that differs from
ours comes from how the program was executed, not from how its output was compared.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for_connections

from sandbox.compare import call_result_matches, stdout_matches
from sandbox.models import TestSuite
from sandbox.runner import PRELUDE_MODULES, prelude_globals

RECURSION_LIMIT = 50_000  # as LiveCodeBench's prelude and our runner
INT_DIGITS_LIMIT = 50_000
GRACE_S = 5.0  # beyond a test's timeout before the dispatching process itself is killed


@dataclass
class Program:
    """One program and its tests (the same `TestSuite` our judge takes)."""

    id: str
    code: str
    tests: TestSuite
    expected: bool | None = None  # the verdict the program should get (benchmark bookkeeping)


@dataclass
class PeerResult:
    """What a peer decided for one program, with when it started and finished (perf_counter)."""

    id: str
    outcomes: list[str]
    start: float = 0.0
    end: float = 0.0
    test_seconds: list[float] = field(default_factory=list)

    @property
    def passed(self) -> list[bool]:
        return [o == "passed" for o in self.outcomes]

    @property
    def accepted(self) -> bool:
        return bool(self.outcomes) and all(self.passed)

    @property
    def status(self) -> str:
        return next((o for o in self.outcomes if o != "passed"), "accepted")

    @property
    def seconds(self) -> float:
        return self.end - self.start


# ------------------------------------------------------------------------------------------------
# Shared by both peers (and sent, as source text, into the Cobalt-style sandbox).


class _TopLevelReturns(ast.NodeTransformer):
    """`return` at module level (accepted by APPS/LiveCodeBench judges) -> `raise SystemExit`."""

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Return(self, node):
        raise_exit = ast.Raise(exc=ast.Name(id="SystemExit", ctx=ast.Load()), cause=None)
        return ast.copy_location(raise_exit, node)


def compile_program(source):
    try:
        return compile(source, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        if "'return' outside function" not in str(e):
            raise
    tree = _TopLevelReturns().visit(ast.parse(source, "solution.py"))
    return compile(ast.fix_missing_locations(tree), "solution.py", "exec", dont_inherit=True)


def _exit_ok(exc: SystemExit) -> bool:
    return exc.code is None or exc.code == 0


# ------------------------------------------------------------------------------------------------
# Cobalt-style: a fresh bubblewrap + python3 per test, each dispatched by a new Process.

HARNESS = f"""\
import ast, builtins, json, sys
PRELUDE_MODULES = {PRELUDE_MODULES!r}
{inspect.getsource(prelude_globals)}
{inspect.getsource(_TopLevelReturns)}
{inspect.getsource(compile_program)}
def main():
    sys.setrecursionlimit({RECURSION_LIMIT})
    sys.set_int_max_str_digits({INT_DIGITS_LIMIT})
    fn_name = sys.argv[2] if len(sys.argv) > 2 else ""
    with open(sys.argv[1], encoding="utf-8") as f:
        code = compile_program(f.read())
    g = prelude_globals()
    if not fn_name:
        exec(code, g)
        return
    out, sys.stdout = sys.stdout, sys.stderr  # the program's prints must not mix with the result
    exec(code, g)
    args = [json.loads(line) for line in sys.stdin.read().split("\\n") if line.strip()]
    cls = g.get("Solution")
    if isinstance(cls, type) and hasattr(cls, fn_name):
        fn = getattr(cls(), fn_name)
    else:
        fn = g[fn_name]
    text = json.dumps(fn(*args))
    sys.stdout.flush()
    out.write(text)
    out.flush()

main()
"""

SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def _cobalt_test(conn, argv: list[str], stdin: bytes, timeout: float) -> None:
    """Target of the per-test Process: run one sandboxed interpreter, send back what it did."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, timeout=timeout, env=SANDBOX_ENV, check=False
        )
        reply = (proc.returncode, proc.stdout, proc.stderr[-4096:], False)
    except subprocess.TimeoutExpired:
        reply = (None, b"", b"", True)
    conn.send((*reply, time.perf_counter() - start))
    conn.close()


class CobaltStyleJudge:
    """Each test: new `multiprocessing.Process` -> `bwrap ... python3 harness.py program.py`."""

    name = "cobalt"

    def __init__(
        self,
        concurrency: int,
        timeout_s: float,
        python: str = "/usr/bin/python3",
        bwrap: str | None = None,
    ):
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.python = python
        self.bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self._dir: str | None = None
        self._ctx = multiprocessing.get_context("fork")

    @staticmethod
    def available() -> str | None:
        """None if the judge can run here, else why not."""
        if not shutil.which("bwrap"):
            return "bubblewrap (bwrap) is not installed"
        probe = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"],
            capture_output=True,
            check=False,
        )
        return None if probe.returncode == 0 else f"bwrap fails: {probe.stderr.decode()[:200]}"

    def __enter__(self) -> CobaltStyleJudge:
        self._dir = tempfile.mkdtemp(prefix="bench-cobalt-")
        with open(os.path.join(self._dir, "harness.py"), "w") as f:
            f.write(HARNESS)
        return self

    def __exit__(self, *exc) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _argv(self, program_dir: str, fn_name: str | None) -> list[str]:
        argv = [self.bwrap, "--ro-bind", "/usr", "/usr"]
        for d in ("/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"):
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
        argv += [
            "--ro-bind",
            os.path.join(self._dir, "harness.py"),
            "/judge/harness.py",
            "--ro-bind",
            program_dir,
            "/sol",
            "--tmpfs",
            "/tmp",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--chdir",
            "/tmp",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            self.python,
            "/judge/harness.py",
            "/sol/program.py",
        ]
        return [*argv, fn_name] if fn_name else argv

    def judge_many(
        self,
        programs: Sequence[Program],
        on_done: Callable[[int, PeerResult], None] | None = None,
        fail_fast: bool = False,
    ) -> list[PeerResult]:
        """With `fail_fast`, a program's tests not yet started when one fails are skipped."""
        assert self._dir, "use CobaltStyleJudge as a context manager"
        results, argvs, left = [], [], []
        for i, p in enumerate(programs):
            n = len(p.tests.inputs)
            results.append(PeerResult(p.id, ["skipped"] * n, test_seconds=[0.0] * n))
            program_dir = tempfile.mkdtemp(prefix=f"p{i}-", dir=self._dir)
            with open(os.path.join(program_dir, "program.py"), "w", encoding="utf-8") as f:
                f.write(p.code)
            argvs.append(self._argv(program_dir, p.tests.fn_name))
            left.append(n)
        queue = deque((i, t) for i, p in enumerate(programs) for t in range(len(p.tests.inputs)))
        running: dict = {}  # read end -> (process, program, test, start)

        failed: set[int] = set()

        def finish(conn, reply) -> None:
            proc, i, t, t0 = running.pop(conn)
            conn.close()
            proc.join(timeout=1 if reply is not None else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
            now = time.perf_counter()
            r = results[i]
            r.outcomes[t] = self._classify(programs[i].tests, t, reply)
            r.test_seconds[t] = now - t0
            r.end = max(r.end, now)
            if fail_fast and r.outcomes[t] != "passed":
                failed.add(i)
            count_down(i)

        def count_down(i: int) -> None:
            left[i] -= 1
            if left[i] == 0 and on_done is not None:
                on_done(i, results[i])

        for i, p in enumerate(programs):  # programs without tests are done at once
            if not p.tests.inputs:
                results[i].start = results[i].end = time.perf_counter()
        while queue or running:
            while queue and len(running) < self.concurrency:
                i, t = queue.popleft()
                if i in failed:  # fail_fast: never started
                    count_down(i)
                    continue
                p = programs[i]
                stdin = p.tests.inputs[t].encode()  # call-based: one JSON value per line
                read, write = self._ctx.Pipe(duplex=False)
                proc = self._ctx.Process(
                    target=_cobalt_test, daemon=True, args=(write, argvs[i], stdin, self.timeout_s)
                )
                t0 = time.perf_counter()
                if not results[i].start:
                    results[i].start = t0
                proc.start()
                write.close()
                running[read] = (proc, i, t, t0)
            if not running:
                continue
            soonest = min(v[3] for v in running.values()) + self.timeout_s + GRACE_S
            ready = wait_for_connections(list(running), max(0.0, soonest - time.perf_counter()))
            for conn in ready:
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    reply = None
                finish(conn, reply)
            now = time.perf_counter()
            for conn, (_, _, _, t0) in list(running.items()):
                if now - t0 > self.timeout_s + GRACE_S:
                    finish(conn, None)
        return results

    @staticmethod
    def _classify(tests: TestSuite, t: int, reply) -> str:
        if reply is None:
            return "sandbox_error"
        returncode, stdout, _stderr, timed_out, _wall = reply
        if timed_out:
            return "timeout"
        if returncode != 0:
            return "runtime_error"
        out = stdout.decode("utf-8", "replace")
        if tests.fn_name:
            ok = call_result_matches(out, tests.outputs[t])
        else:
            ok = stdout_matches(out, tests.outputs[t])
        return "passed" if ok else "wrong_answer"


# ------------------------------------------------------------------------------------------------
# LiveCodeBench-style: one Process per program, tests in-process with a SIGALRM timer each.


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def _reliability_guard() -> None:
    """LiveCodeBench's guard, in spirit: disable destructive functions. It is not a sandbox."""
    import builtins
    import faulthandler

    faulthandler.disable()
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in (
        "kill",
        "system",
        "putenv",
        "remove",
        "removedirs",
        "rmdir",
        "fchdir",
        "setuid",
        "fork",
        "forkpty",
        "killpg",
        "rename",
        "renames",
        "truncate",
        "replace",
        "unlink",
        "fchmod",
        "fchown",
        "chmod",
        "chown",
        "chroot",
        "lchown",
    ):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.help = None


def _run_stdin_test(code, base: dict, test_input: str, expected: str, timeout: float) -> str:
    stdin = io.TextIOWrapper(io.BytesIO(test_input.encode()), encoding="utf-8")
    buffer = io.BytesIO()
    stdout = io.TextIOWrapper(
        buffer, encoding="utf-8", errors="backslashreplace", write_through=True
    )
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, io.StringIO()
    status = None
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(code, dict(base))  # fresh module globals, like upstream's fresh function call
    except SystemExit as e:
        status = None if _exit_ok(e) else "runtime_error"
    except _Timeout:
        status = "timeout"
    except MemoryError:
        status = "memory_limit"
    except BaseException:  # the program's own error
        status = "runtime_error"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        with contextlib.suppress(Exception):
            stdout.flush()
        sys.stdin, sys.stdout, sys.stderr = saved
    if status:
        return status
    got = buffer.getvalue().decode("utf-8", "replace")
    return "passed" if stdout_matches(got, expected) else "wrong_answer"


def _run_call_tests(code, tests: TestSuite, timeout: float, fail_fast: bool) -> list[str]:
    n = len(tests.inputs)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()  # what the program prints is not its result
    try:
        g = prelude_globals()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            exec(code, g)
            cls = g.get("Solution")
            if isinstance(cls, type) and hasattr(cls, tests.fn_name):
                fn = getattr(cls(), tests.fn_name)
            else:
                fn = g[tests.fn_name]
        except BaseException:  # the program's own error
            return ["runtime_error"] * n
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        outcomes = []
        for test_input, expected in zip(tests.inputs, tests.outputs, strict=True):
            args = [json.loads(line) for line in test_input.split("\n") if line.strip()]
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                text = json.dumps(fn(*args))
                status = "passed" if call_result_matches(text, expected) else "wrong_answer"
            except _Timeout:
                status = "timeout"
            except SystemExit as e:
                status = "wrong_answer" if _exit_ok(e) else "runtime_error"
            except BaseException:  # the program's own error
                status = "runtime_error"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcomes.append(status)
            if fail_fast and status != "passed":  # upstream returns at the first failure
                break
        return outcomes + ["skipped"] * (n - len(outcomes))
    finally:
        sys.stdout, sys.stderr = saved


def _lcb_temp_run(code: str, tests: TestSuite, timeout: float, fail_fast: bool, result) -> None:
    """Target of the per-program Process (upstream: `_temp_run` -> `run_test`)."""
    signal.signal(signal.SIGALRM, _alarm)
    _reliability_guard()
    sys.setrecursionlimit(RECURSION_LIMIT)
    sys.set_int_max_str_digits(INT_DIGITS_LIMIT)
    n = len(tests.inputs)
    try:
        compiled = compile_program(code)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        result.append(["syntax_error"] * n)
        return
    if tests.fn_name:
        result.append(_run_call_tests(compiled, tests, timeout, fail_fast))
        return
    base = prelude_globals()
    outcomes = []
    for test_input, expected in zip(tests.inputs, tests.outputs, strict=True):
        outcomes.append(_run_stdin_test(compiled, base, test_input, expected, timeout))
        if fail_fast and outcomes[-1] != "passed":  # upstream returns at the first failure
            break
    result.append(outcomes + ["skipped"] * (n - len(outcomes)))


def _lcb_check_correctness(program: Program, timeout: float, fail_fast: bool) -> PeerResult:
    """Runs in a pool worker (upstream: `check_correctness`): Manager + Process + global timeout."""
    start = time.perf_counter()
    n = len(program.tests.inputs)
    with multiprocessing.Manager() as manager:
        result = manager.list()
        proc = multiprocessing.Process(
            target=_lcb_temp_run, args=(program.code, program.tests, timeout, fail_fast, result)
        )
        proc.start()
        proc.join(timeout=(timeout + 1) * n + 5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        outcomes = list(result[0]) if len(result) else ["sandbox_error"] * n
    return PeerResult(program.id, outcomes, start, time.perf_counter())


def _noop(i: int) -> int:
    return i


def _preload() -> None:
    """Pool worker start-up: upstream's testing_util imports numpy before any program runs (a
    program's own `import numpy` then finds it loaded, even after the guard)."""
    with contextlib.suppress(ImportError):
        import numpy  # noqa: F401


class LcbStyleJudge:
    """LiveCodeBench's dispatch: a pool of `concurrency` workers, one Process per program."""

    name = "lcb"

    def __init__(self, concurrency: int, timeout_s: float):
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LcbStyleJudge:
        self._pool = ProcessPoolExecutor(
            self.concurrency, initializer=_preload, mp_context=multiprocessing.get_context("fork")
        )
        list(self._pool.map(_noop, range(self.concurrency)))  # the workers are started
        return self

    def __exit__(self, *exc) -> None:
        if self._pool:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def judge_many(
        self,
        programs: Sequence[Program],
        on_done: Callable[[int, PeerResult], None] | None = None,
        fail_fast: bool = False,
    ) -> list[PeerResult]:
        """With `fail_fast`, a program stops at its first failing test (upstream's habit)."""
        assert self._pool, "use LcbStyleJudge as a context manager"
        futures = [
            self._pool.submit(_lcb_check_correctness, p, self.timeout_s, fail_fast)
            for p in programs
        ]
        results = []
        for i, future in enumerate(futures):
            results.append(future.result())
            if on_done is not None:
                on_done(i, results[-1])
        return results


# ------------------------------------------------------------------------------------------------
# As a whole process, the way a user runs a judge (start-up included):
#   python -m benchmarks.peers {cobalt,lcb} -i programs.jsonl -o verdicts.jsonl


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description="Judge the rows of `python -m sandbox judge` with a peer judge, as one process "
        "(for whole-process timings; rows in, one verdict row per program out, input order).",
    )
    parser.add_argument("judge", choices=["cobalt", "lcb"])
    parser.add_argument("--input", "-i", required=True, help="programs JSONL (JudgeRequest rows)")
    parser.add_argument("--output", "-o", required=True, help="verdicts JSONL")
    parser.add_argument("--concurrency", "-j", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds per test")
    parser.add_argument(
        "--fail-fast", action="store_true", help="stop at a program's first failure"
    )
    args = parser.parse_args(argv)
    programs = []
    with open(args.input, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                programs.append(Program(row["id"], row["code"], TestSuite(**row["tests"])))
    if args.judge == "cobalt":
        if why := CobaltStyleJudge.available():
            print(f"error: {why}", file=sys.stderr)
            return 3
        judge = CobaltStyleJudge(args.concurrency, args.timeout)
    else:
        judge = LcbStyleJudge(args.concurrency, args.timeout)
    with judge:
        results = judge.judge_many(programs, fail_fast=args.fail_fast)
    with open(args.output, "w", encoding="utf-8") as f:
        for r in results:
            row = {"id": r.id, "status": r.status, "passed": r.passed, "outcomes": r.outcomes}
            f.write(json.dumps(row | {"seconds": round(r.seconds, 4)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
