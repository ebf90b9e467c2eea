"""The rollouts-on-every-GPU benchmark on CPU: its whole code path (`--smoke`: the tiny model in
the process for 1 "GPU", a `transformers serve` of it behind the served engine for 2), a run
that fails reported beside the others, and its arithmetic (the GPU figures are in
docs/SCALING.md; nothing is timed here)."""

from __future__ import annotations

import json

import pytest

from benchmarks.rollout_gpus import compare, main, parse_gpus


def test_cpu_smoke_runs_both_engines_on_the_same_work(tmp_path, capsys):
    out = tmp_path / "rollout.json"
    assert main(["--smoke", "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    one, two = report["results"]
    assert (one["gpus"], one["engine"], one["replicas"]) == (1, "TransformersEngine", 1)
    assert (two["gpus"], two["engine"], two["replicas"]) == (2, "ServedEngine", 2)
    for run in (one, two):
        assert run["completions"] == 4 * 2 and run["engine_errors"] == 0
        assert run["generate_s"] > 0 and run["start_s"] > 0 and run["tokens_per_s"] > 0
    assert one["prompt_tokens"] == two["prompt_tokens"]  # the same prompts, one chat template
    # two engines behind the server: each call has a chunk of problems per engine
    assert two["conversations_per_call_turn0"] == 2 * one["conversations_per_call_turn0"]
    assert two["speedup_vs_1_gpu"] > 0 and 0 <= two["same_text_as_1_gpu"] <= 1
    assert (tmp_path / "work" / "gpus2" / "server.log").exists()
    assert "| 2 | ServedEngine |" in capsys.readouterr().out
    # a later call adds its runs to an earlier one's (the 1-GPU run as the baseline)
    again = tmp_path / "again.json"
    argv = ["--smoke", "--gpus", "1", "--baseline", str(out), "--json", str(again)]
    assert main([*argv, "--work", str(tmp_path / "work2")]) == 0
    one_again, two_again = json.loads(again.read_text())["results"]
    assert "work2" in one_again["records"] and two_again["records"] == two["records"]
    assert two_again["speedup_vs_1_gpu"] == round(one_again["generate_s"] / two["generate_s"], 2)


def test_a_failed_run_is_reported_not_fatal(tmp_path, capsys):
    out = tmp_path / "rollout.json"
    # a model directory without a model: the run fails in its own process
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    argv = ["--smoke", "--gpus", "1", "--model-dir", str(tmp_path / "empty"), "--json", str(out)]
    assert main(argv) == 1
    (result,) = json.loads(out.read_text())["results"]
    assert result["gpus"] == 1 and result["error"].startswith("exit 1: ")
    assert "| 1 | failed: exit 1" in capsys.readouterr().out


def test_gpu_lists_and_the_speedup_arithmetic():
    assert parse_gpus("1,all", 4) == [1, 4]
    assert parse_gpus("1,all", 1) == [1]
    with pytest.raises(SystemExit, match="counts >= 1"):
        parse_gpus("0", 4)
    results = [
        {"gpus": 1, "generate_s": 100.0, "records": "/nonexistent"},
        {"gpus": 4, "generate_s": 28.0, "records": "/nonexistent"},
        {"gpus": 2, "error": "exit 1"},
    ]
    compare(results)
    assert results[1]["speedup_vs_1_gpu"] == 3.57
    assert results[1]["per_gpu_efficiency"] == 0.892 and results[1]["goal_3.5x_on_4_met"]
    assert results[1]["same_text_as_1_gpu"] is None  # no records to compare
    assert "speedup_vs_1_gpu" not in results[2]
