"""A real `transformers serve` process serving the tiny model on 127.0.0.1, for the tests of the
LiteLLM path (engine and trajectory tests share it): `engines.serving.local_server` with the
tests' settings (CPU, one thread), failing the test with the server's log when it does not come
up. Offline: no Hub, no price-list download."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engines.serving import LocalServer, ServerError, free_port, local_server

__all__ = ["Served", "free_port", "serve_tiny_model"]
SERVE_START_TIMEOUT_S = 120


class Served:
    """The server, with `wait_until_up` failing the test (not raising) and `model` naming it."""

    def __init__(self, server: LocalServer):
        self.server = server

    @property
    def api_base(self) -> str:
        return self.server.api_base

    @property
    def model(self) -> str:
        return self.server.litellm_model

    @property
    def log(self) -> Path:
        return self.server.log

    def wait_until_up(self) -> Served:
        try:
            self.server.wait_until_up(SERVE_START_TIMEOUT_S)
        except ServerError as exc:
            pytest.fail(str(exc))
        return self


@contextmanager
def serve_tiny_model(model_dir: Path, log_dir: Path) -> Iterator[Served]:
    """Start `transformers serve <model_dir>` on a free port (not yet waited for); stop it after."""
    with local_server(model_dir, log_dir, device="cpu", env={"OMP_NUM_THREADS": "1"}) as server:
        yield Served(server)
