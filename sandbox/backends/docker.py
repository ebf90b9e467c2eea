"""Docker backend: a warm pool of hardened containers, each running one runner as PID 1.

Each container: no network, read-only root, a tmpfs /tmp (noexec), memory and pids limits, a CPU
quota, every capability dropped, no-new-privileges, user nobody, an IPC namespace of its own with
bounded System V IPC (`ipc.py`); the runner adds its seccomp filter to Docker's (`confine.py`:
io_uring above all, which Docker 20.10's default profile allows) and reads the container's cgroup
for CPU time and OOM kills. The runner's source is passed on the command line, so the image
needs nothing but python3 (see infra/sandbox-image/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct

from sandbox.backends.cgroups import pid_alive
from sandbox.backends.cpus import release_cpu, take_cpu
from sandbox.backends.ipc import ipc_sysctls
from sandbox.models import Limits
from sandbox.pool import Backend, SandboxUnavailable, Worker
from sandbox.runner_source import RUNNER_SOURCE

LABEL = "cobalt.sandbox"
BUILD_HINT = "build it with: bash infra/sandbox-image/build.sh"


def docker_client():
    """A client for the engine named by DOCKER_HOST (default: the local socket), or an error."""
    try:
        import docker

        client = docker.from_env(timeout=60)
        client.ping()
        return client
    except Exception as e:
        raise SandboxUnavailable(
            f"no Docker engine is reachable ({type(e).__name__}: {e}); start one "
            "(bash infra/docker/install-engine.sh) or set DOCKER_HOST"
        ) from e


def check_image(client, image: str) -> None:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as e:
        raise SandboxUnavailable(f"sandbox image {image!r} is missing: {BUILD_HINT}") from e


class _Demux:
    """Reads the container's stdout out of Docker's multiplexed attach stream (8-byte headers)."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.buffer = bytearray()
        self.stderr = bytearray()

    async def readline(self) -> bytes:
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[: end + 1])
                del self.buffer[: end + 1]
                return line
            try:
                header = await self.reader.readexactly(8)
            except asyncio.IncompleteReadError:
                return b""
            kind, size = header[0], struct.unpack(">I", header[4:])[0]
            payload = await self.reader.readexactly(size)
            if kind == 1:
                self.buffer += payload
            else:
                self.stderr = (self.stderr + payload)[-8192:]


class DockerBackend(Backend):
    name = "docker"

    def __init__(
        self, limits: Limits, image: str, cpus: float = 1.0, client=None, pin: bool = False
    ):
        self.limits = limits
        self.image = image
        self.cpus = cpus
        self.client = client or docker_client()
        # CPU numbers are this host's: no pinning on an engine elsewhere (DOCKER_HOST=tcp://...)
        self.pin = pin and self.client.api.base_url.startswith("http+docker://")
        check_image(self.client, image)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.remove_stale()

    def remove_stale(self) -> None:
        """Remove workers left behind by a process of this host that died without cleaning up."""
        host = socket.gethostname()
        # ignore_removed: a container another pool removes while we list it is no error
        stale = self.client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
        for c in stale:
            owner = c.labels.get(LABEL, "")
            name, _, pid = owner.partition(":")
            if name == host and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(Exception):
                    c.remove(force=True)

    def _create(self, index: int, cpu: int | None):
        import docker
        from docker.types import Ulimit

        lim = self.limits
        memory = lim.worker_memory_mb  # the test, its scratch, and the runner
        cfg = {"workdir": "/tmp", "ipc": True, "cgroup": {"own": True}}
        container = self.client.containers.create(
            self.image,
            command=["python3", "-I", "-S", "-c", RUNNER_SOURCE, json.dumps(cfg)],
            # StdinOnce (the SDK's default with stdin_open): when our connection closes, even
            # because this process died, the runner reads EOF and exits; the engine then
            # removes the container (auto_remove).
            stdin_open=True,
            auto_remove=True,
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,noexec,size={lim.scratch_mb + 16}m,mode=1777"},
            mem_limit=f"{memory}m",
            memswap_limit=f"{memory}m",
            pids_limit=lim.max_processes + 4,
            nano_cpus=int(self.cpus * 1e9),
            cpuset_cpus=None if cpu is None else str(cpu),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user="65534:65534",
            ipc_mode="none",
            sysctls=ipc_sysctls(lim),
            ulimits=[Ulimit(name="core", soft=0, hard=0)],
            labels={LABEL: self.owner},
            environment={"PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"},
        )
        # The attach connection is hijacked from HTTP: it gets a client of its own, which no
        # other request (another worker's start, in another thread) can ever be given.
        api = docker.APIClient(
            version=self.client.api.api_version, **docker.utils.kwargs_from_env()
        )
        sock = api.attach_socket(
            container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        container.start()
        return container, (api, sock)

    async def spawn(self, index: int) -> Worker:
        cpu = take_cpu() if self.pin else None
        try:
            container, (api, sock) = await asyncio.to_thread(self._create, index, cpu)
        except Exception as e:
            release_cpu(cpu)
            raise SandboxUnavailable(f"could not start a sandbox container: {e}") from e
        # The hijacked HTTP connection: stdin out, multiplexed stdout in. `sock` (the SDK's
        # socket file, which holds the HTTP response) and `api` live as long as the worker:
        # dropped, they may close the connection under us.
        raw = sock._sock
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        demux = _Demux(reader)

        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        async def close() -> None:
            writer.close()
            with contextlib.suppress(Exception):
                sock.close()
                api.close()
            await asyncio.to_thread(_kill, container)  # quicker than a removal, which follows
            release_cpu(cpu)

        worker = Worker(
            index,
            demux.readline,
            write,
            close,
            enforce_nproc=False,
            name=f"docker-worker-{index}:{container.short_id}",
        )
        try:
            await worker.handshake(timeout=60)
        except Exception as e:
            logs = b"(gone)"
            with contextlib.suppress(Exception):
                logs = await asyncio.to_thread(container.logs, tail=20)
            await worker.close()
            raise SandboxUnavailable(
                f"sandbox container failed to start: {e}; output: {logs.decode(errors='replace')}"
            ) from e
        return worker


def _kill(container) -> None:
    with contextlib.suppress(Exception):  # already gone: it exited when its input closed
        container.kill()
