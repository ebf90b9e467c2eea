"""The learning check's aggregate and report on hand-made seed results: cells, paired differences
and verdicts, both protocols, a failed bf16 mode, repeats of a seed, the written report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.learning_check.aggregate import aggregate
from experiments.learning_check.report import aggregate_dirs, render
from experiments.learning_check.runs import load_runs, split_runs

GROUPS = {"rl_kinds": "RL kinds", "unseen_kinds": "never-seen kinds"}
N = 4  # samples per problem


def problems(correct: dict[str, list[int]], stop: dict[str, list[int]] | None = None) -> dict:
    """Evaluation problems: p0..p3 are RL kinds (two kinds), q0..q3 never-seen kinds;
    `correct[group]` = correct samples per turn of every problem of the group."""
    out = {}
    for group, prefix, kinds in (
        ("rl_kinds", "p", ("a/x", "b/y")),
        ("unseen_kinds", "q", ("c/z",)),
    ):
        for i in range(4):
            c = correct[group]
            out[f"{prefix}{i}"] = {
                "group": group,
                "kind": kinds[i % len(kinds)],
                "n": N,
                "c": list(c),
                "c_stop": list((stop or correct)[group]),
            }
    return out


def run(seed: int, label: str, evaluation: dict, training: dict | None = None, **extra) -> dict:
    return {
        "check": "learning_check_seed",
        "seed": seed,
        "label": label,
        "status": "done",
        "settings": {
            "turns": 2,
            "sft_steps": 3,
            "sft_batch": 2,
            "sft_examples": 8,
            "rl_problems": 2,
        },
        "machine": {"device": "cpu", "cpus": 2},
        "groups": GROUPS,
        "kinds": {"rl_kinds": ["a/x", "b/y"], "unseen_kinds": ["c/z"], "sft_kinds": ["d/w"]},
        "modes": ["single_turn", "cobalt", "cobalt_bf16"],
        "training": training or {},
        "evaluation": {m: {"problems": p, "transitions": []} for m, p in evaluation.items()},
        "fingerprints": {"sft_weights": f"w{seed}", "eval_sft_texts": f"t{seed}"},
        "phases_s": {"sft": 10.0 + seed},
        "gpu_memory_gib": {},
        "wall_s": 100.0,
        **extra,
    }


def seed_result(seed: int, label: str | None = None, bf16_ok: bool = True) -> dict:
    evaluation = {
        "sft": problems({"rl_kinds": [2, 1, 0], "unseen_kinds": [0, 0, 0]}),
        "single_turn": problems({"rl_kinds": [4, 2, 2], "unseen_kinds": [0, 0, 0]}),
        # cobalt: better at the later turns of the RL kinds only under METHOD §1.2
        "cobalt": problems(
            {"rl_kinds": [4, 4, 4], "unseen_kinds": [0, 0, 0]},
            stop={"rl_kinds": [4, 2, 2], "unseen_kinds": [0, 0, 0]},
        ),
    }
    completed = {"outcome": "completed", "rows": 10, "steps": 3, "completions_sampled": 24,
                 "completions_trained": 24, "cost": {"wall_s": 5.0 + seed, "gpu_s": None,
                 "gpu_busy_s": None, "gpu_peak_memory_gib": None},
                 "step_time": {"reward_share": 0.05},
                 "step_time_per_step": [{"total": 1.0}] * 2 + [{"total": 2.0 + seed}] * 3,
                 "curve": [{"rewards/correctness/mean": 0.1 * i} for i in range(3)]}  # fmt: skip
    training = {"single_turn": completed, "cobalt": completed}
    if bf16_ok:
        evaluation["cobalt_bf16"] = evaluation["cobalt"]
        training["cobalt_bf16"] = completed
    else:
        training["cobalt_bf16"] = {"outcome": "non_finite", "error": "step 7: grads not finite"}
    return run(seed, label or f"seed{seed}", evaluation, training)


def cells(summary: dict) -> dict:
    return {(c["protocol"], c["group"], c["turn"], c["model"]): c for c in summary["cells"]}


def diffs(summary: dict) -> dict:
    return {
        (d["a"], d["b"], d["protocol"], d["group"], d["turn"]): d for d in summary["differences"]
    }


def test_cells_differences_and_verdicts() -> None:
    summary = aggregate([seed_result(0), seed_result(1), seed_result(2, bf16_ok=False)], 400)
    assert summary["seeds"] == [0, 1, 2]
    assert summary["models"] == ["sft", "single_turn", "cobalt", "cobalt_bf16"]
    c = cells(summary)
    assert [c[("spec", "rl_kinds", t, "sft")]["mean"] for t in range(3)] == [50.0, 25.0, 0.0]
    top = c[("spec", "rl_kinds", 2, "cobalt")]
    assert (top["mean"], top["low"], top["high"], top["seeds"], top["values"]) == (
        100.0, 100.0, 100.0, 3, 12,
    )  # fmt: skip
    assert c[("stop", "rl_kinds", 2, "cobalt")]["mean"] == 50.0  # the stop protocol's counts
    assert c[("spec", "rl_kinds", 0, "cobalt_bf16")]["seeds"] == 2  # seed 2's bf16 run broke

    d = diffs(summary)
    assert d[("cobalt", "single_turn", "spec", "rl_kinds", 2)]["mean"] == 50.0
    assert d[("cobalt", "single_turn", "spec", "rl_kinds", 2)]["verdict"] == "cobalt ahead"
    assert d[("cobalt", "single_turn", "stop", "rl_kinds", 2)]["verdict"] == "no difference"
    assert d[("cobalt", "single_turn", "spec", "rl_kinds", 0)]["verdict"] == "no difference"
    assert d[("cobalt_bf16", "cobalt", "spec", "rl_kinds", 2)]["seeds"] == 2
    assert d[("single_turn", "sft", "spec", "rl_kinds", 0)]["verdict"] == "single_turn ahead"
    assert d[("single_turn", "sft", "spec", "unseen_kinds", 0)]["verdict"] == "no difference"
    assert ("offline", "single_turn", "spec", "rl_kinds", 0) not in d  # not run

    training = summary["training"]
    assert training["cobalt_bf16"]["outcomes"] == {"completed": 2, "non_finite": 1}
    assert training["cobalt_bf16"]["errors"] == {2: "step 7: grads not finite"}
    assert training["cobalt"]["step_s_median"] == {"mean": 3.0, "min": 2.0, "max": 4.0}
    assert training["cobalt"]["curve_mean"] == [0.0, 0.1, 0.2]
    # a straight line 0, 0.1, 0.2: std 0.1 across steps, jitter 0.1 / sqrt 2 = 0.0707
    assert training["cobalt"]["curve_std"] == {"mean": 0.1, "min": 0.1, "max": 0.1}
    assert training["cobalt"]["curve_jitter"]["mean"] == pytest.approx(0.0707, abs=1e-4)
    kinds = {(k["kind"], k["model"]): k for k in summary["per_kind"]}
    assert (
        kinds[("a/x", "sft")]["mean"] == [50.0, 25.0, 0.0] and kinds[("a/x", "sft")]["seeds"] == 3
    )

    text = render(summary)
    assert "| RL kinds | 2 | 0.0 [0.0, 0.0] | 50.0 [50.0, 50.0] | 100.0 [100.0, 100.0] |" in text
    assert "| cobalt − single_turn | RL kinds | 2 | +50.0 [+50.0, +50.0] | cobalt ahead |" in text
    assert "non_finite 1" in text and "step 7: grads not finite" in text


def test_repeats_measure_the_same_seed_spread(tmp_path: Path) -> None:
    first, second = tmp_path / "call1", tmp_path / "call2"
    again = seed_result(0, "seed0")
    changed = seed_result(0, "seed0-r1")
    changed["evaluation"]["cobalt"]["problems"]["p0"]["c"] = [3, 4, 4]  # one sample differs
    changed["fingerprints"]["eval_sft_texts"] = "other"
    for directory, docs in ((first, [seed_result(0), seed_result(1)]), (second, [again, changed])):
        (directory / "runs").mkdir(parents=True)
        for doc in docs:
            (directory / "runs" / f"{doc['label']}.json").write_text(json.dumps(doc))
    (second / "runs" / "notes.json").write_text("{}")  # not a seed result: ignored

    runs = load_runs([first, second])
    assert [(r["label"], Path(r["source"]).name) for r in runs] == [
        ("seed0", "call1"), ("seed1", "call1"), ("seed0", "call2"), ("seed0-r1", "call2"),
    ]  # fmt: skip
    primary, repeats = split_runs(runs)
    assert [primary[s]["source"] for s in (0, 1)] == [str(first), str(first)]
    assert len(repeats) == 2

    text = aggregate_dirs([first, second], tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "learning_check.json").read_text())
    assert summary["seeds"] == [0, 1]
    same, differ = summary["spread"]
    assert same["cells_identical"] == same["cells"] > 0 and same["max_abs_pp"] == 0.0
    assert same["problems_identical_pct"] == 100.0
    assert all(same["fingerprints_equal"].values())
    assert differ["max_abs_pp"] == pytest.approx(100 * 0.25 / 4, abs=0.01)  # 1 of 4 problems
    assert differ["fingerprints_equal"] == {"sft_weights": True, "eval_sft_texts": False}
    assert "## Same seed, twice" in text and "differ: eval_sft_texts" in text
    for png in ("pass_at_1.png", "differences.png", "reward_curves.png"):
        assert (tmp_path / "out" / png).read_bytes().startswith(b"\x89PNG")


def test_a_run_without_evaluations_and_no_runs() -> None:
    killed = run(3, "seed3", {}, status="killed")
    summary = aggregate([killed])
    assert (
        summary["models"] == []
        and summary["cells"] == []
        and summary["runs"][0]["status"] == "killed"
    )
    assert "# Learning check" in render(summary)
    with pytest.raises(ValueError, match="no seed results"):
        aggregate([])


def test_every_report_states_the_same_seed_repeat(tmp_path: Path) -> None:
    """No repeat: the report says so and how to get one. A repeat: identical (every cell and
    fingerprint) or not, with the cells that differ and the likely cause."""
    alone = aggregate([seed_result(0)], 200)
    assert alone["spread"] == [] and "--repeat 0" in alone["repeat_hint"]
    assert "## Same seed, twice" in render(alone) and "`--repeat 0`" in render(alone)

    strict = {"deterministic_algorithms": True, "warn_only": False, "strict": True}
    loose = {"deterministic_algorithms": True, "warn_only": True, "strict": False}
    a = seed_result(0) | {"determinism": strict}
    same = seed_result(0, "seed0-r1") | {"determinism": strict}
    summary = aggregate([a, same], 200)
    (r,) = summary["spread"]
    assert r["identical"] is True and r["differing_cells"] == [] and r["cause"] is None
    assert "- Seed 0 (seed0 and seed0-r1): identical, every cell and every fingerprint." in render(
        summary
    )

    other = seed_result(0, "seed0-r1") | {"determinism": loose}
    other["evaluation"]["cobalt"]["problems"]["p0"]["c"] = [3, 4, 4]  # one sample, turn 0
    other["fingerprints"]["eval_sft_texts"] = "other"
    (r,) = aggregate([a, other], 200)["spread"]
    assert r["identical"] is False and r["first_differing_fingerprint"] == "eval_sft_texts"
    # (cobalt_bf16's evaluation is cobalt's in these hand-made runs: both differ)
    assert r["differing_cells"] == [
        {"model": m, "protocol": "spec", "group": "rl_kinds", "turn": 0, "a": 100.0, "b": 93.75}
        for m in ("cobalt", "cobalt_bf16")
    ]
    assert r["cause"].startswith("strict determinism off in seed0-r1")
    text = render(aggregate([a, other], 200))
    assert f"| 0 | seed0 / seed0-r1 | no | {r['cells'] - 2} of {r['cells']} |" in text
    assert "not identical; 2 cells differ (cobalt rl_kinds turn 0 (spec) 100.0 vs 93.8" in text

    # both strict: other settings, then other code, are named
    changed = seed_result(0, "seed0-r1") | {"determinism": strict}
    changed["evaluation"]["cobalt"]["problems"]["p0"]["c"] = [3, 4, 4]
    changed["settings"] = changed["settings"] | {"rl_problems": 3, "label": "x"}
    (r,) = aggregate([a, changed], 200)["spread"]
    assert r["cause"] == "different settings: rl_problems"
    changed["settings"] = a["settings"]
    changed["machine"] = a["machine"] | {"code": "other"}
    (r,) = aggregate([a, changed], 200)["spread"]
    assert r["cause"] == "different code, libraries or machine: code"


def test_gain_per_gpu_second_from_known_numbers() -> None:
    """single_turn gains +50 points at turn 0 on the RL kinds (2 of 4 -> 4 of 4 samples) and 0
    at turn 2 (0 -> 2 of 4: +50 too); cobalt +50 / +100. GPU seconds 20 and 40 (mean of 10 and
    30 for cobalt): per 100 GPU s, 250 and 125 points at turn 0."""
    runs = [seed_result(0), seed_result(1)]
    for r in runs:
        for mode, gpu_s in (("single_turn", 20.0), ("cobalt", 10.0 + 20.0 * r["seed"])):
            r["training"][mode] = r["training"][mode] | {
                "cost": {"wall_s": 99.0, "gpu_s": gpu_s, "gpu_busy_s": None,
                         "gpu_peak_memory_gib": None},
            }  # fmt: skip
    summary = aggregate(runs, 200)
    rows = {(g["mode"], g["turn"]): g for g in summary["gain_per_cost"]}
    single, cobalt = rows[("single_turn", 0)], rows[("cobalt", 2)]
    assert single["cost_unit"] == "GPU s" and single["seeds"] == 2
    assert single["gain"] == {"mean": 50.0, "low": 50.0, "high": 50.0}
    assert single["per_100_s"] == {"mean": 250.0, "low": 250.0, "high": 250.0}
    assert cobalt["cost_s"] == {"mean": 20.0, "min": 10.0, "max": 30.0}
    assert cobalt["gain"]["mean"] == 100.0 and cobalt["per_100_s"]["mean"] == 500.0
    assert rows[("cobalt", 0)]["per_100_s"]["mean"] == 250.0
    text = render(summary)
    assert "## Gain per cost (RL kinds, METHOD §1.2)" in text
    assert "| single_turn | 0 | 2 | +50.0 [+50.0, +50.0] | 20.0 [20.0, 20.0] GPU s | " in text
    assert "+250.00 [+250.00, +250.00] |" in text
    # no GPU: wall seconds, and the unit says so
    cpu = aggregate([seed_result(0)], 200)["gain_per_cost"]
    assert {g["cost_unit"] for g in cpu} == {"wall s"}


def test_curve_stability_from_hand_worked_curves() -> None:
    from experiments.learning_check.run_stats import curve_stability

    # alternating 0, 1, 0, 1: std 0.5774 (sample std), every step moves 1: jitter 1/sqrt 2
    assert curve_stability([0, 1, 0, 1]) == {"std": 0.5774, "jitter": 0.7071}
    # a steady climb is not noise: a large std across steps, a small jitter
    climb = curve_stability([0.0, 0.25, 0.5, 0.75, 1.0])
    assert climb["jitter"] == pytest.approx(0.25 / 2**0.5, abs=1e-4)
    assert climb["jitter"] < climb["std"] == pytest.approx(0.3953, abs=1e-4)
    assert curve_stability([0.3]) is None and curve_stability([None, 0.2]) is None
    assert curve_stability([0.2, None, 0.2]) == {"std": 0.0, "jitter": 0.0}


def test_a_later_call_with_other_modes_of_the_same_sft_model_continues_the_seed(
    tmp_path: Path,
) -> None:
    """One seed's modes spread over two calls: the second run (same SFT weights, only modes the
    first lacks) adds its modes to the seed instead of counting as a repeat; a run from another
    SFT model, or one that retrains a mode, stays a repeat."""
    first_call, second_call = tmp_path / "call1", tmp_path / "call2"
    base = seed_result(0)
    base["training"]["multi_turn"] = {"outcome": "failed", "error": "ValueError: a bug"}
    base["phases_s"]["train_multi_turn"] = 0.1  # the failed attempt
    more_sft = problems({"rl_kinds": [2, 1, 0], "unseen_kinds": [0, 0, 0]})
    more = run(
        0,
        "seed0",
        {
            "sft": more_sft,
            "multi_turn": problems({"rl_kinds": [3, 3, 3], "unseen_kinds": [0, 0, 0]}),
        },
        {"multi_turn": base["training"]["cobalt"]},
        fingerprints={"sft_weights": "w0", "multi_turn_weights": "m0"},
        phases_s={"sft": 10.0, "train_multi_turn": 4.0},
    )
    other_sft = run(0, "seed0-r1", {"sft": more_sft, "multi_turn": more_sft},
                    fingerprints={"sft_weights": "other"})  # fmt: skip
    for directory, docs in ((first_call, [base]), (second_call, [more, other_sft])):
        (directory / "runs").mkdir(parents=True)
        for doc in docs:
            (directory / "runs" / f"{doc['label']}.json").write_text(json.dumps(doc))

    primary, repeats = split_runs(load_runs([first_call, second_call]))
    merged = primary[0]
    assert set(merged["evaluation"]) == {
        "sft",
        "single_turn",
        "cobalt",
        "cobalt_bf16",
        "multi_turn",
    }
    assert merged["evaluation"]["sft"] == base["evaluation"]["sft"]  # the primary's SFT cells
    assert merged["fingerprints"]["multi_turn_weights"] == "m0"
    assert merged["phases_s"]["train_multi_turn"] == 4.0
    assert merged["training"]["multi_turn"]["outcome"] == "completed"  # over the failed attempt
    assert merged["training"]["cobalt_bf16"] == base["training"]["cobalt_bf16"]
    assert [r["label"] for r in repeats] == ["seed0-r1"]  # another SFT model: a repeat

    summary = aggregate(load_runs([first_call, second_call]), iterations=200)
    d = diffs(summary)
    assert d[("cobalt", "multi_turn", "spec", "rl_kinds", 2)]["mean"] == pytest.approx(25.0)
    info = {(r["label"], Path(r["source"]).name): r for r in summary["runs"]}
    assert info[("seed0", "call1")]["primary"]
    assert info[("seed0", "call2")]["continues_primary"] and not info[("seed0", "call2")]["primary"]
    assert not info[("seed0-r1", "call2")]["continues_primary"]
    text = render(summary)
    assert "continued from the same SFT model (more modes): seed0 in" in text

    # a run that trains a mode the primary already has is a repeat, not a continuation
    again = seed_result(0)
    (second_call / "runs" / "seed0.json").write_text(json.dumps(again))
    _, repeats = split_runs(load_runs([first_call, second_call]))
    assert {r["label"] for r in repeats} == {"seed0", "seed0-r1"}


def test_a_broken_seed_result_names_its_file_and_field(tmp_path: Path, capsys) -> None:
    """The seed result is the contract between the runs and the aggregate
    (`experiments.learning_check.results`): a document that claims to be one and breaks it
    stops the aggregate with one line naming the file and the field; other JSON is passed over."""
    from experiments.learning_check.__main__ import main

    runs = tmp_path / "call" / "runs"
    runs.mkdir(parents=True)
    (runs / "seed0.json").write_text(json.dumps(seed_result(0)))
    (runs / "notes.json").write_text(json.dumps({"check": "something else"}))
    assert [r["label"] for r in load_runs([tmp_path / "call"])] == ["seed0"]
    broken = seed_result(1)
    del broken["evaluation"]["cobalt"]["problems"]["p2"]["c_stop"]
    (runs / "seed1.json").write_text(json.dumps(broken))

    assert main(["--aggregate", str(tmp_path / "call"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {runs / 'seed1.json'}: evaluation.cobalt.problems.p2.c_stop: ")
    assert "Field required" in err and "\n" not in err
    assert not (tmp_path / "out" / "REPORT.md").exists()
