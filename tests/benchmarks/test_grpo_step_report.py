"""The step report (benchmarks/grpo_step_report.py) read from a stage's own files: the medians
leave step 1 out, and a one-step-off run's last step too (nothing was sampled beside it); the
training phase's MFU counts the GPUs that train, not a vLLM server's, on every node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.grpo_step_report import report, split_balance


def stage(
    where: Path,
    step_s: list[float],
    overlap: dict | None,
    processes: int,
    world: int | None = None,
    generation_s: float = 0.0,
) -> Path:
    """A finished stage's files: steps of 1,000 tokens each, optimisation 10 s a step,
    `generation_s` of sampling; `processes` this node's training processes, `world` every
    node's (the plan's)."""
    where.mkdir(parents=True)
    n = len(step_s)
    stats = {
        "timing": {
            "step_s": step_s,
            "generation_step_s": [generation_s] * n,
            "reward_step_s": [0.0] * n,
            "weight_sync_step_s": [0.0] * n,
            "optimisation_step_s": [10.0] * n,
        },
        "processes": processes,
        "plan": {"processes": world or processes},
        **({"overlap": overlap} if overlap else {}),
    }
    config = {"mode": "single_turn", "preset": "paper", "lora": {}, "overrides": {}}
    (where / "MANIFEST.json").write_text(json.dumps({"stats": stats, "spec": {"config": config}}))
    history = [
        {"step": i + 1, "loss": 0.0, "num_tokens": 1000 * (i + 1), "completions/mean_length": 10}
        for i in range(n)
    ]
    (where / "log_history.json").write_text(json.dumps(history))
    (where / "config.json").write_text(
        json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "intermediate_size": 128, "vocab_size": 1000})
    )  # fmt: skip
    return where


def test_the_medians_leave_out_step_1_and_a_one_step_off_runs_last_step(tmp_path):
    steps = [30.0, 20.0, 22.0, 12.0]
    synchronous = report(stage(tmp_path / "sync", steps, None, 2), 2, 989.0, None)
    assert synchronous["median_after_step_1"]["step_s"] == 20.0  # steps 2-4
    one_step_off = report(
        stage(tmp_path / "async", steps, {"mode": "one step off"}, 2), 2, 989.0, None
    )
    assert one_step_off["median_after_step_1"]["step_s"] == 21.0  # steps 2-3


# a peak of 1e-4 TFLOP/s: the tiny stage's model work a visible share of it (at an H100's 989
# every MFU rounds to 0.0 and any two compare equal)
PEAK = 1e-4


def test_the_training_phase_mfu_counts_the_gpus_that_train(tmp_path):
    both = report(stage(tmp_path / "both", [10.0] * 3, None, 2), 2, PEAK, None)
    beside_a_server = report(stage(tmp_path / "one", [10.0] * 3, None, 1), 2, PEAK, None)
    rows, split = both["steps"], beside_a_server["steps"]
    # the same tokens a second over both GPUs; the same model work on one GPU instead of two
    assert [r["tokens_per_s_per_gpu"] for r in rows] == [r["tokens_per_s_per_gpu"] for r in split]
    assert rows[1]["mfu_training_phase"] > 0.01
    assert split[1]["mfu_training_phase"] == pytest.approx(
        2 * rows[1]["mfu_training_phase"], rel=0.02
    )


def test_the_mfu_of_a_run_over_two_nodes_counts_every_nodes_gpus(tmp_path):
    """Node 0's stage of 2 nodes x 2 GPUs says 2 processes (its own) and a plan of 4: its model
    work ran on 4 GPUs, as on 1 node x 4 (it had read 2, and doubled the MFU)."""
    one_node = report(stage(tmp_path / "one", [10.0] * 3, None, 4), 4, PEAK, None)
    node_0 = report(stage(tmp_path / "two", [10.0] * 3, None, 2, world=4), 4, PEAK, None)
    assert one_node["steps"][1]["mfu_training_phase"] > 0.01
    assert node_0["steps"][1]["mfu_training_phase"] == one_node["steps"][1]["mfu_training_phase"]


def test_a_synchronous_run_names_the_split_that_balances_its_phases(tmp_path):
    """Goal 1's synchronous run on 4 H200s (generation 8.3 s, optimisation 19.3 s a step) puts
    1 GPU on generation, as the measured split did (3 + 1: balanced); NeMo-RL's shape, with
    generation as long as optimisation, 2 + 2. Read from the stage's files; not for a run that
    was already split or one step off, nor for one GPU."""
    assert split_balance(8.3, 19.3, 4) == {
        "vllm_server_gpus": 1,
        "training_gpus": 3,
        "generation_s": 33.2,
        "optimisation_s": 25.7,
        "step_s": 33.2,
    }
    assert split_balance(60.0, 60.0, 4)["vllm_server_gpus"] == 2
    assert split_balance(30.0, 2.0, 8)["vllm_server_gpus"] == 7
    assert split_balance(8.3, 19.3, 1) is None
    colocated = report(
        stage(tmp_path / "sync", [40.0] * 3, None, 4, generation_s=10.0), 4, PEAK, None
    )
    assert colocated["split_balance"]["vllm_server_gpus"] == 2  # 10 s against 10 s
    split = report(stage(tmp_path / "split", [40.0] * 3, None, 3, generation_s=10.0), 4, PEAK, None)
    assert split["split_balance"] is None  # 3 of the 4 GPUs trained: already split
    overlapped = report(
        stage(tmp_path / "async", [40.0] * 4, {"mode": "one step off"}, 4, generation_s=10.0),
        4,
        PEAK,
        None,
    )
    assert overlapped["split_balance"] is None
