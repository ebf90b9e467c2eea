"""A warm pool of sandbox workers, whatever isolates them.

A worker is one runner process (see `runner.py`) inside one sandbox, spoken to with one JSON line
per request. The pool hands out idle workers, and replaces a worker in the background when it is
tainted (a timeout, a crash, leftover processes, a dirty scratch dir) or has judged
`recycle_after` programs, so a hostile program never hurts the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 1 << 30


class SandboxUnavailable(RuntimeError):
    """No backend can isolate programs here; the message says what to install or set."""


class WorkerDied(RuntimeError):
    """The runner stopped answering or its channel closed."""


class Worker:
    """A runner process behind a line-JSON channel."""

    def __init__(
        self,
        index: int,
        read_line: Callable[[], Awaitable[bytes]],
        write: Callable[[bytes], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        enforce_nproc: bool,
        name: str,
    ):
        self.index = index
        self._read_line = read_line
        self._write = write
        self._close = close
        self.enforce_nproc = enforce_nproc
        self.name = name
        self.programs = 0
        self.tainted = False

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply; on any failure the worker is tainted."""
        try:
            await asyncio.wait_for(self._write(json.dumps(message).encode() + b"\n"), timeout)
            line = await asyncio.wait_for(self._read_line(), timeout)
        except TimeoutError as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: no reply within {timeout:.1f}s") from e
        except (OSError, asyncio.IncompleteReadError, EOFError) as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: channel closed ({e})") from e
        if not line:
            self.tainted = True
            raise WorkerDied(f"{self.name}: runner exited")
        reply = json.loads(line)
        if "error" in reply and len(reply) == 1:
            self.tainted = True
            raise WorkerDied(f"{self.name}: {reply['error']}")
        return reply

    async def handshake(self, timeout: float) -> dict[str, Any]:
        line = await asyncio.wait_for(self._read_line(), timeout)
        if not line:
            raise WorkerDied(f"{self.name}: runner exited during start-up")
        hello = json.loads(line)
        if not hello.get("ready"):
            raise WorkerDied(f"{self.name}: unexpected start-up message {hello!r}")
        return hello

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._close()


class Backend(ABC):
    """Starts sandbox workers. Subclasses: `DockerBackend`, `NamespaceBackend`."""

    name: str

    @abstractmethod
    async def spawn(self, index: int) -> Worker:
        """Start one worker and wait until its runner said it is ready."""

    async def aclose(self) -> None:
        """Release what the backend holds beyond its workers."""


class WorkerPool:
    def __init__(self, backend: Backend, size: int, recycle_after: int):
        self.backend = backend
        self.size = size
        self.recycle_after = recycle_after
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
        self._all: set[Worker] = set()
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._failure: BaseException | None = None
        self.replaced = 0

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        workers = await asyncio.gather(
            *(self.backend.spawn(i) for i in range(self.size)), return_exceptions=True
        )
        errors = [w for w in workers if isinstance(w, BaseException)]
        for w in workers:
            if isinstance(w, Worker):
                self._all.add(w)
                self._idle.put_nowait(w)
        if not self._all:
            raise SandboxUnavailable(
                f"{self.backend.name} backend: no worker could start: {errors[0]}"
            ) from errors[0]
        for e in errors:
            log.warning("%s worker failed to start: %s", self.backend.name, e)

    @contextlib.asynccontextmanager
    async def worker(self) -> AsyncIterator[Worker]:
        await self.start()
        while True:
            if self._failure is not None and not self._all:
                raise SandboxUnavailable(f"every sandbox worker died: {self._failure}")
            try:
                worker = await asyncio.wait_for(self._idle.get(), 5)
                break
            except TimeoutError:
                continue
        try:
            yield worker
        finally:
            self._release(worker)

    def _release(self, worker: Worker) -> None:
        if worker.tainted or worker.programs >= self.recycle_after:
            task = asyncio.get_running_loop().create_task(self._replace(worker))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._idle.put_nowait(worker)

    async def _replace(self, worker: Worker) -> None:
        self._all.discard(worker)
        self.replaced += 1
        await worker.close()
        for attempt in range(5):
            try:
                fresh = await self.backend.spawn(worker.index)
            except Exception as e:  # noqa: BLE001 - retried, then reported by worker()
                self._failure = e
                log.warning("replacing %s failed (attempt %d): %s", worker.name, attempt + 1, e)
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            self._all.add(fresh)
            self._idle.put_nowait(fresh)
            return

    async def close(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(*(w.close() for w in self._all), return_exceptions=True)
        self._all.clear()
        await self.backend.aclose()
