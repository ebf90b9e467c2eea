"""Isolation backends behind one interface (`sandbox.pool.Backend`), picked by configuration."""

from __future__ import annotations

import logging
import os
import sys

from sandbox.models import SandboxConfig
from sandbox.pool import Backend, SandboxUnavailable

log = logging.getLogger(__name__)

# Where the namespace backend's cgroups go (backends/cgroups.py)
CGROUP_ENV = "COBALT_SANDBOX_CGROUP"


def make_backend(config: SandboxConfig) -> Backend:
    """The configured backend; with `auto`, Docker where an engine and the image are there,
    else namespaces. Raises SandboxUnavailable with what to install when nothing can isolate."""
    from sandbox.backends.docker import DockerBackend

    pin = config.pin_cpus and config.cpus_per_worker <= 1
    if config.backend == "docker":
        return DockerBackend(config.limits, config.image, config.cpus_per_worker, pin=pin)
    if config.backend == "namespace":
        _require_linux()
        return _namespace(config, pin)
    try:
        return DockerBackend(config.limits, config.image, config.cpus_per_worker, pin=pin)
    except SandboxUnavailable as docker_error:
        try:
            _require_linux()
            backend = _namespace(config, pin)
        except SandboxUnavailable as ns_error:
            raise SandboxUnavailable(
                f"no sandbox backend can run here. docker: {docker_error} namespace: {ns_error}"
            ) from ns_error
        log.info("docker backend unavailable (%s); using namespaces", docker_error)
        return backend


def _namespace(config: SandboxConfig, pin: bool) -> Backend:
    from sandbox.backends.namespace import NamespaceBackend

    cgroup = os.environ.get(CGROUP_ENV) or None  # a machine's setting, not a config's
    return NamespaceBackend(config.limits, pin=pin, cpus=config.cpus_per_worker, cgroup=cgroup)


def _require_linux() -> None:
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable("the namespace backend needs Linux (or install Docker)")
