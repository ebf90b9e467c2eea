"""Fixtures of the pipeline tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def small_run_config(tmp_path, fitted_model) -> Callable[..., Path]:
    """Writes a PipelineParams file for a small embedded run (the session's fitted reference,
    12 training problems, 4 samples a problem when evaluating, the namespace sandbox) and returns
    its path."""

    def write(eval_limit: int, concurrency: int) -> Path:
        config = tmp_path / "config.json"
        config.write_text(
            json.dumps(
                {
                    "reference": str(fitted_model["path"]),
                    "train_limit": 12,
                    "eval_limit": eval_limit,
                    "eval_samples": 4,
                    "sandbox": {"backend": "namespace", "concurrency": concurrency},
                }
            )
        )
        return config

    return write
