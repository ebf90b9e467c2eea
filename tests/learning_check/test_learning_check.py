"""The GPU learning check's code path on CPU, as the GPU plan runs it: two calls of `python -m
experiments.learning_check --smoke` (two seeds in parallel, then seed 0 again with one mode),
then `--aggregate` of both. Per seed: SFT, reference trajectories, bandit and offline rows, the four modes, the
evaluation before and after each under both protocols, repair transitions, cost. The aggregate:
intervals, differences, report, plots, and the same seed giving the same results twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cobalt.data import synthetic
from experiments.learning_check import results

ROOT = Path(__file__).resolve().parents[2]
TRAINED = ["single_turn", "cobalt", "offline", "offline_rloo", "offline_awr", "offline_clipped"]
# cobalt_bf16 (fp32 master weights, bf16 compute) needs a GPU; the multi-turn baselines run here
TRAINED += ["offline_grpo", "multi_turn", "multi_turn_dense"]
MODELS = ["sft", *TRAINED]
MODES = ["--modes", ",".join(TRAINED)]

pytestmark = pytest.mark.slow


def check(tmp_path: Path, *argv: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.learning_check", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    logs = "".join(p.read_text()[-3000:] for p in tmp_path.glob("*/logs/*.log"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    return proc.stdout


@pytest.mark.timeout(900)
def test_learning_check_smoke_two_calls_and_aggregate(tmp_path: Path) -> None:
    """Over 60 s: three learning-check runs (two seeds, then one with one mode), each an SFT fit,
    trajectories and trained modes in processes of their own."""
    first, second, merged = tmp_path / "call1", tmp_path / "call2", tmp_path / "merged"
    out = check(
        tmp_path, "--smoke", "--out", str(first), "--seeds", "0,1", "--parallel", "2", *MODES
    )
    assert "# Learning check" in out and "learning check: 2 runs" in out
    # seed 0 again, in another process: its SFT model and one mode suffice to show a repeat
    # gives the same results (the modes of a repeat are compared where both runs have them)
    check(tmp_path, "--smoke", "--out", str(second), "--seeds", "0", "--modes", "cobalt")

    # every seed result as the contract has it (results.read validates it)
    runs = {p.stem: results.read(p) for p in results.result_files(first)}
    assert set(runs) == {"seed0", "seed1"}
    for label, run in runs.items():
        check_seed_result(label, run)

    text = check(tmp_path, "--aggregate", str(first), str(second), "--out", str(merged))
    summary = json.loads((merged / "learning_check.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["models"] == MODELS
    assert [r["primary"] for r in summary["runs"]] == [True, True, False]
    groups, turns = summary["groups"], summary["turns"]
    assert len(summary["cells"]) == 2 * len(groups) * (turns + 1) * len(MODELS)
    for c in summary["cells"]:
        assert c["seeds"] == 2 and 0.0 <= c["low"] <= c["mean"] <= c["high"] <= 100.0, c
    pairs = {(d["a"], d["b"]) for d in summary["differences"]}
    assert {
        ("cobalt", "single_turn"),
        ("offline", "single_turn"),
        ("cobalt", "multi_turn"),
        ("multi_turn_dense", "multi_turn"),
    } <= pairs
    assert {("offline_awr", "offline_rloo"), ("offline_grpo", "offline_awr")} <= pairs
    assert all(d["verdict"] for d in summary["differences"])
    assert {(g["mode"], g["turn"]) for g in summary["gain_per_cost"]} == {
        (m, t) for m in TRAINED for t in (0, turns)
    }

    # the same seed twice (another call, another process): identical to the last bit
    (spread,) = summary["spread"]
    assert spread["seed"] == 0 and spread["cells_identical"] == spread["cells"] > 0
    assert spread["problems_identical_pct"] == 100.0
    prints = spread["fingerprints_equal"]
    assert {"sft_weights", "reference_texts", "eval_sft_texts", "eval_cobalt_texts"} <= set(prints)
    assert all(prints.values()), prints

    for heading in (
        "## Pass@1 (%), METHOD §1.2 protocol",
        "## Pass@1 (%), stop on public pass",
        "## Differences (percentage points, paired by seed and problem)",
        "## Per kind",
        "## What feedback turns do to programs",
        "## Training and cost per mode",
        "## Same seed, twice",
        "## Gain per cost (RL kinds, METHOD §1.2)",
        "## Offline modes: what they trained on and how the policy moved",
    ):
        assert heading in text, heading
    assert (
        "| cobalt − single_turn | RL kinds | 2 |" in text and "| multi_turn | completed 2 |" in text
    )
    assert (merged / "REPORT.md").read_text() in text
    assert "- Seed 0 (seed0 and seed0): identical, every cell and every fingerprint." in text
    for png in ("pass_at_1.png", "differences.png", "reward_curves.png", "gain_vs_cost.png"):
        data = (merged / png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, png


def check_seed_result(label: str, run: dict) -> None:
    settings = run["settings"]
    assert run["status"] == "done" and run["label"] == label
    assert settings["smoke"] is True and settings["device"] == "cpu"
    assert run["sandbox_backend"] in ("namespace", "docker")
    assert run["determinism"]["deterministic_algorithms"] is True
    # the kind groups are disjoint; SFT saw none of the held-out kinds
    kinds = run["kinds"]
    assert len(kinds["rl_kinds"]) == len(kinds["unseen_kinds"]) == 12
    assert not set(kinds["rl_kinds"]) & set(kinds["unseen_kinds"])
    assert not (set(kinds["rl_kinds"]) | set(kinds["unseen_kinds"])) & set(kinds["sft_kinds"])
    recipe = run["sft"]["recipe"]
    assert recipe["held_out"] == kinds["rl_kinds"] + kinds["unseen_kinds"]
    assert recipe["kinds"] == list(synthetic.ALL_KINDS)
    assert run["sft"]["stats"]["steps"] == settings["sft_steps"]  # steps decide, not the clock

    bandit = run["bandit"]
    assert bandit["rows"] >= bandit["turn0_rows"] == bandit["problems_kept"] >= 1

    # every model evaluated on the same problems: correct samples per turn, both protocols
    turns, n = settings["turns"], settings["eval_n"]
    expected = {
        "rl_kinds": settings["eval_problems"],
        "unseen_kinds": settings["eval_problems"],
        "sft_kinds": settings["eval_sft_problems"],
    }
    assert list(run["evaluation"]) == MODELS
    ids = None
    for name, ev in run["evaluation"].items():
        problems = ev["problems"]
        ids = ids or set(problems)
        assert set(problems) == ids, name
        for group, count in expected.items():
            assert sum(p["group"] == group for p in problems.values()) == count, (name, group)
        for p in problems.values():
            assert p["n"] == n and len(p["c"]) == len(p["c_stop"]) == turns + 1
            assert all(0 <= c <= n for c in p["c"] + p["c_stop"])
            assert p["kind"] in kinds[p["group"]]
        assert ev["stats"]["completions"] == sum(expected.values()) * n * (turns + 1) - sum(
            ev["stats"]["outcomes"].get(k, 0) for k in ("engine_error", "context_overflow")
        )
        # the smoke model writes no program: every step is wrong -> wrong after 'no code'
        steps = ev["transitions"]
        assert steps and {(s["feedback"], s["step"]) for s in steps} == {("no_code", "still_wrong")}
        assert sum(s["count"] for s in steps) == sum(expected.values()) * n * turns

    # equal budgets: the GRPO modes sample as many completions as the offline mode trains on
    training = run["training"]
    batch = settings["rl_prompts"] * settings["rl_generations"]
    for mode in ("single_turn", "cobalt", "multi_turn", "multi_turn_dense"):
        t = training[mode]
        assert t["outcome"] == "completed" and t["steps"] == settings["rl_steps"] == 2
        assert [c["step"] for c in t["curve"]] == [1, 2] and t["bf16"] is False
        if mode.startswith("multi_turn"):  # fewer conversations, turns + 1 completions each
            prompts = max(1, round(settings["rl_prompts"] / (turns + 1)))
            assert t["prompts_per_step"] == prompts
            assert t["completions_sampled"] == 2 * prompts * settings["rl_generations"] * (
                turns + 1
            )
        else:
            assert t["completions_sampled"] == 2 * batch
        timing = t["step_time"]
        shares = [timing[f"{b}_share"] for b in ("generation", "reward", "optimisation")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    assert training["multi_turn_dense"]["reward"] == "dense"
    assert training["multi_turn"]["reward"] == "correctness"
    single, cobalt, offline = training["single_turn"], training["cobalt"], training["offline"]
    assert single["rows"] == single["turn0_rows"] == cobalt["turn0_rows"] >= 1
    assert cobalt["rows_before_length_filter"] == bandit["rows"] >= cobalt["rows"] >= single["rows"]
    assert offline["outcome"] == "completed" and offline["completions_sampled"] == 0
    assert offline["completions_trained"] == single["completions_sampled"]
    assert run["offline"]["rows"] == offline["rows_total"]
    # the offline objectives from one SFT model; `offline` is the default objective's mode and
    # offline_grpo's offline phase the same computation (equal weights)
    prints = run["fingerprints"]
    for mode, objective in (("offline_rloo", "reinforce_loo"), ("offline_awr", "awr")):
        assert training[mode]["objective"] == objective and training[mode]["mode"] == mode
    assert training["offline"]["objective"] == settings["offline_objective"] == "awr"
    assert prints["offline_weights"] == prints["offline_awr_weights"]
    # every smoke advantage is 0: REINFORCE and PPO do not move, AWR (weight 1) does an SFT step
    # (the objectives on real advantages: tests/training/test_offline_trainer.py)
    assert (
        prints["offline_rloo_weights"] == prints["offline_clipped_weights"] == prints["sft_weights"]
    )
    assert prints["offline_awr_weights"] != prints["sft_weights"]
    both = training["offline_grpo"]
    assert both["offline_phase_mode"] == "offline_awr" and both["offline_phase_same_weights"]
    assert both["steps"] == settings["rl_steps"] + settings["offline_grpo_steps"]
    assert both["completions_sampled"] == settings["offline_grpo_steps"] * batch
    # its offline phase: offline_awr's weights (run before it), not trained again
    assert both["offline_phase"] == "reused from offline_awr"
    assert both["offline_phase_weights"] == prints["offline_awr_weights"]
    assert both["offline_phase_result"]["cost"] == training["offline_awr"]["cost"]
    phases = both["offline_phase_result"]["cost"]["wall_s"] + both["grpo_phase"]["cost"]["wall_s"]
    assert both["cost"]["wall_s"] == pytest.approx(phases, abs=1e-3)
    for key in ("kl_ref", "entropy", "negative_weight_share", "grad_norm"):
        assert key in training["offline_rloo"]["curve"][-1], key
    assert run["determinism"]["strict"] is False  # the CPU default (identical without it)
    for mode in TRAINED:
        cost = training[mode]["cost"]
        assert cost["wall_s"] > 0 and cost["gpus"] == 0 and cost["gpu_s"] is None, mode
        assert f"{mode}_weights" in run["fingerprints"] and f"train_{mode}" in run["phases_s"]
