"""Fixtures of the trajectory tests: a real sandbox (namespace backend: starts in under a second).
The tiny model and the real `transformers serve` process serving it (`served_tiny`) are session
fixtures of tests/conftest.py, shared with the reward-hacking tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandbox import SandboxConfig, SyncJudge

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NAMESPACE = {"backend": "namespace", "concurrency": 2}


@pytest.fixture(scope="session")
def judge() -> Iterator[SyncJudge]:
    """One real sandbox pool for the session (namespace isolation, 2 workers)."""
    with SyncJudge(SandboxConfig(**NAMESPACE)) as j:
        yield j
