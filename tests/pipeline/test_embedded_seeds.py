"""The embedded default's signal-or-noise tools: a run with another seed, the summary
line that judges each change against the default's measured spread, the paired before/after
plot, and `scripts/embedded_seeds.py` (its setting, its aggregate over seeds; real runs of two
seeds through the pipeline flow: tests/pipeline/test_seed_scan.py)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from cobalt.pipeline import PipelineParams, with_seed
from cobalt.seed_spread import DEFAULT_SPREAD, change_at, spread_for
from cobalt.trajectories.evaluation import plot_before_after

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location(
        "embedded_seeds", ROOT / "scripts/embedded_seeds.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_with_seed_changes_what_a_rerun_varies_and_nothing_else():
    base = PipelineParams()
    other = with_seed(base, 7)
    assert other.collect.sampling.seed == other.bandit.seed == other.training.seed == 7
    assert base.collect.sampling.seed == base.training.seed == 0  # the default is untouched
    rest = {"collect", "bandit", "training"}
    assert other.model_dump(exclude=rest) == base.model_dump(exclude=rest)
    assert other.training.model_dump(exclude={"seed"}) == base.training.model_dump(exclude={"seed"})
    assert other.reference == base.reference  # the fitted reference model stays


def row(turn: int, pass_at_1: float, problems: int = 60, samples: int | None = None) -> dict:
    """A per-turn 'all' row; samples: the embedded default's (60 problems x its n)."""
    samples = problems * PipelineParams().collect.sampling.n if samples is None else samples
    return {"turn": turn, "pass@1": pass_at_1, "problems": problems, "samples": samples}


def test_each_change_is_judged_against_the_defaults_spread():
    params = PipelineParams()
    spread = spread_for(params.reference, row(0, 60.0))
    assert spread is DEFAULT_SPREAD
    band = spread.band(0)
    assert band == round(2 * spread.change[0][1], 1) > 0
    beyond = change_at(row(0, 60.0), row(0, 60.0 + band + 0.5), spread)
    assert beyond.startswith("60.0% -> ") and "beyond the default's spread" in beyond
    within = change_at(row(0, 60.0), row(0, 60.0 - band / 2), spread)
    assert f"-{band / 2:.2f} points, within the default's spread of +/-{band}" in within
    assert "beyond" in change_at(row(0, 60.0), row(0, 60.0 - band - 0.5), spread)  # losses too
    # no spread where it was not measured: another evaluation or another reference model
    assert spread_for(params.reference, row(0, 60.0, problems=12, samples=48)) is None
    assert spread_for(params.reference, row(0, 60.0, samples=60 * 4)) is None  # 4 samples
    assert spread_for("tiny", row(0, 60.0)) is None
    assert change_at(row(0, 60.0), row(0, 61.0), None) == "60.0% -> 61.0% at turn 0"
    assert spread.band(99) is None


def test_before_after_plot_pairs_each_group_in_one_colour():
    from matplotlib.image import imread

    table = [
        {
            "difficulty": group,
            "turn": t,
            "problems": 12,
            "before_pass@1": 50.0 - 10 * t + offset,
            "after_pass@1": 55.0 - 10 * t + offset,
            "change_points": 5.0,
        }
        for group, offset in (("all", 0.0), ("held_out", -40.0))
        for t in range(3)
    ]
    png = plot_before_after(table, "before vs after")
    assert png[:4] == b"\x89PNG"
    pixels = (imread(__import__("io").BytesIO(png))[..., :3] * 255).round()

    def has(rgb: tuple[int, int, int]) -> bool:
        return bool(((abs(pixels - rgb) <= 2).all(axis=-1)).sum() > 30)

    assert has((31, 119, 180)) and has((255, 127, 14))  # C0 for 'all', C1 for 'held_out'
    assert not has((44, 160, 44))  # no third group, so no C2 line


def test_setting_builds_the_flags_over_the_embedded_default(tmp_path):
    script = load_script()
    args = script.parse_args(["--max-steps", "24", "--lr", "5e-5", "--batch", "16", "--n", "8"])
    label, fields = script.setting(args)
    # + keyed sampling and the fit hash
    assert label.startswith("cobalt_steps24_b16_g4_lr5e-05_temperature0.6_n8_keyed_ref")
    from cobalt.reference import embedded_recipe_hash

    assert label.endswith(embedded_recipe_hash()[:8])
    params = PipelineParams.model_validate(fields)
    assert params.training.max_steps == 24 and params.collect.sampling.n == 8
    assert params.training.overrides["learning_rate"] == 5e-5
    assert params.training.overrides["per_device_train_batch_size"] == 16
    assert params.training.overrides["num_generations"] == 4  # the default's, untouched
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"eval_limit": 6}))
    _, fields = script.setting(script.parse_args(["--config", str(config), "--mode", "offline"]))
    params = PipelineParams.model_validate(fields)
    assert params.eval_limit == 6 and params.training.mode == "offline"
    label, fields = script.setting(script.parse_args(["--eval-samples", "16"]))
    assert "_n8_eval16_keyed_ref" in label and fields["eval_samples"] == 16
    assert "_eval" not in script.setting(script.parse_args(["--eval-samples", "8"]))[0]


