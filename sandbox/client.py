"""The client side of `python -m sandbox serve` (protocol in `sandbox.server`).

`RemoteJudge.connect` returns None when no trustworthy server answers, `connect_server` also when
the server judges otherwise than this client would (another backend, image or limits: the server
decides those, a client only asks for judging), and `judge` raises `ServerGone` when the server
dies or stops answering mid-way; `Judge` then falls back to workers of its own, so a server is
only ever an accelerator, never a dependency, and verdicts are the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

from sandbox import transport
from sandbox.models import JudgeRequest, SandboxConfig, Verdict
from sandbox.pool import SandboxUnavailable

log = logging.getLogger(__name__)

CONNECT_S = 2.0  # to connect and be greeted
SILENCE_S = 15.0  # no message (not even a heartbeat) for this long: the server is stuck
PROTOCOL = 2


class ServerGone(RuntimeError):
    """The server closed the connection, stopped answering, or sent nonsense."""


class RemoteJudge:
    """Judges through a sandbox server over one connection; requests are pipelined."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: dict[str, Any],
        address: str,
    ):
        self.address = address
        self.backend: str = hello["backend"]
        self.judging: dict[str, Any] = hello["judging"]
        self.concurrency: int = hello["concurrency"]
        self.pid: int = hello.get("pid", 0)
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        # enough requests queued at the server to keep its workers busy, not the whole batch
        self._window = asyncio.Semaphore(max(8, 4 * self.concurrency))
        self._gone: ServerGone | None = None
        self._listener = asyncio.create_task(self._listen())

    @classmethod
    async def connect(cls, address: str, timeout: float = CONNECT_S) -> RemoteJudge | None:
        """A client of the server at `address`, or None if none answers there (nothing listens,
        the socket is not ours, or nothing greets us within `timeout`)."""
        try:
            reader, writer = await transport.connect(address, timeout)
        except (OSError, TimeoutError) as e:
            if not isinstance(e, FileNotFoundError | ConnectionRefusedError):
                log.warning("not using the sandbox server at %s: %s", address, e)
            return None
        try:
            async with asyncio.timeout(timeout):
                hello = transport.decode(await reader.readline())
            if (
                hello.get("hello") != "cobalt-sandbox"
                or hello.get("protocol") != PROTOCOL
                or not isinstance(hello.get("judging"), dict)
            ):
                raise ValueError(f"unexpected greeting {hello!r:.200}")
        except (OSError, TimeoutError, ValueError) as e:
            log.warning("not using the sandbox server at %s: %s", address, e)
            writer.close()
            return None
        return cls(reader, writer, hello, address)

    def mismatch(self, config: SandboxConfig) -> str | None:
        """How the server judges otherwise than `config` asks (None: it judges the same)."""
        backend = self.judging.get("backend")
        if config.backend not in ("auto", backend):
            return f"it judges with the {backend} backend, not {config.backend}"
        if backend == "docker" and self.judging.get("image") != config.image:
            return f"its image is {self.judging.get('image')}, not {config.image}"
        limits = config.limits.model_dump(mode="json")
        if self.judging.get("limits") != limits:
            theirs = self.judging.get("limits") or {}
            differ = [f"{k}={theirs.get(k)}" for k in limits if theirs.get(k) != limits[k]]
            return f"its limits differ ({', '.join(differ)})"
        return None

    async def judge(self, request: JudgeRequest, fail_fast: bool) -> Verdict:
        async with self._window:
            if self._gone is not None:
                raise self._gone
            n = next(self._ids)
            future = asyncio.get_running_loop().create_future()
            self._pending[n] = future
            message = {
                "op": "judge",
                "id": n,
                "fail_fast": fail_fast,
                "request": request.model_dump(mode="json"),
            }
            try:
                self._writer.write(transport.encode(message))
                await self._writer.drain()
                reply = await future
            except ServerGone:
                raise
            except (OSError, RuntimeError) as e:
                raise ServerGone(f"sandbox server at {self.address}: {e}") from e
            finally:
                self._pending.pop(n, None)
        if "verdict" in reply:
            try:
                return Verdict.model_validate(reply["verdict"])
            except ValueError as e:
                raise ServerGone(f"sandbox server sent an unreadable verdict: {e}") from e
        if reply.get("unavailable"):
            raise SandboxUnavailable(f"sandbox server: {reply.get('error')}")
        raise ServerGone(f"sandbox server refused the request: {reply.get('error')}")

    async def _listen(self) -> None:
        """Hand each reply to its request; on silence or end of stream, fail them all."""
        reason = "closed the connection"
        try:
            while True:
                async with asyncio.timeout(SILENCE_S):
                    line = await self._reader.readline()
                if not line:
                    break
                message = transport.decode(line)
                future = self._pending.get(message.get("id"))  # type: ignore[arg-type]
                if future is not None and not future.done():
                    future.set_result(message)
        except TimeoutError:
            reason = f"sent nothing for {SILENCE_S:g}s"
        except (OSError, ValueError) as e:
            reason = f"broke the connection ({e})"
        except asyncio.CancelledError:
            reason = "connection closed by this client"
            raise
        finally:
            self._gone = ServerGone(f"sandbox server at {self.address} {reason}")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(self._gone)
            self._writer.close()

    async def aclose(self) -> None:
        self._listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._listener


async def connect_server(config: SandboxConfig) -> RemoteJudge | None:
    """The server `config` asks for (or the default one), if it answers and judges as `config`
    would."""
    if not config.use_server:
        return None
    address = config.server or transport.default_address()
    if address is None:
        return None
    start = time.perf_counter()
    remote = await RemoteJudge.connect(address)
    if remote is not None and (why := remote.mismatch(config)) is not None:
        log.warning(
            "not using the sandbox server at %s: %s; judging with workers of our own", address, why
        )
        await remote.aclose()
        return None
    if remote is not None:
        log.debug("using the sandbox server at %s (%.3fs)", address, time.perf_counter() - start)
    return remote


async def request(address: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send one control message (status, shutdown) and return the first reply that is not a
    heartbeat."""
    reader, writer = await transport.connect(address, timeout)
    try:
        async with asyncio.timeout(timeout):
            hello = transport.decode(await reader.readline())
            if hello.get("hello") != "cobalt-sandbox":
                raise ValueError(f"unexpected greeting {hello!r:.200}")
            writer.write(transport.encode(message))
            await writer.drain()
            while True:
                line = await reader.readline()
                if not line:
                    raise ConnectionError("the server closed the connection")
                reply = transport.decode(line)
                if "alive" not in reply:
                    return reply
    finally:
        writer.close()
