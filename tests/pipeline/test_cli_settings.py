"""A real run from the pipeline's CLI: the preset a model gets, flags and --config
merged over it, the settings the run prints. No flow runs here: parse and validate only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from cobalt.pipeline import evaluation_seed, settings_text
from flows.pipeline import main, parse_params


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A directory standing for a real model (the pipeline checks its config.json in preflight,
    not when parsing)."""
    path = tmp_path / "Qwen3-8B"
    path.mkdir()
    return path


def test_the_embedded_default_is_the_tiny_preset_on_the_auto_engine():
    p = parse_params([])
    assert p.preset == "tiny" and p.engine.kind == "auto"
    assert (p.collect.sampling.n, p.collect.sampling.max_new_tokens, p.eval_turns) == (8, 128, 2)
    assert p.training.max_steps == 32 and p.training.preset == "tiny"
    assert p.training.report_to == ["tensorboard"]


def test_a_model_directory_gets_the_papers_settings(model_dir: Path):
    p = parse_params(["--model", str(model_dir)])
    assert p.preset == "paper" and p.reference == str(model_dir)
    s = p.collect.sampling
    assert (s.n, s.temperature, s.top_p, s.max_new_tokens) == (16, 0.6, 0.95, 6144)
    assert p.collect.turns == 2 and p.collect.system_prompt  # METHOD §1.2's system prompt
    assert p.eval_turns == 8 and p.bandit.max_prompt_tokens == 10_000
    assert p.training.preset == "paper" and p.engine.kind == "auto"
    kw = p.training.grpo_kwargs("out")
    assert kw["learning_rate"] == 1e-6 and kw["num_generations"] == 16
    # given sources get METHOD §1.1's cleaning rules (100 alphanumerics), not the synthetic 40
    real = parse_params(["--model", str(model_dir), "--source", "hf:likaixin/TACO-verified"])
    assert real.rules.min_statement_alnum == 100


def test_a_directory_the_tiny_fit_made_keeps_the_tiny_preset(tmp_path: Path):
    from cobalt.reference import RECIPE_FILE

    fitted = tmp_path / "fitted"
    fitted.mkdir()
    (fitted / RECIPE_FILE).write_text("{}")
    assert parse_params(["--model", str(fitted)]).preset == "tiny"


def test_flags_merge_over_the_preset_and_keep_the_rest(model_dir: Path):
    argv = ["--model", str(model_dir), "--n", "4", "--engine", "vllm", "--lora"]
    argv += ["--set", "learning_rate=2e-6", "--precision", "bf16", "--report-to", "wandb"]
    p = parse_params(argv)
    assert p.collect.sampling.n == 4 and p.collect.sampling.max_new_tokens == 6144
    assert p.engine.kind == "vllm"
    assert p.training.lora is not None and p.training.precision == "bf16"
    assert p.training.grpo_kwargs("out")["learning_rate"] == 2e-6
    assert p.training.grpo_kwargs("out")["num_generations"] == 16  # the preset's, kept
    assert p.training.report_to == ["wandb"]
    assert parse_params(["--report-to", "none"]).training.report_to == []


def test_an_explicit_preset_wins_over_the_models_and_config_files_merge(
    model_dir: Path, tmp_path: Path
):
    p = parse_params(["--model", str(model_dir), "--preset", "tiny"])
    assert p.preset == "tiny" and p.collect.sampling.n == 8
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"collect": {"turns": 3}, "training": {"mode": "multi_turn"}}))
    p = parse_params(["--config", str(config), "--model", str(model_dir), "--n", "6"])
    assert p.collect.turns == 3 and p.collect.sampling.n == 6
    assert p.collect.sampling.max_new_tokens == 6144  # the paper preset's sampling stays
    assert p.training.mode == "multi_turn" and p.training.preset == "paper"


def test_the_run_prints_the_settings_it_uses(model_dir: Path):
    text = settings_text(parse_params(["--model", str(model_dir), "--lora"]))
    assert text.startswith("settings:")
    for part in (
        f"preset paper: reference and policy {model_dir}",
        "engine auto -> ",
        "16 samples x 2 feedback turns, 6144 new tokens",
        "evaluation: 16 samples x 8 feedback turns",
        "bandit contexts up to 10000 tokens",
        "training: cobalt GRPO, paper preset: lr 1e-06",
        "LoRA",
    ):
        assert part in text, (part, text)


def test_a_setting_another_field_owns_is_one_line_naming_that_field(capsys):
    assert main(["--set", "bf16=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.precision" in err[0], err


def test_eval_samples_change_the_evaluations_alone():
    p = parse_params(["--eval-samples", "16", "--n", "4"])
    train = p.trajectories("sets", p.train_table, "model", "train")
    evaluation = p.trajectories("sets", p.eval_table, "model", "eval")
    assert train.collect.sampling.n == 4 and train.collect.turns == 2
    assert evaluation.collect.sampling.n == 16 and evaluation.collect.turns == p.eval_turns
    # the evaluations draw other noise than the trajectories, one noise before and after
    assert evaluation.collect.sampling.seed == evaluation_seed(train.collect.sampling.seed)
    assert evaluation.collect.sampling.seed != train.collect.sampling.seed
    after = p.trajectories("sets", p.eval_table, "trained", "eval")
    assert after.collect.sampling == evaluation.collect.sampling
    assert "evaluation: 16 samples x 2 feedback turns" in settings_text(p)
    plain = parse_params(["--n", "4"])
    assert plain.trajectories("sets", "test", "model", "eval").collect.sampling.n == 4
    with pytest.raises(ValidationError, match="eval_samples"):
        parse_params(["--eval-samples", "0"])


def test_gpus_reaches_every_generating_stage(model_dir: Path):
    """--gpus N: vLLM's data_parallel_size in the engine that the trajectories, both evaluations
    and the reward-hacking analysis copy; left out, every visible GPU (auto)."""
    from flows import trajectories

    assert parse_params([]).engine.data_parallel_size == "auto"
    p = parse_params(["--model", str(model_dir), "--engine", "vllm", "--gpus", "2"])
    assert p.engine.data_parallel_size == 2
    assert p.trajectories("latest", "train", str(model_dir), "eval").engine.data_parallel_size == 2
    assert p.hacking("latest", str(model_dir), str(model_dir)).engine.data_parallel_size == 2
    t = trajectories.parse_params(["--engine", "vllm", "--model", str(model_dir), "--gpus", "3"])
    assert t.engine.data_parallel_size == 3
