"""The projection to several nodes (benchmarks/nodes_projection.py): one node is the measured
step, the bytes each sharding moves across a node's link, the two ways to use the nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import nodes_projection

REPORT = (
    Path(__file__).parents[2]
    / "benchmarks/results/verl_shape_after_gpu_plan_4xh200_2026-11-27.json"
)


def report(params: float = 1e9, micro_batches: int = 10) -> dict:
    return {
        "gpus": 4, "model_parameters": params, "memory_plan": {"gradient_accumulation_steps": micro_batches},
        "steps": [{"completions": 100}],
        "median_after_step_1": {"generation_s": 10.0, "reward_s": 2.0, "weight_sync_s": 1.0,
                                "optimisation_s": 20.0, "prompt_mean_tokens": 100.0,
                                "response_mean_tokens": 300.0},
    }  # fmt: skip


def test_one_node_is_the_measured_step() -> None:
    measured = json.loads(REPORT.read_text())
    one = nodes_projection.project(measured, 1, 50e9, "full", "strong")
    assert one["comm_s"] == 0
    assert one["step_s"] == pytest.approx(measured["median_after_step_1"]["step_s"], rel=0.01)
    expected = measured["median_after_step_1"]["tokens_per_s_per_gpu"]
    assert one["tokens_per_s_per_gpu"] == pytest.approx(expected, rel=0.01)


def test_the_bytes_across_a_link() -> None:
    # full shard, 2 nodes: 10 micro-batches x 2 bf16 gathers of 1e9 parameters (40e9 B) and one
    # fp32 reduce-scatter of the gradients a step (4e9 B): 44e9 B, half of it across the link:
    # 22e9 B at 10e9 B/s = 2.2 s
    full = nodes_projection.project(report(), 2, 10e9, "full", "weak")
    assert full["comm_s"] == pytest.approx(2.2)
    # hybrid: one fp32 all-reduce of the gradients, 2 x (n-1)/n of 4e9 B = 4e9 B: 0.4 s
    hybrid = nodes_projection.project(report(), 2, 10e9, "hybrid", "weak")
    assert hybrid["comm_s"] == pytest.approx(0.4)
    # weak: the same work a GPU (33 s) plus the link; strong: the optimisation and rewards shrink
    assert hybrid["step_s"] == pytest.approx(33.4)
    strong = nodes_projection.project(report(), 2, 10e9, "hybrid", "strong")
    assert strong["step_s"] == pytest.approx(10 + 1 + 1 + 10 + 0.4)
    assert strong["tokens_per_s_per_gpu"] == pytest.approx(100 * 400 / (22.4 * 8))
    # a plan that reduced every micro-batch (whole gradients did not fit): 10 fp32
    # reduce-scatters a step instead of one, 40e9 + 40e9 B, half across: 4.0 s
    every = report()
    every["memory_plan"]["reduce_every_micro_batch"] = True
    assert nodes_projection.project(every, 2, 10e9, "full", "weak")["comm_s"] == pytest.approx(4.0)


def test_the_table_prints(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    assert nodes_projection.main([str(REPORT), "--nodes", "1", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2 * 2 and "| scaling |" in capsys.readouterr().out


def test_measured_collectives_replace_the_model_of_them(tmp_path, capsys) -> None:
    # 8 GB a process a step measured (the flight recorder's), half across the link on 2 nodes
    measured = report()
    measured["median_after_step_1"]["collective_gb_per_process"] = 8.0
    full = nodes_projection.project(measured, 2, 10e9, "full", "weak", measured=True)
    assert full["comm_s"] == pytest.approx(0.4)
    hybrid = nodes_projection.project(measured, 2, 10e9, "hybrid", "weak", measured=True)
    assert hybrid["comm_s"] == pytest.approx(0.4)  # the gradients' all-reduce, as modelled
    with pytest.raises(ValueError, match="TORCH_FR_BUFFER_SIZE"):
        nodes_projection.project(report(), 2, 10e9, "full", "weak", measured=True)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(measured))
    assert nodes_projection.main([str(path), "--nodes", "2", "--measured"]) == 0
    assert "8.0 GB measured, 44.0 GB modelled" in capsys.readouterr().out
    path.write_text(json.dumps(report()))
    with pytest.raises(SystemExit):
        nodes_projection.main([str(path), "--measured"])
    assert "TORCH_FR_BUFFER_SIZE" in capsys.readouterr().err
