"""How judge clients reach a sandbox server: one JSON object per line over a stream socket.

Only local Unix sockets for now (an address is `unix:/path` or a bare path). Judging and isolation
know nothing of this layer, and the framing does not care what carries it: serving another host
would add an address scheme here (TCP with TLS and a token, say) and change nothing else.

A Unix socket is trusted by its place, not by its contents: it lives in a directory only its user
can enter (mode 0700), the socket itself is mode 0600, and both ends check with SO_PEERCRED that
the other side runs as the same user (or root), so no other local user can submit programs or
answer with made-up verdicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import struct
from typing import Any

ENV = "COBALT_SANDBOX_SOCKET"
OFF = ("off", "none", "no", "0", "false")
MAX_LINE = 1 << 30  # a request holds every test input of a program


class TransportError(OSError):
    """The address is unusable (wrong owner or mode, unsupported scheme, nobody listening)."""


def default_address() -> str | None:
    """Where a local server listens: $COBALT_SANDBOX_SOCKET ('off' for none), else
    /tmp/cobalt-sandbox-<uid>/sandbox.sock (the same for a login shell and for a service)."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in (*OFF, "") else value.strip()
    return f"/tmp/cobalt-sandbox-{os.getuid()}/sandbox.sock"


def socket_path(address: str) -> str:
    if address.startswith("unix:"):
        return address.removeprefix("unix:")
    if "://" in address:
        raise TransportError(f"unsupported sandbox server address {address!r} (use unix:/path)")
    return address


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def _trusted(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def check_place(path: str) -> None:
    """The socket's directory and the socket must belong to us (or root) and be closed to others."""
    directory = os.path.dirname(os.path.abspath(path))
    st = os.stat(directory)
    if not _trusted(st.st_uid) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise TransportError(f"{directory} is writable by others: not a safe place for a socket")
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or not _trusted(st.st_uid) or st.st_mode & 0o077:
        raise TransportError(f"{path} is not a socket of this user with mode 0600")


def _check_peer(sock: socket.socket) -> None:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if not _trusted(uid):
        raise TransportError(f"the peer runs as uid {uid}, not as this user")


async def connect(
    address: str, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a connection to a server; TransportError or OSError if there is none to trust."""
    path = socket_path(address)
    check_place(path)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE)
    try:
        _check_peer(writer.get_extra_info("socket"))
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def listen(address: str, handler) -> asyncio.AbstractServer:
    """Listen on `address` for `handler(reader, writer)`; refuses if a server already answers
    there, and replaces a stale socket file left by a dead one."""
    path = socket_path(address)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.path.lexists(path):
        try:
            _, writer = await connect(address, timeout=2)
        except (OSError, TimeoutError):
            os.unlink(path)  # nobody answers: left by a server that died
        else:
            writer.close()
            raise TransportError(f"a sandbox server already listens on {path}")

    async def checked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            _check_peer(writer.get_extra_info("socket"))
        except OSError:
            writer.close()
            return
        await handler(reader, writer)

    old_mask = os.umask(0o177)  # the socket is born 0600: no window where others may connect
    try:
        server = await asyncio.start_unix_server(checked, path, limit=MAX_LINE)
    finally:
        os.umask(old_mask)
    check_place(path)
    return server


def remove(address: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(socket_path(address))
