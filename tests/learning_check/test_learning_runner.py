"""The learning check's parent process (`parallel`) and the deadline rule of a
seed run, with a stand-in child: run names and repeats, several children at once, a child
stopped at the deadline keeps its result marked as killed."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.learning_check import parallel
from experiments.learning_check.config import as_json, build_parser, from_json, resolve
from experiments.learning_check.seed_run import _determinism, too_late

CHILD = """
import json, sys, time
from pathlib import Path
argv = sys.argv[1:]
value = lambda name: argv[argv.index(name) + 1]
out, label, seed = Path(value("--out")), value("--label"), int(value("--seed"))
doc = {"check": "learning_check_seed", "seed": seed, "label": label, "status": "running",
       "deadline_at": float(value("--deadline-at")), "settings": json.loads(Path(value("--child")).read_text())}
(out / "runs").mkdir(parents=True, exist_ok=True)
(out / "runs" / f"{label}.json").write_text(json.dumps(doc))
if seed == 9:  # the slow one
    time.sleep(120)
doc["status"] = "done"
(out / "runs" / f"{label}.json").write_text(json.dumps(doc))
"""


def args_for(tmp_path: Path, *extra: str):
    return resolve(build_parser().parse_args(["--out", str(tmp_path / "out"), *extra]))


def test_run_names_count_repeats_past_existing_results(tmp_path: Path) -> None:
    args = args_for(tmp_path, "--seeds", "0,1", "--repeat", "0,0")
    assert [label for _, label in parallel.labels(args)] == [
        "seed0",
        "seed1",
        "seed0-r1",
        "seed0-r2",
    ]
    (args.out / "runs").mkdir(parents=True)
    (args.out / "runs" / "seed0.json").write_text("{}")
    args = args_for(tmp_path, "--seeds", "0")
    assert parallel.labels(args) == [(0, "seed0-r1")]
    assert args.sandbox_concurrency >= 1 and args.modes == "single_turn,cobalt,offline,cobalt_bf16"
    with pytest.raises(SystemExit, match="unknown"):
        args_for(tmp_path, "--modes", "cobalt,grpo")


def test_children_run_in_parallel_and_a_late_one_is_stopped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "MIN_START_S", 0.0)
    monkeypatch.setattr(parallel, "KILL_GRACE_S", 1.0)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    deadline = parallel.AGGREGATE_S + parallel.KILL_GRACE_S + 4  # kill after 5 s
    args = args_for(tmp_path, "--seeds", "0,9", "--parallel", "2", "--deadline-s", str(deadline))
    started = time.time()
    done = parallel.run_seeds(args, child=[sys.executable, str(script)])
    assert time.time() - started < deadline + parallel.KILL_GRACE_S
    assert done["seed0"]["status"] == "done" and done["seed0"]["exit"] == 0
    assert done["seed9"]["status"] == "killed" and done["seed9"]["exit"] != 0
    result = json.loads((args.out / "runs" / "seed9.json").read_text())
    assert result["status"] == "killed"
    # the children got the parent's settings and a deadline that leaves time to aggregate
    assert result["settings"]["seeds"] == "0,9"
    assert result["deadline_at"] == pytest.approx(
        started + deadline - parallel.AGGREGATE_S - parallel.KILL_GRACE_S, abs=2
    )
    assert (args.out / "logs" / "seed9.log").exists()


def test_a_mode_is_skipped_when_it_would_end_after_the_deadline() -> None:
    assert not too_late(100.0, [], 10.0, 0.0)  # no deadline
    assert too_late(100.0, [], 10.0, 120.0)  # the first mode is guessed at 2.5 evaluations
    assert not too_late(100.0, [], 10.0, 130.0)
    assert too_late(100.0, [30.0, 50.0], 10.0, 143.0)  # then the mean of the modes so far
    assert not too_late(100.0, [30.0, 50.0], 10.0, 145.0)
    # an offline mode generates nothing: 2 evaluations, whatever GRPO took
    assert not too_late(100.0, [300.0], 10.0, 123.0, "offline")
    assert too_late(100.0, [300.0], 10.0, 121.0, "offline")
    # offline_grpo: 2 evaluations + its share of a GRPO mode's training (60 s - 10 s of eval)
    assert not too_late(100.0, [60.0], 10.0, 100 + 1.1 * (20 + 0.5 * 50) + 0.1, "offline_grpo", 0.5)
    assert too_late(100.0, [60.0], 10.0, 100 + 1.1 * (20 + 0.5 * 50) - 0.1, "offline_grpo", 0.5)
    # reusing an offline mode's weights: no offline training in the guess (1 evaluation)
    late = 100 + 1.1 * (10 + 0.5 * 50)
    assert not too_late(100.0, [60.0], 10.0, late + 0.1, "offline_grpo", 0.5, offline_reused=True)
    assert too_late(100.0, [60.0], 10.0, late - 0.1, "offline_grpo", 0.5, offline_reused=True)


@pytest.mark.parametrize(
    ("flags", "device", "strict"),
    [
        ([], "cpu", False),  # the default: off on CPU (identical runs without it)
        ([], "cuda", True),  # the default: on for a GPU
        (["--strict-determinism"], "cpu", True),
        (["--no-strict-determinism"], "cuda", False),
    ],
)
def test_strict_determinism_turns_warn_only_off(flags: list, device: str, strict: bool) -> None:
    import torch

    args = build_parser().parse_args(["--out", "x", *flags])
    args.device = device  # resolved by the run before this (no GPU needed to set the mode)
    try:
        got = _determinism(args)
        assert got["deterministic_algorithms"] is True
        assert got["warn_only"] is (not strict) and got["strict"] is strict
        assert got["strict_source"] == ("flag" if flags else "default (on for a GPU, off on CPU)")
        # an op without a deterministic implementation raises now, else it only warns
        put = lambda: torch.zeros(4).put_(torch.tensor([0, 0]), torch.ones(2))  # noqa: E731
        if strict:
            with pytest.raises(RuntimeError, match="deterministic implementation"):
                put()
        else:
            with pytest.warns(UserWarning, match="deterministic implementation"):
                put()
    finally:
        torch.use_deterministic_algorithms(False)


class FakeRun:
    def __init__(self, args) -> None:
        self.doc = {"training": {}, "fingerprints": {}, "phases_s": {}}
        self.doc["settings"] = vars(args)

    def begin(self) -> float:
        return 0.0

    def end(self, name: str, t0: float) -> float:
        return 0.0

    def save(self) -> None:
        pass


@pytest.mark.parametrize("modes", ["offline_grpo,offline_rloo,offline_awr", "offline_rloo"])
def test_offline_grpo_reuses_the_default_objectives_weights(
    tmp_path: Path, monkeypatch, modes: str
) -> None:
    """offline_grpo starts its GRPO phase from offline_awr's weights (run first, whatever the
    --modes order; its directory kept until then, removed after) and adds their recorded cost;
    without offline_awr it trains the offline phase itself."""
    from experiments.learning_check import seed_run, stages, training
    from experiments.learning_check.config import mode_list

    trained, grpo_from = [], []

    def offline(rows, model, args, out_dir, objective=None, lr_scale=1.0):
        objective = objective or args.offline_objective
        trained.append(objective)
        out_dir.mkdir(parents=True)
        (out_dir / "w.safetensors").write_text(f"{model.name}-{objective}-{lr_scale}")
        lr = (args.offline_lr or args.rl_lr) * lr_scale
        cost = {"wall_s": 3.0, "gpu_s": None, "gpu_busy_s": None, "gpus": 0}
        return {
            "objective": objective,
            "steps": args.rl_steps,
            "learning_rate": lr,
            "rows": 1,
            "completions_trained": 4,
            "wall_s": 3.0,
            "cost": cost,
        }

    def grpo(mode, rows, model, args, out_dir, extra=None, fields=None, steps=None):
        grpo_from.append(stages.weights_fingerprint(model))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "w.safetensors").write_text(f"grpo-{steps}")
        cost = {"wall_s": 2.0, "gpu_s": None, "gpu_busy_s": None, "gpus": 0}
        return {
            "steps": steps,
            "completions_sampled": 4,
            "completions_trained": 4,
            "wall_s": 2.0,
            "cost": cost,
            "step_time": {},
            "step_time_per_step": [],
            "curve": [],
        }

    monkeypatch.setattr(training, "train_offline_mode", offline)
    monkeypatch.setattr(training, "train_mode", grpo)
    args = args_for(tmp_path, "--smoke", "--modes", modes)
    args.deadline_at, args.work, args.label = 0.0, None, "seed0"
    if modes == "offline_rloo":
        args.modes = "offline_rloo,offline_grpo"
    assert mode_list(args)[-1] == "offline_grpo"  # after offline_awr, where it is listed
    run, work, sft = FakeRun(args), tmp_path / "work", tmp_path / "work" / "sft"
    evaluated = []

    def evaluate(name: str, model: Path) -> float:
        evaluated.append(name)
        assert model.is_dir()
        return 1.0

    seed_run.run_modes(run, args, work, [{}], [{}], sft, evaluate, 1.0)
    both, prints = run.doc["training"]["offline_grpo"], run.doc["fingerprints"]
    assert both["outcome"] == "completed" and evaluated[-1] == "offline_grpo"
    if "offline_awr" in args.modes:
        assert both["offline_phase"] == "reused from offline_awr"
        assert trained == ["reinforce_loo", "awr"]  # no second AWR training
        assert grpo_from == [prints["offline_awr_weights"]] == [both["offline_phase_weights"]]
    else:
        assert both["offline_phase"] == "trained" and trained == ["reinforce_loo", "awr"]
        assert grpo_from == [both["offline_phase_weights"]]
    assert both["offline_phase_same_weights"] in (True, None) and both["cost"]["wall_s"] == 5.0
    assert both["offline_phase_result"]["cost"]["wall_s"] == 3.0
    assert not work.exists() or not any(work.glob("rl-*"))  # every mode directory removed


def test_the_sft_repair_shares_are_settings_checked_before_any_run(tmp_path: Path) -> None:
    """A second testbed: more of the family's repair in SFT, the shares reaching
    fit_tiny_model's recipe through the seed's settings; a share outside [0, 1] is refused."""
    args = args_for(tmp_path, "--sft-repair-share", "0.5", "--sft-keep-share", "0.4")
    assert (args.sft_repair_share, args.sft_keep_share) == (0.5, 0.4)
    assert (args.sft_repair_share, args.sft_keep_share) == (
        from_json(as_json(args)).sft_repair_share,
        from_json(as_json(args)).sft_keep_share,
    )
    default = args_for(tmp_path)
    assert (default.sft_repair_share, default.sft_keep_share) == (0.25, 0.25)  # the recipe's
    with pytest.raises(SystemExit, match="--sft-keep-share: a share between 0 and 1"):
        args_for(tmp_path, "--sft-keep-share", "1.5")


def test_each_grpo_mode_and_probe_variant_builds_its_training_config(tmp_path: Path) -> None:
    """A mode's own settings reach TrainingConfig over the command line's: cobalt_bf16 trains in
    mixed precision whatever --precision says (both once reached TrainingConfig as two values of
    one argument, and the mode failed); every bf16 probe variant is a valid config."""
    from experiments.learning_check.bf16_probe import VARIANTS
    from experiments.learning_check.config import MODES
    from experiments.learning_check.training import grpo_config

    args = args_for(tmp_path)
    configs = {
        name: grpo_config(mode, args, extra)
        for name, (trainer, mode, extra) in MODES.items()
        if trainer == "grpo"
    }
    assert configs["cobalt_bf16"].precision == "mixed" and configs["cobalt"].precision == "fp32"
    assert configs["cobalt_dense"].reward == "dense" and configs["cobalt"].reward == "correctness"
    assert configs["multi_turn"].mode == "multi_turn"
    assert configs["cobalt_async"].async_generation and not configs["cobalt"].async_generation
    assert grpo_config("cobalt", args_for(tmp_path, "--precision", "mixed")).precision == "mixed"
    assert configs["cobalt"].overrides["gradient_accumulation_steps"] == 128 // 32
    for name, (mode, overrides, fields) in VARIANTS.items():
        config = grpo_config(mode, args, {**overrides, **fields})
        assert config.precision == fields["precision"] and config.mode == mode, name
    head = grpo_config("cobalt", args, {"cast_lm_head_to_fp32": True})
    assert head.overrides["cast_lm_head_to_fp32"] is True
