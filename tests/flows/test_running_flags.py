"""The flags every generating stage shares (`flows.cli.add_running_args`) reach the parameters of
both CLIs that take them, and a --config file's values stay where no flag is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows import reward_hacking, trajectories

FLAGS = [
    "--backend", "namespace", "--sandbox-concurrency", "3", "--timeout", "2.5",
    "--llm-limit", "endpoint", "--sandbox-limit", "judge", "--work-dir", "/w",
    "--storage", "/s", "--refresh",
]  # fmt: skip


@pytest.mark.parametrize("flow", [trajectories, reward_hacking], ids=["trajectories", "hacking"])
def test_running_flags_reach_the_parameters(flow, tmp_path: Path) -> None:
    p = flow.parse_params(FLAGS)
    assert (p.sandbox.backend, p.sandbox.concurrency, p.limits.timeout_s) == ("namespace", 3, 2.5)
    assert (p.llm_limit, p.sandbox_limit, p.work_dir, p.refresh) == (
        "endpoint",
        "judge",
        "/w",
        True,
    )
    assert p.storage.url == "/s"
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"llm_limit": "from-file", "sandbox": {"concurrency": 7}}))
    p = flow.parse_params(["--config", str(config), "--backend", "docker"])
    assert (p.llm_limit, p.sandbox.concurrency, p.sandbox.backend) == ("from-file", 7, "docker")
    assert p.refresh is False


def test_training_flags_reach_the_training_config(tmp_path: Path) -> None:
    """`flows.training` takes LoRA, GPUs and sharding as plain flags (as `flows.pipeline` does);
    a --config file's LoRA settings stay when --lora is also given."""
    from flows import training

    p = training.parse_params(["--lora", "--gpus", "2", "--sharding", "ddp"])
    assert p.training.lora is not None and p.training.lora.r == 16
    assert (p.training.num_processes, p.training.sharding) == (2, "ddp")
    assert training.parse_params([]).training.lora is None
    assert training.parse_params([]).training.fsdp_gather == "float32"  # one GPU's numerics
    gather = training.parse_params(
        ["--gpus", "2", "--sharding", "fsdp", "--fsdp-gather", "bfloat16"]
    )
    assert gather.training.fsdp_gather == "bfloat16"
    split = training.parse_params(["--gpus", "2", "--fsdp-gather", "bf16-linear"])
    assert split.training.fsdp_gather == "bf16-linear"
    assert training.parse_params(["--packing"]).training.packing is True
    assert training.parse_params([]).training.packing is False
    from flows import pipeline

    assert pipeline.parse_params(["--packing"]).training.packing is True
    shared = training.parse_params(["--share-prompts"]).training
    assert shared.packing and shared.share_prompts
    assert pipeline.parse_params(["--share-prompts"]).training.share_prompts
    assert training.parse_params(["--async"]).training.async_generation is True
    assert pipeline.parse_params(["--async"]).training.async_generation is True
    assert training.parse_params([]).training.async_generation is False
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"training": {"lora": {"r": 4}}}))
    assert training.parse_params(["--config", str(config), "--lora"]).training.lora.r == 4
