"""The GRPO scaling benchmark's CPU path with the options of the 8B run (LoRA, micro-batches,
the generation backends compared side by side); the GPU figures are in docs/BENCHMARKS.md."""

from __future__ import annotations

import json

import pytest

from benchmarks.grpo_scaling import main


def test_lora_in_micro_batches_trains_and_reports_each_backend(tmp_path):
    out = tmp_path / "grpo.json"
    argv = ["--smoke", "--processes", "1", "--lora", "--micro-batch", "2", "--backend", "namespace"]
    assert main([*argv, "--generation", "transformers,vllm_colocate", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    done, failed = report["results"]
    assert (done["generation"], done["completions_per_step"], done["steps"]) == (
        "transformers",
        4,
        3,
    )
    assert done["samples_per_s"] > 0 and 0 < done["generation_share"] < 1
    # no vLLM here: that backend's run fails with what to install, the other's figures stay
    assert failed["generation"] == "vllm_colocate" and "needs vLLM" in failed["error"]
    assert report["settings"]["lora"] is True and report["settings"]["micro_batch"] == 2


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--micro-batch must divide --per-device"):
        main(["--smoke", "--processes", "1", "--micro-batch", "3", "--backend", "namespace"])
