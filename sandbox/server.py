"""`python -m sandbox serve`: one long-running process that keeps sandbox workers warm for every
local judge (CLI runs, pipeline stages, scripts), so none of them pays for starting a pool.

Wire protocol (JSON lines, see `sandbox.transport`), after the server's greeting
``{"hello": "cobalt-sandbox", "protocol": 1, "pid", "backend", "concurrency"}``:

* ``{"op": "judge", "id", "config", "request", "fail_fast"}``: ``config`` is the client's
  `SandboxConfig` (backend, image, limits...), ``request`` a `JudgeRequest`. The reply,
  ``{"id", "verdict"}`` or ``{"id", "error", "unavailable": bool}``, comes when the program is
  judged; a client may have many requests in flight, answered in any order.
* ``{"op": "status"}`` replies ``{"status": {...}}``; ``{"op": "shutdown"}`` stops the server.
* The server sends ``{"alive": true}`` every `HEARTBEAT_S` seconds, so a client can tell a busy
  server from a stuck one.

The server judges with the same `Judge` as a local pool: one pool per `SandboxConfig.pool_key`
(what the workers are made with), created on first use; the per-program limits travel with each
request. At most `concurrency` programs run at once across all pools. A pool other than the
default one is closed after `idle_s` seconds unused. When a client disconnects, its programs still
queued are dropped and the workers of those running are replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any

from pydantic import ValidationError

from sandbox import transport
from sandbox.judge import Judge
from sandbox.models import JudgeRequest, SandboxConfig
from sandbox.pool import SandboxUnavailable

log = logging.getLogger(__name__)

PROTOCOL = 1
HEARTBEAT_S = 2.0


class SandboxServer:
    def __init__(self, config: SandboxConfig, idle_s: float = 600.0):
        self.config = config.model_copy(update={"use_server": False})
        self.idle_s = idle_s
        self.judges: dict[tuple, Judge] = {}
        self.last_used: dict[tuple, float] = {}
        self.in_flight: dict[tuple, int] = {}
        self.backend = ""  # the default pool's backend: what "auto" means here
        self.judged = 0
        self.clients = 0
        self.stopped = asyncio.Event()
        self._slots = asyncio.Semaphore(config.concurrency)
        self._default_key: tuple = ()

    async def start(self) -> None:
        """Start the default pool (raises SandboxUnavailable if nothing can isolate here)."""
        judge = Judge(self.config)
        await judge.start()
        self.backend = judge.backend_name
        self._default_key = self.config.pool_key(self.backend)
        self.judges[self._default_key] = judge

    async def judge_for(self, config: SandboxConfig) -> tuple[tuple, Judge]:
        """The pool for a client's configuration, started on first use."""
        backend = self.backend if config.backend == "auto" else config.backend
        key = config.pool_key(backend)
        judge = self.judges.get(key)
        if judge is None:
            settings = config.model_copy(
                update={
                    "backend": backend,
                    "concurrency": self.config.concurrency,
                    "use_server": False,
                }
            )
            judge = self.judges[key] = Judge(settings)
            log.info("new pool %s", key)
        try:
            await judge.start()
        except BaseException:
            if self.judges.get(key) is judge:
                del self.judges[key]
                await judge.aclose()
            raise
        return key, judge

    async def judge(self, message: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"id": message.get("id")}
        try:
            config = SandboxConfig.model_validate(message["config"])
            request = JudgeRequest.model_validate(message["request"])
        except (KeyError, TypeError, ValidationError) as e:
            return reply | {"error": f"invalid judge request: {e}", "unavailable": False}
        try:
            key, judge = await self.judge_for(config)
        except SandboxUnavailable as e:
            return reply | {"error": str(e), "unavailable": True}
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            async with self._slots:
                verdict = await judge.judge(request, bool(message.get("fail_fast")), config.limits)
        except SandboxUnavailable as e:
            return reply | {"error": str(e), "unavailable": True}
        except Exception as e:  # a bug of ours: the client judges this one itself
            log.exception("judging %s failed", request.id)
            return reply | {"error": f"server error: {type(e).__name__}: {e}", "unavailable": False}
        finally:
            self.in_flight[key] -= 1
            self.last_used[key] = time.monotonic()
        self.judged += 1
        return reply | {"verdict": verdict.model_dump(mode="json")}

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "backend": self.backend,
            "concurrency": self.config.concurrency,
            "clients": self.clients,
            "judged": self.judged,
            "pools": [
                {
                    "key": list(key),
                    "in_flight": self.in_flight.get(key, 0),
                    "replaced": judge.pool.replaced if judge.pool else 0,
                }
                for key, judge in self.judges.items()
            ],
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests are judged concurrently, replies sent as they come."""
        self.clients += 1
        tasks: set[asyncio.Task] = set()

        def send(message: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(transport.encode(message))

        async def answer(message: dict[str, Any]) -> None:
            send(await self.judge(message))
            with contextlib.suppress(ConnectionError):
                await writer.drain()

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                send({"alive": True})

        beat = asyncio.create_task(heartbeat())
        send(
            {
                "hello": "cobalt-sandbox",
                "protocol": PROTOCOL,
                "pid": os.getpid(),
                "backend": self.backend,
                "concurrency": self.config.concurrency,
            }
        )
        try:
            while line := await reader.readline():
                try:
                    message = transport.decode(line)
                except ValueError as e:
                    send({"error": f"not a JSON object: {e}"})
                    continue
                op = message.get("op")
                if op == "judge":
                    task = asyncio.create_task(answer(message))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                elif op == "status":
                    send({"status": self.status()})
                elif op == "shutdown":
                    send({"stopping": True})
                    self.stopped.set()
                else:
                    send({"error": f"unknown op {op!r}"})
        except (ConnectionError, ValueError):  # reset, or a line over transport.MAX_LINE
            pass
        finally:
            self.clients -= 1
            beat.cancel()
            for task in tasks:  # the client is gone: nobody wants these verdicts
                task.cancel()
            await asyncio.gather(*tasks, beat, return_exceptions=True)
            writer.close()

    async def reap_idle(self) -> None:
        """Close pools other than the default one that nobody used for `idle_s`."""
        while True:
            await asyncio.sleep(min(30.0, self.idle_s))
            now = time.monotonic()
            for key in list(self.judges):
                idle = now - self.last_used.get(key, now)
                if key != self._default_key and not self.in_flight.get(key) and idle > self.idle_s:
                    log.info("closing idle pool %s", key)
                    await self.judges.pop(key).aclose()

    async def aclose(self) -> None:
        judges, self.judges = list(self.judges.values()), {}
        await asyncio.gather(*(j.aclose() for j in judges), return_exceptions=True)


async def serve(address: str, config: SandboxConfig, idle_s: float = 600.0, announce=print) -> None:
    """Run a server on `address` until SIGTERM, SIGINT or a client's shutdown request."""
    server = SandboxServer(config, idle_s)
    await server.start()
    try:
        listener = await transport.listen(address, server.handle)
    except BaseException:
        await server.aclose()
        raise
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopped.set)
    reaper = asyncio.create_task(server.reap_idle())
    announce(
        f"sandbox server (pid {os.getpid()}): {config.concurrency} {server.backend} workers "
        f"on unix:{transport.socket_path(address)}"
    )
    try:
        await server.stopped.wait()
    finally:
        listener.close()
        reaper.cancel()
        transport.remove(address)
        await server.aclose()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
