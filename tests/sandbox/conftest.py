"""Fixtures of the sandbox tests: session-scoped `SyncJudge`s, one per backend and set of limits.

They judge with workers of their own even when a sandbox server runs on this machine
(`use_server=False`); test_server.py starts servers of its own.

`backend` is parametrized over docker and namespace. Docker tests are skipped with the reason when
no engine or image is there, unless COBALT_REQUIRE_DOCKER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator

import pytest

from sandbox import Limits, SandboxConfig, SyncJudge

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("namespace", id="namespace"),
]


@functools.cache
def docker_problem() -> str | None:
    """Why the Docker backend cannot run here, or None when it can."""
    from sandbox.backends.docker import check_image, docker_client

    try:
        check_image(docker_client(), SandboxConfig().image)
    except Exception as e:  # SandboxUnavailable, or the SDK's own errors
        return str(e)
    return None


def require_backend(name: str) -> None:
    if name != "docker" or (problem := docker_problem()) is None:
        return
    if os.environ.get("COBALT_REQUIRE_DOCKER") == "1":
        pytest.fail(f"COBALT_REQUIRE_DOCKER=1 but the docker backend is unavailable: {problem}")
    pytest.skip(f"docker backend unavailable: {problem}")


JudgeFactory = Callable[..., SyncJudge]


@pytest.fixture(scope="session")
def judges() -> Iterator[JudgeFactory]:
    """`judges(backend, concurrency=2, **limits)`: a started SyncJudge, shared by every test that
    asks for the same backend, concurrency and limits; all are closed at the end of the session."""
    started: dict[tuple, SyncJudge] = {}

    def get(backend: str, concurrency: int = 2, **limits) -> SyncJudge:
        require_backend(backend)
        key = (backend, concurrency, tuple(sorted(limits.items())))
        if key not in started:
            config = SandboxConfig(
                backend=backend,
                concurrency=concurrency,
                limits=Limits(**limits),
                use_server=False,  # these tests look at their own workers (test_server.py: not)
            )
            judge = SyncJudge(config)
            judge.__enter__()
            started[key] = judge
        return started[key]

    yield get
    for judge in started.values():
        judge.__exit__(None, None, None)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return request.param


@pytest.fixture(scope="session")
def judge(backend: str, judges: JudgeFactory) -> SyncJudge:
    """The backend's judge with the default limits (4 s per test), two programs at once."""
    return judges(backend)
