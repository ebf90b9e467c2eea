"""Judging: run a program's tests in a sandbox worker and decide each verdict in this process.

`Judge` is the async API (many programs in flight, bounded by the pool size); `SyncJudge` wraps
it for synchronous callers (CLI, Prefect tasks) with an event loop on a background thread.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from sandbox.backends import make_backend
from sandbox.compare import call_result_matches, stdout_matches
from sandbox.feedback import test_report
from sandbox.models import JudgeRequest, SandboxConfig, TestStatus, Verdict
from sandbox.pool import Backend, WorkerDied, WorkerPool

REPLY_GRACE_S = 5.0  # beyond a test's own limit, before a silent worker counts as dead


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
        if "MemoryError" in stderr or (reply["signal"] == signal.SIGKILL and near_limit):
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
    """

    def __init__(self, config: SandboxConfig | None = None, backend: Backend | None = None):
        self.config = config or SandboxConfig()
        self.backend = backend or make_backend(self.config)
        self.pool = WorkerPool(self.backend, self.config.concurrency, self.config.recycle_after)

    async def __aenter__(self) -> Judge:
        await self.pool.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.pool.close()

    async def judge(self, request: JudgeRequest, fail_fast: bool = False) -> Verdict:
        """Judge one program. With `fail_fast`, tests after the first failure are skipped."""
        limits = self.config.limits
        tests = request.tests
        n = len(tests.inputs)
        statuses: list[TestStatus] = ["skipped"] * n
        feedback = [""] * n
        async with self.pool.worker() as worker:
            start = time.perf_counter()  # waiting for a worker is not the program's time
            worker.programs += 1
            runner_limits = limits.for_runner()
            if worker.enforce_nproc:
                runner_limits["nproc"] = limits.max_processes
            try:
                loaded = await worker.request(
                    {
                        "op": "program",
                        "code": request.code,
                        "fn_name": tests.fn_name,
                        "limits": runner_limits,
                    },
                    timeout=30,
                )
            except WorkerDied as e:
                return _verdict(request, ["sandbox_error"] * n, [str(e)] * n, start)
            if not loaded["ok"]:
                report = test_report("syntax_error", "", "", stderr=loaded["error"])
                return _verdict(request, ["syntax_error"] * n, [report] * n, start)
            deadline = start + limits.suite_timeout_s
            for i, (test_input, expected) in enumerate(
                zip(tests.inputs, tests.outputs, strict=True)
            ):
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    feedback[i:] = [_skipped_note("time")] * (n - i)
                    break
                timeout = min(limits.timeout_s, remaining)
                try:
                    reply = await worker.request(
                        {"op": "test", "input": test_input, "timeout_s": timeout},
                        timeout=timeout + REPLY_GRACE_S,
                    )
                except WorkerDied as e:
                    statuses[i:] = ["sandbox_error"] * (n - i)
                    feedback[i:] = [f"The sandbox failed: {e}"] * (n - i)
                    break
                if reply.get("leftover") or not reply.get("clean", True):
                    worker.tainted = True
                status = classify(reply, expected, tests.fn_name, limits.memory_mb << 20)
                statuses[i] = status
                feedback[i] = test_report(
                    status,
                    test_input,
                    expected,
                    reply.get("stdout", ""),
                    reply.get("stderr", ""),
                    reply.get("result"),
                    tests.fn_name,
                    timeout,
                    limits.output_bytes,
                )
                if fail_fast and status != "passed":
                    feedback[i + 1 :] = [_skipped_note("fail_fast")] * (n - i - 1)
                    break
        return _verdict(request, statuses, feedback, start)

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

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))


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
    """

    def __init__(self, config: SandboxConfig | None = None, backend: Backend | None = None):
        self.config = config or SandboxConfig()
        self._backend = backend
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="sandbox-judge"
        )
        self._judge: Judge | None = None

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncJudge:
        self._thread.start()

        async def start() -> Judge:
            judge = Judge(self.config, self._backend)
            await judge.__aenter__()
            return judge

        try:
            self._judge = self._run(start())
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._judge is not None:
            self._run(self._judge.__aexit__(None, None, None))
        self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def backend_name(self) -> str:
        assert self._judge is not None
        return self._judge.backend.name

    def judge(self, request: JudgeRequest, fail_fast: bool = False) -> Verdict:
        assert self._judge is not None, "use SyncJudge as a context manager"
        return self._run(self._judge.judge(request, fail_fast))

    def judge_many(
        self,
        requests: Iterable[JudgeRequest],
        fail_fast: bool = False,
        on_done: Callable[[int, Verdict], None] | None = None,
    ) -> list[Verdict]:
        assert self._judge is not None, "use SyncJudge as a context manager"
        return self._run(self._judge.judge_many(requests, fail_fast, on_done))