def seed_result(seed: int, changes: list[float], before: float = 60.0) -> dict:
    rows = [
        {
            "difficulty": "all",
            "turn": t,
            "problems": 2,
            "before_pass@1": before,
            "after_pass@1": before + c,
            "change_points": c,
        }
        for t, c in enumerate(changes)
    ]
    problems = {"ids": ["p1", "p2"]} | {
        str(t): {"before": [0.5, 0.75], "after": [0.5 + c / 100, 0.75]}
        for t, c in enumerate(changes)
    }
    return {"seed": seed, "wall_s": 1.0, "before_after": rows, "problems": problems}


def test_aggregate_gives_mean_spread_and_intervals_over_seeds():
    script = load_script()
    changes = [1.0, 3.0, 2.0, 4.0, 5.0]
    seeds = {str(s): seed_result(s, [c, -c]) for s, c in enumerate(changes)}
    turn0, turn1 = script.aggregate(seeds)
    assert (turn0["turn"], turn0["seeds"], turn0["change"]) == (0, 5, 3.0)
    assert turn0["sd"] == round(statistics.stdev(changes), 2)
    assert (turn0["min"], turn0["max"], turn0["up"]) == (1.0, 5.0, 5)
    low, high = turn0["t95"]
    assert low == pytest.approx(3.0 - 2.776 * statistics.stdev(changes) / 5**0.5, abs=0.01)
    assert 0 < low < 3.0 < high
    assert turn1["up"] == 0 and turn1["t95"][1] < 0
    # the bootstrap over seeds and problems: one of two problems moved by c, so half of it
    assert turn0["boot95"][0] > 0 and turn1["boot95"][1] < 0
    text = script.report({"settings": {"x": {"seeds": seeds}}})
    assert "## x: 5 seeds" in text and "| all | 0 | 5 |" in text


def test_t_quantile_beyond_the_table_keeps_to_the_exact_values():
    """Over 31 seeds the interval's t quantile comes from an expansion, not the table: it must
    stay within rounding of the exact quantiles (scipy's t.ppf(0.975, df))."""
    script = load_script()
    exact = {31: 2.0395, 45: 2.0141, 60: 2.0003, 71: 1.9939, 200: 1.9719}
    assert {df: script.t975(df) for df in exact} == pytest.approx(exact, abs=1.5e-4)
    assert script.t975(30) == 2.042
    changes = [float(s % 7) for s in range(46)]
    low, high = script.t_interval(changes)
    half = 2.0141 * statistics.stdev(changes) / 46**0.5
    mean = statistics.fmean(changes)
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=0.006)


def test_settings_run_side_by_side_keep_each_others_seeds(tmp_path):
    """Two settings measured at once share one results file: each write adds its own setting
    to what the file holds now, instead of the copy its process read at start."""
    script = load_script()
    out = tmp_path / "results.json"
    first = {"seeds": {"0": seed_result(0, [1.0, 2.0])}}
    second = {"seeds": {"0": seed_result(0, [3.0, 4.0])}}
    script.save_setting(out, "first", first)
    script.save_setting(out, "second", second)  # as if started before "first" was written
    first["seeds"]["1"] = seed_result(1, [0.5, 0.5])
    script.save_setting(out, "first", first)
    saved = json.loads(out.read_text())["settings"]
    assert sorted(saved) == ["first", "second"]
    assert sorted(saved["first"]["seeds"]) == ["0", "1"] and list(saved["second"]["seeds"]) == ["0"]
    assert not out.with_name(out.name + ".tmp").exists()
    # seeds of one setting run by two processes: the second write keeps the first's seed
    script.save_setting(out, "second", {"seeds": {"2": seed_result(2, [1.0, 1.0])}})
    assert sorted(json.loads(out.read_text())["settings"]["second"]["seeds"]) == ["0", "2"]


def test_help():
    script = load_script()
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(["--help"])
    assert exit_.value.code == 0


def test_the_summary_lines_spread_is_the_recorded_measurement_of_the_default():
    """DEFAULT_SPREAD is what the script's results file says for the setting the script runs
    without flags (the embedded default): the same seeds, means and standard deviations."""
    script = load_script()
    label, _ = script.setting(script.parse_args([]))
    results = json.loads((ROOT / DEFAULT_SPREAD.source).read_text())
    seeds = results["settings"][label]["seeds"]
    assert len(seeds) == DEFAULT_SPREAD.seeds
    rows = [r for r in script.aggregate(seeds) if r["difficulty"] == "all"]
    assert {r["turn"]: (r["change"], r["sd"]) for r in rows} == DEFAULT_SPREAD.change
    first = next(iter(seeds.values()))["before_after"][0]
    assert first["problems"] == DEFAULT_SPREAD.problems
