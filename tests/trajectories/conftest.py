"""Fixtures of the trajectory tests: a real sandbox (namespace backend: starts in under a second),
the tiny model (built once), and a real `transformers serve` process serving it.

The serving logic is shared with the engine tests (tests/tiny_serving.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_serving import Served, serve_tiny_model

from sandbox import SandboxConfig, SyncJudge

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NAMESPACE = {"backend": "namespace", "concurrency": 2}
SERVE_START_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def judge() -> Iterator[SyncJudge]:
    """One real sandbox pool for the session (namespace isolation, 2 workers)."""
    with SyncJudge(SandboxConfig(**NAMESPACE)) as j:
        yield j


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from engines.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def serve_process(tiny_model, tmp_path_factory) -> Iterator[Served]:
    """`transformers serve <tiny model>` started on a free port (not yet waited for)."""
    with serve_tiny_model(tiny_model, tmp_path_factory.mktemp("serve")) as served:
        yield served


@pytest.fixture(scope="session")
def served_tiny(serve_process) -> dict:
    """The served tiny model, once it answers: api_base and the LiteLLM model name."""
    served = serve_process.wait_until_up()
    return {"api_base": served.api_base, "model": served.model}
