"""`python -m sandbox serve`: one long-running process that keeps sandbox workers warm for every
local judge (CLI runs, pipeline stages, scripts), so none of them pays for starting a pool.

The server decides how programs are judged: its own `SandboxConfig` (backend, image, limits, CPU
settings), fixed when it starts, one pool of workers. A client asks for judging only; it uses the
server when the server judges as it would itself (same backend, image and limits, announced in
the greeting: `client.RemoteJudge.mismatch`), and judges with workers of its own otherwise.

Wire protocol (JSON lines, see `sandbox.transport`), after the server's greeting
``{"hello": "cobalt-sandbox", "protocol": 2, "pid", "backend", "concurrency", "judging":
{"backend", "image", "limits"}}``:

* ``{"op": "judge", "id", "request", "fail_fast"}``: ``request`` is a `JudgeRequest`; any other
  field (a backend, an image, limits...) is refused. The reply, ``{"id", "verdict"}`` or
  ``{"id", "error", "unavailable": bool}``, comes when the program is judged; a client may have
  many requests in flight, answered in any order.
* ``{"op": "status"}`` replies ``{"status": {...}}``; ``{"op": "shutdown"}`` stops the server.
* The server sends ``{"alive": true}`` every `HEARTBEAT_S` seconds, so a client can tell a busy
  server from a stuck one.

When a client disconnects, its programs still queued are dropped and the workers of those running
are replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from pydantic import ValidationError

from sandbox import transport
from sandbox.judge import Judge
from sandbox.models import JudgeRequest, SandboxConfig
from sandbox.pool import SandboxUnavailable

log = logging.getLogger(__name__)

PROTOCOL = 2
HEARTBEAT_S = 2.0
JUDGE_FIELDS = {"op", "id", "request", "fail_fast"}


class SandboxServer:
    def __init__(self, config: SandboxConfig):
        self.config = config.model_copy(update={"use_server": False})
        self.judge = Judge(self.config)
        self.backend = ""  # what "auto" came to mean here
        self.judged = 0
        self.in_flight = 0
        self.clients = 0
        self.stopped = asyncio.Event()

    async def start(self) -> None:
        """Start the pool (raises SandboxUnavailable if nothing can isolate here)."""
        await self.judge.start()
        self.backend = self.judge.backend_name

    def judging(self) -> dict[str, Any]:
        """How this server judges, for clients to compare with what they would do."""
        return {
            "backend": self.backend,
            "image": self.config.image if self.backend == "docker" else None,
            "limits": self.config.limits.model_dump(mode="json"),
        }

    async def judge_one(self, message: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"id": message.get("id")}
        if extra := sorted(set(message) - JUDGE_FIELDS):
            return reply | {
                "error": f"a client asks for judging only; this server sets {', '.join(extra)} "
                "itself (python -m sandbox serve --help)",
                "unavailable": False,
            }
        try:
            request = JudgeRequest.model_validate(message["request"])
        except (KeyError, TypeError, ValidationError) as e:
            return reply | {"error": f"invalid judge request: {e}", "unavailable": False}
        self.in_flight += 1
        try:
            verdict = await self.judge.judge(request, bool(message.get("fail_fast")))
        except SandboxUnavailable as e:
            return reply | {"error": str(e), "unavailable": True}
        except Exception as e:  # a bug of ours: the client judges this one itself
            log.exception("judging %s failed", request.id)
            return reply | {"error": f"server error: {type(e).__name__}: {e}", "unavailable": False}
        finally:
            self.in_flight -= 1
        self.judged += 1
        return reply | {"verdict": verdict.model_dump(mode="json")}

    def status(self) -> dict[str, Any]:
        pool = self.judge.pool
        return {
            "pid": os.getpid(),
            "backend": self.backend,
            "concurrency": self.config.concurrency,
            "judging": self.judging(),
            "clients": self.clients,
            "judged": self.judged,
            "in_flight": self.in_flight,
            "replaced": pool.replaced if pool else 0,
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests are judged concurrently, replies sent as they come."""
        self.clients += 1
        tasks: set[asyncio.Task] = set()

        def send(message: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(transport.encode(message))

        async def answer(message: dict[str, Any]) -> None:
            send(await self.judge_one(message))
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
                "judging": self.judging(),
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

    async def aclose(self) -> None:
        await self.judge.aclose()


async def serve(address: str, config: SandboxConfig, announce=print) -> None:
    """Run a server on `address` until SIGTERM, SIGINT or a client's shutdown request."""
    server = SandboxServer(config)
    try:
        await server.start()
        listener = await transport.listen(address, server.handle)
    except BaseException:
        await server.aclose()
        raise
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopped.set)
    announce(
        f"sandbox server (pid {os.getpid()}): {config.concurrency} {server.backend} workers "
        f"on unix:{transport.socket_path(address)}"
    )
    try:
        await server.stopped.wait()
    finally:
        listener.close()
        transport.remove(address)
        await server.aclose()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
