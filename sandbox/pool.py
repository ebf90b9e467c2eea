"""A warm pool of sandbox workers, whatever isolates them.

A worker is one runner process (see `runner.py`) inside one sandbox, spoken to in JSON lines: one
request per program, one reply per test. The pool hands out idle workers, and replaces a worker in the background when it is
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

    async def send(self, message: dict[str, Any], timeout: float) -> None:
        """Send one request; on any failure the worker is tainted."""
        try:
            async with asyncio.timeout(timeout):
                await self._write(json.dumps(message).encode() + b"\n")
        except TimeoutError as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: could not send within {timeout:.1f}s") from e
        except (OSError, EOFError) as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: channel closed ({e})") from e

    async def receive(self, timeout: float) -> dict[str, Any]:
        """The runner's next message; on any failure the worker is tainted."""
        try:
            async with asyncio.timeout(timeout):
                line = await self._read_line()
        except TimeoutError as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: no reply within {timeout:.1f}s") from e
        except (OSError, asyncio.IncompleteReadError, EOFError, ValueError) as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: channel closed ({e})") from e
        if not line:
            self.tainted = True
            raise WorkerDied(f"{self.name}: runner exited")
        try:
            reply = json.loads(line)
        except ValueError as e:
            self.tainted = True
            raise WorkerDied(f"{self.name}: unreadable reply ({e})") from e
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
    """Workers of one backend. They start in the background: `start()` returns as soon as one is
    ready, and the others join as they come up."""

    def __init__(self, backend: Backend, size: int, recycle_after: int):
        self.backend = backend
        self.size = size
        self.recycle_after = recycle_after
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
        self._all: set[Worker] = set()
        self._tasks: set[asyncio.Task] = set()
        self._starts: list[asyncio.Task] | None = None
        self._spawning = 0
        self._failure: BaseException | None = None
        self.replaced = 0

    async def start(self) -> None:
        if self._starts is None:
            self._starts = [self._background(self._start_one(i)) for i in range(self.size)]
        pending = [t for t in self._starts if not t.done()]
        while not self._all and pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if not self._all and not self._spawning:  # (workers being replaced will come back)
            raise SandboxUnavailable(
                f"{self.backend.name} backend: no worker could start: {self._failure}"
            ) from self._failure

    def _background(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start_one(self, index: int) -> None:
        self._spawning += 1
        try:
            worker = await self.backend.spawn(index)
        except Exception as e:  # noqa: BLE001 - reported by start() when no worker is left
            self._failure = e
            log.warning("%s worker failed to start: %s", self.backend.name, e)
            return
        finally:
            self._spawning -= 1
        self._all.add(worker)
        self._idle.put_nowait(worker)

    @contextlib.asynccontextmanager
    async def worker(self) -> AsyncIterator[Worker]:
        await self.start()
        while True:
            if not self._all and not self._spawning:
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
            self._background(self._replace(worker))
        else:
            self._idle.put_nowait(worker)

    async def _replace(self, worker: Worker) -> None:
        self._all.discard(worker)
        self.replaced += 1
        self._spawning += 1
        try:
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
        finally:
            self._spawning -= 1

    async def close(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(*(w.close() for w in self._all), return_exceptions=True)
        self._all.clear()
        await self.backend.aclose()
