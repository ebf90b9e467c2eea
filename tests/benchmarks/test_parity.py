"""The parity harness (benchmarks/parity.py) on CPU processes over gloo, the product's launcher
and trainers: GRPO with two optimizer steps per generation batch and the offline objective train
the same weights on 2 processes as on 1 (to reduction-order noise: the bound is 1e-3 of the
update, measured ~3e-6), and a 2-process run killed after its first checkpoint and resumed ends
with the uninterrupted run's weights."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import parity


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["grpo", "offline"])
def test_two_processes_train_what_one_trains_and_a_resume_what_a_run_trains(mode, tmp_path):
    out = tmp_path / "parity.json"
    code = parity.main(["--mode", mode, "--kill-resume", "2:ddp", "--json", str(out)])
    result = json.loads(out.read_text())
    rows = {r["layout"].split(" ")[0] + (" resumed" if "resumed" in r["layout"] else ""): r
            for r in result["rows"]}  # fmt: skip
    assert code == 0 and result["ok"], result["rows"]
    two, resumed = rows["2:ddp"], rows["2:ddp resumed"]
    assert two["steps"] == resumed["steps"] == 4 and resumed["killed"]
    assert two["weights_rel"] <= 1e-3 and resumed["weights_rel"] <= 1e-3
    assert two["update_max_abs"] > 1e-5  # the runs trained


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_of_one_process_train_what_one_node_of_two_trains(tmp_path):
    """Two launchers with node ranks 0 and 1 meeting at one rendezvous (two machines, here on
    one host) against one node of two processes: the same losses and weights."""
    out = tmp_path / "parity.json"
    code = parity.main(["--layouts", "2:ddp", "2x1:ddp", "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0 and result["ok"], result["rows"]
    nodes = next(r for r in result["rows"] if r["layout"] == "2x1:ddp")
    assert nodes["steps"] == 4 and nodes["weights_rel"] <= 1e-3 and nodes["loss_max_rel"] <= 1e-3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zero3_trains_what_one_process_trains(tmp_path):
    """DeepSpeed ZeRO-3 on two CPU processes (gloo), the paper preset (k2 KL, trimmed padding,
    gradient checkpointing) in fp32: the same per-step losses and the same saved weights as one
    process. The saved policy is ZeRO-3's float32 master copy gathered from its shards
    (`cobalt.training.weights.master_weights`)."""
    out = tmp_path / "parity.json"
    code = parity.main(["--layouts", "1", "2:zero3", "1@2", "--preset", "paper", "--precision",
                        "fp32", "--lr", "1e-5", "--json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert code == 0 and result["ok"], result["rows"]
    rows = {r["layout"]: r for r in result["rows"]}
    zero3, regrouped = rows["2:zero3"], rows["1@2"]
    assert zero3["steps"] == 4 and zero3["weights_rel"] <= 1e-3 and zero3["update_max_abs"] > 1e-6
    # one process in micro-batches of 2 instead of 4 (the GPU yardstick's layout): in fp32 the
    # same step to rounding noise, trimmed padding regrouped included
    assert regrouped["steps"] == 4 and regrouped["weights_rel"] <= 1e-3


def test_a_layout_names_its_micro_batch_and_a_bad_one_is_refused():
    args = argparse.Namespace(
        preset="paper", precision="fp32", steps=4, mode="grpo", step=16, micro_batch=4,
        windows=2, lr=1e-5)  # fmt: skip
    base = parity.base_config(args)
    config = parity.layout_config(base, "2:fsdp@8")
    assert (config.num_processes, config.sharding) == (2, "fsdp")
    assert config.overrides["per_device_train_batch_size"] == 8
    assert config.overrides["gradient_accumulation_steps"] == 2
    assert config.overrides["generation_batch_size"] == base.overrides["generation_batch_size"]
    with pytest.raises(SystemExit, match="do not split into micro-batches of 3"):
        parity.layout_config(base, "1@3")
    offline = parity.base_config(argparse.Namespace(**{**vars(args), "mode": "offline"}))
    config = parity.layout_config(offline, "1@2")
    assert (config.offline.batch_size, config.offline.gradient_accumulation_steps) == (2, 8)
