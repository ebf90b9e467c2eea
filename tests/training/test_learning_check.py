"""The GPU learning check's code path on CPU: `scripts/learning_check.py --smoke` (SFT, reference
trajectories, bandit rows, both GRPO modes, the offline mode, before/after evaluation, cost,
report and plots)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_learning_check_smoke(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "learning_check.py"), "--smoke", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    report = json.loads((out / "learning_check.json").read_text())
    settings = report["settings"]
    assert settings["smoke"] is True and settings["device"] == "cpu"
    assert report["sandbox_backend"] in ("namespace", "docker")
    # the three kind groups are disjoint; SFT never saw the RL or never-seen kinds
    kinds = report["kinds"]
    assert not set(kinds["rl"]) & set(kinds["unseen"])
    assert not (set(kinds["rl"]) | set(kinds["unseen"])) & set(kinds["sft"])
    assert report["sft"]["stats"]["steps"] >= 1
    assert report["sft"]["recipe"]["held_out"] == kinds["rl"] + kinds["unseen"]

    # the reference trajectories made a bandit dataset with a turn-0 row per kept problem
    bandit = report["bandit"]
    assert bandit["rows"] >= bandit["turn0_rows"] == bandit["problems_kept"] >= 1

    # before and after each mode: per-turn Pass@1 for every group, on the same problems
    turns = settings["turns"]
    expected = {
        "rl_kinds": settings["eval_problems"],
        "unseen_kinds": settings["eval_problems"],
        "sft_kinds": settings["eval_sft_problems"],
    }
    assert set(report["evaluation"]) == {"sft", "single_turn", "cobalt", "offline"}
    for name, ev in report["evaluation"].items():
        rows = ev["tables"]["by_group"]
        assert {(r["difficulty"], r["turn"]) for r in rows} == {
            (g, t) for g in expected for t in range(turns + 1)
        }, name
        for r in rows:
            assert r["problems"] == expected[r["difficulty"]], (name, r)
            assert r["samples"] == r["problems"] * settings["eval_n"], (name, r)
            assert 0.0 <= r["pass@1"] <= 100.0, (name, r)
        assert ev["stats"]["completions"] == sum(expected.values()) * settings["eval_n"] * (
            turns + 1
        ) - sum(ev["stats"]["outcomes"].get(k, 0) for k in ("engine_error", "context_overflow"))

    # both modes trained the same number of steps on the same generation budget
    training = report["training"]
    assert report["budget_equal"] is True
    for mode in ("single_turn", "cobalt"):
        run = training[mode]
        assert run["steps"] == settings["rl_steps"] == 2
        assert run["completions_sampled"] == 2 * settings["rl_prompts"] * settings["rl_generations"]
        assert [c["step"] for c in run["curve"]] == [1, 2]
        for c in run["curve"]:
            assert -1.0 <= c["rewards/correctness/mean"] <= 1.0
        timing = run["step_time"]
        assert timing["steps"] == 2 and timing["generation_s"] > 0
        shares = [timing[f"{b}_share"] for b in ("generation", "reward", "optimisation")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
        assert run["reward_wait_goal_met"] == (timing["reward_share"] < 0.10)
    single, cobalt = training["single_turn"], training["cobalt"]
    assert single["rows"] == single["turn0_rows"] == cobalt["turn0_rows"] >= 1
    assert cobalt["rows_before_length_filter"] == bandit["rows"] >= cobalt["rows"] >= single["rows"]

    # offline: every logged turn of the same reference trajectories, as many rows per step as
    # GRPO samples completions, nothing generated; every mode's cost recorded
    offline, logged = training["offline"], report["offline"]
    n_turns = settings["rl_problems"] * settings["n"] * (turns + 1)
    assert logged["rows"] == offline["rows_total"] and 0 < logged["rows"] <= n_turns
    assert offline["objective"] == "reinforce_loo" and offline["completions_sampled"] == 0
    assert offline["steps"] == settings["rl_steps"]
    assert offline["completions_trained"] == single["completions_sampled"]
    assert report["offline_budget_equal"] is True
    assert [c["step"] for c in offline["curve"]] == [1, 2]
    assert all("weighted_advantage" in c and "loss" in c for c in offline["curve"])
    assert offline["step_time"]["generation_s"] == 0
    for mode in ("single_turn", "cobalt", "offline"):
        cost = training[mode]["cost"]
        assert cost["wall_s"] > 0 and cost["gpus"] == 0 and cost["gpu_s"] is None, mode

    text = (out / "REPORT.md").read_text()
    assert "| RL kinds | 0 |" in text and "| never-seen kinds | 2 |" in text
    assert "after single_turn" in text and "after cobalt" in text and "after offline" in text
    assert "## Offline run" in text and "| offline | " in text  # the cost table
    for png in ("reward_curves.png", "pass_at_1.png", "offline_curves.png"):
        data = (out / png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, png
