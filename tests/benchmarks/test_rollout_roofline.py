"""The rollout roofline benchmark: its limit arithmetic and its CPU code path (the GPU figures
are in docs/BENCHMARKS.md; a benchmark is not timed here)."""

from __future__ import annotations

import json

import pytest

from benchmarks.rollout_roofline import SHAPES, gpu_limits, main, roofline


def test_shapes_have_the_published_parameter_counts():
    assert SHAPES["8b"].params() == 8_190_735_360  # Qwen3-8B
    assert SHAPES["1.5b"].params() == 1_543_714_304  # Qwen2.5-1.5B (tied embeddings)
    assert SHAPES["8b"].kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2


def test_one_sequence_is_bound_by_reading_the_weights_once_per_token():
    shape = SHAPES["8b"]
    limit, bound = roofline(shape, batch=1, prompt=0, gen=0, bandwidth=4.8e12, flops=989e12)
    assert bound == "memory"
    # the untied input embedding is gathered, not read: 8.19B - 151936 x 4096 parameters
    assert limit == pytest.approx(4.8e12 / ((8_190_735_360 - 151936 * 4096) * 2))


def test_the_kv_cache_and_the_batch_move_the_limit_the_right_way():
    shape, h200 = SHAPES["8b"], gpu_limits("NVIDIA H200")
    short, _ = roofline(shape, 64, 512, 256, *h200)
    long, _ = roofline(shape, 64, 8192, 256, *h200)
    bigger, _ = roofline(shape, 256, 512, 256, *h200)
    assert long < short < bigger  # more KV to read per step; more tokens per weight read
    _huge, bound = roofline(shape, 8192, 16, 16, *h200)
    assert bound == "compute"  # 2 x params x batch FLOPs outgrow the weight reads
    assert gpu_limits("cpu") is None


def test_cpu_smoke_measures_and_a_failing_engine_is_reported_not_fatal(tmp_path, capsys):
    out = tmp_path / "roofline.json"
    assert main(["--smoke", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cells = report["results"]
    assert [c["batch"] for c in cells] == [2, 4]
    assert all(c["decode_tokens_per_s"] > 0 and c["total_s"] > c["prefill_s"] for c in cells)
    assert report["failures"] == {}

    # vLLM is not installed here: its child fails, the run still ends with what it has
    out2 = tmp_path / "vllm.json"
    argv = [
        "--shapes",
        "tiny",
        "--engines",
        "vllm",
        "--batches",
        "2",
        "--prompt",
        "4",
        "--gen",
        "4",
    ]
    assert main([*argv, "--json", str(out2)]) == 0
    failed = json.loads(out2.read_text())
    assert failed["results"] == [] and "vllm/tiny" in failed["failures"]
    assert "No module named 'vllm'" in (tmp_path / "vllm_vllm_tiny.log").read_text()
    assert "vllm/tiny: no result" in capsys.readouterr().out
