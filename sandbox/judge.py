"""Judging: run a program's tests in a sandbox worker and decide each verdict in this process.

`Judge` is the async API (many programs in flight, bounded by the pool size); `SyncJudge` wraps
it for synchronous callers (CLI, Prefect tasks) with an event loop on a background thread.

One program is one request to a worker: its code and every test input (never an expected output).
The runner streams back one reply per test; the judge classifies each as it arrives and, under
`fail_fast`, tells the runner to stop at the first wrong answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from sandbox.backends import make_backend
from sandbox.client import RemoteJudge, ServerGone, connect_server
from sandbox.compare import call_result_matches, stdout_matches
from sandbox.feedback import test_report
from sandbox.models import JudgeRequest, Limits, SandboxConfig, TestStatus, Verdict
from sandbox.pool import Backend, Worker, WorkerDied, WorkerPool

log = logging.getLogger(__name__)

REPLY_GRACE_S = 5.0  # beyond a test's own limit, before a silent worker counts as dead
COMPILE_S = 30.0  # for the runner to compile a program, before its first test


def classify(reply: dict, expected: str, fn_name: str | None, memory_bytes: int) -> TestStatus:
    """The status of one test from what the runner reported. Passing needs a clean exit 0 *and*
    matching output; any timeout, signal or non-zero exit fails whatever was printed."""
    stderr = reply.get("stderr", "")
    if reply["timeout"]:
        return "timeout"
    if reply["stdout_truncated"] or reply["signal"] == signal.SIGXFSZ:
        return "output_limit"
    if reply["exit"] != 0:
        near_limit = reply.get("max_rss_kb", 0) * 1024 >= 0.8 * memory_bytes
        killed_near_limit = reply["signal"] == signal.SIGKILL and near_limit
        if "MemoryError" in stderr or reply.get("oom") or killed_near_limit:
            return "memory_limit"
        return "runtime_error"
    if fn_name:
        matched = call_result_matches(reply.get("result"), expected)
    else:
        matched = stdout_matches(reply["stdout"], expected)
    return "passed" if matched else "wrong_answer"


class Judge:
    """Judges programs against tests in a pool of sandbox workers.

    Use as an async context manager; `judge_many` keeps `config.concurrency` programs in flight.
    When a sandbox server answers (`python -m sandbox serve`, see `SandboxConfig.use_server`) and
    no backend is given, programs go to its warm workers instead (`remote`); if it goes away, the
    judge carries on with workers of its own.
    """

    def __init__(self, config: SandboxConfig | None = None, backend: Backend | None = None):
        self.config = config or SandboxConfig()
        self._given_backend = backend
        self.backend: Backend | None = None
        self.pool: WorkerPool | None = None
        self.remote: RemoteJudge | None = None
        self._tried_server = backend is not None
        self._closed = False
        self._seq = itertools.count(1)
        self._start_lock = asyncio.Lock()

    async def __aenter__(self) -> Judge:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Connect to the sandbox server, or start a pool of our own: returns once one worker is
        ready (the others come up meanwhile)."""
        async with self._start_lock:
            if not self._tried_server:
                self._tried_server = True
                self.remote = await connect_server(self.config)
            if self.remote is None and self.pool is None:
                self.backend = self._given_backend or await asyncio.to_thread(
                    make_backend, self.config
                )
                self.pool = WorkerPool(
                    self.backend, self.config.concurrency, self.config.recycle_after
                )
        if self.pool is not None:
            await self.pool.start()

    async def _leave_server(self, error: ServerGone) -> None:
        async with self._start_lock:
            if self.remote is not None:
                log.warning("%s; judging with workers of our own from now on", error)
                await self.remote.aclose()
                self.remote = None

    async def aclose(self) -> None:
        self._closed = True
        if self.remote is not None:
            await self.remote.aclose()
        if self.pool is not None:
            await self.pool.close()

    @property
    def server(self) -> str | None:
        """The address of the sandbox server judging for us, or None (workers of our own)."""
        return self.remote.address if self.remote is not None else None

    @property
    def backend_name(self) -> str:
        if self.remote is not None:
            return self.remote.backend
        return self.backend.name if self.backend is not None else self.config.backend

    async def judge(self, request: JudgeRequest, fail_fast: bool = False) -> Verdict:
        """Judge one program. With `fail_fast`, tests after the first failure are skipped."""
        await self.start()
        limits = self.config.limits
        if self.remote is not None:
            try:
                return await self.remote.judge(request, fail_fast)
            except ServerGone as e:
                if self._closed:
                    raise
                await self._leave_server(e)
                await self.start()
        assert self.pool is not None
        n = len(request.tests.inputs)
        statuses: list[TestStatus | None] = [None] * n
        feedback = [""] * n
        async with self.pool.worker() as worker:
            start = time.perf_counter()  # waiting for a worker is not the program's time
            worker.programs += 1
            try:
                try:
                    await self._run(worker, request, fail_fast, limits, statuses, feedback)
                except (KeyError, TypeError, IndexError, ValueError) as e:
                    worker.tainted = True
                    raise WorkerDied(f"{worker.name}: malformed reply ({e!r})") from e
            except WorkerDied as e:
                stopped = fail_fast and any(s not in (None, "passed") for s in statuses)
                for i in range(n):
                    if statuses[i] is None:
                        statuses[i] = "skipped" if stopped else "sandbox_error"
                        feedback[i] = "" if stopped else f"The sandbox failed: {e}"
            except BaseException:
                worker.tainted = True  # interrupted mid-program: its replies were not all read
                raise
        return _verdict(request, statuses, feedback, start)

    async def _run(
        self,
        worker: Worker,
        request: JudgeRequest,
        fail_fast: bool,
        limits: Limits,
        statuses: list[TestStatus | None],
        feedback: list[str],
    ) -> None:
        """Send the program with all its inputs and decide each test as its reply streams in."""
        tests = request.tests
        n = len(tests.inputs)
        seq = next(self._seq)
        runner_limits = limits.for_runner()
        if worker.enforce_nproc:
            runner_limits["nproc"] = limits.max_processes
        message = {
            "op": "run",
            "seq": seq,
            "code": request.code,
            "fn_name": tests.fn_name,
            "limits": runner_limits,
            "inputs": tests.inputs,
            "suite_s": limits.suite_timeout_s,
            "fail_fast": fail_fast,
        }
        await worker.send(message, timeout=COMPILE_S)
        wait = COMPILE_S + limits.timeout_s + REPLY_GRACE_S
        failed_at: int | None = None  # fail_fast: the first failing test
        while True:
            reply = await worker.receive(timeout=wait)
            wait = limits.timeout_s + REPLY_GRACE_S
            if reply.get("seq") != seq:
                worker.tainted = True
                raise WorkerDied(f"{worker.name}: reply out of step ({reply!r:.200})")
            if "compile_error" in reply:
                report = test_report("syntax_error", "", "", stderr=reply["compile_error"])
                statuses[:] = ["syntax_error"] * n
                feedback[:] = [report] * n
                return
            if reply.get("leftover") or reply.get("ipc") or not reply.get("clean", True):
                worker.tainted = True  # something of the test outlived it: a fresh worker
            if "test" in reply and failed_at is None:
                i = reply["test"]
                statuses[i] = status = classify(
                    reply, tests.outputs[i], tests.fn_name, limits.memory_mb << 20
                )
                feedback[i] = test_report(
                    status,
                    tests.inputs[i],
                    tests.outputs[i],
                    reply.get("stdout", ""),
                    reply.get("stderr", ""),
                    reply.get("result"),
                    tests.fn_name,
                    reply["timeout_s"],
                    limits.output_bytes,
                )
                if fail_fast and status != "passed":
                    failed_at = i
                    if status == "wrong_answer" and i + 1 < n:  # the runner cannot tell that
                        await worker.send({"op": "stop", "seq": seq}, timeout=REPLY_GRACE_S)
            if reply.get("done"):
                if reply.get("reason") == "stopped" and failed_at is None:
                    raise WorkerDied(f"{worker.name}: the runner stopped unasked")
                out_of_time = reply.get("reason") == "time" and failed_at is None
                for i in range(n):
                    if statuses[i] is None:
                        statuses[i] = "skipped"
                        feedback[i] = _skipped_note("time") if out_of_time else ""
                return

    async def judge_many(
        self,
        requests: Iterable[JudgeRequest],
        fail_fast: bool = False,
        on_done: Callable[[int, Verdict], None] | None = None,
    ) -> list[Verdict]:
        """Judge many programs concurrently; results in input order. `on_done(index, verdict)` is
        called as each finishes (for progress bars and streaming writers)."""
        requests = list(requests)

        async def one(i: int, request: JudgeRequest) -> Verdict:
            verdict = await self.judge(request, fail_fast=fail_fast)
            if on_done is not None:
                on_done(i, verdict)
            return verdict

        tasks = [asyncio.ensure_future(one(i, r)) for i, r in enumerate(requests)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:  # one failed (no sandbox at all) or we were cancelled: stop the rest
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise


def _skipped_note(reason: str) -> str:
    if reason == "time":
        return "This test was not run: the time for the whole test suite ran out."
    return ""


def _verdict(
    request: JudgeRequest, statuses: Sequence[TestStatus], feedback: list[str], start: float
) -> Verdict:
    passed = [s == "passed" for s in statuses]
    n = len(passed)
    first_failure = next((s for s in statuses if s != "passed"), None)
    return Verdict(
        id=request.id,
        passed=passed,
        pass_rate=sum(passed) / n if n else 0.0,
        status=first_failure or ("accepted" if n else "wrong_answer"),
        feedback=feedback,
        seconds=round(time.perf_counter() - start, 4),
        outcomes=list(statuses),
    )


class SyncJudge:
    """A `Judge` for synchronous code: its pool lives on a background event-loop thread.

    >>> with SyncJudge(SandboxConfig(concurrency=4)) as judge:
    ...     verdicts = judge.judge_many(requests)

    `start()` begins starting the workers and returns at once, so a caller can read its input
    meanwhile; entering the context (or the first judgement) waits for the first worker.
    """

    def __init__(self, config: SandboxConfig | None = None, backend: Backend | None = None):
        self.config = config or SandboxConfig()
        self._judge = Judge(self.config, backend)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="sandbox-judge"
        )
        self._started: concurrent.futures.Future | None = None
        self._closed = False

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def start(self) -> SyncJudge:
        """Start the workers in the background; returns at once."""
        if self._started is None:
            self._thread.start()
            self._started = asyncio.run_coroutine_threadsafe(self._judge.start(), self._loop)
        return self

    def __enter__(self) -> SyncJudge:
        self.start()
        assert self._started is not None
        try:
            self._started.result()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._started is None or self._closed:
            return
        self._closed = True
        try:
            self._run(self._judge.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    @property
    def backend_name(self) -> str:
        return self._judge.backend_name

    @property
    def server(self) -> str | None:
        return self._judge.server

    def judge(self, request: JudgeRequest, fail_fast: bool = False) -> Verdict:
        assert self._started is not None, "use SyncJudge as a context manager (or start())"
        return self._run(self._judge.judge(request, fail_fast))

    def judge_many(
        self,
        requests: Iterable[JudgeRequest],
        fail_fast: bool = False,
        on_done: Callable[[int, Verdict], None] | None = None,
    ) -> list[Verdict]:
        assert self._started is not None, "use SyncJudge as a context manager (or start())"
        return self._run(self._judge.judge_many(requests, fail_fast, on_done))
