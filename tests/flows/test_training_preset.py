"""`flows.training` picks its preset from the policy as `flows.pipeline` does (one function,
`cobalt.pipeline.params.preset_for`) and prints the settings it uses before any work. No training
runs here: parse and validate, and the flow up to its first stage."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cobalt.models import RECIPE_FILE, TINY_MARKER
from cobalt.trajectories.problemsets import ProblemSetError
from flows import pipeline, training


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A directory standing for a real model: Qwen3-8B's config.json (no weights)."""
    from transformers import Qwen3Config

    path = tmp_path / "Qwen3-8B"
    Qwen3Config(
        vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, dtype="bfloat16",
    ).save_pretrained(str(path))  # fmt: skip
    return path


def test_a_real_model_gets_the_paper_preset_as_in_the_pipeline(model_dir: Path) -> None:
    p = training.parse_params(["--model", str(model_dir)])
    assert p.training.preset == "paper"
    assert p.training.preset == pipeline.parse_params(["--model", str(model_dir)]).training.preset
    kw = p.training.grpo_kwargs("out")
    assert (kw["learning_rate"], kw["num_generations"], kw["max_completion_length"]) == (
        1e-6,
        16,
        6144,
    )
    assert training.parse_params(["--model", "Qwen/Qwen3-8B"]).training.preset == "paper"


def test_the_embedded_models_and_a_named_preset_keep_theirs(model_dir: Path, tmp_path) -> None:
    fitted, tiny = tmp_path / "fitted", tmp_path / "tiny-seed0"
    for path, marker in ((fitted, RECIPE_FILE), (tiny, TINY_MARKER)):
        path.mkdir()
        (path / marker).write_text("{}")
    for name in ("fitted", "tiny", str(fitted), str(tiny)):
        assert training.parse_params(["--model", name]).training.preset == "tiny", name
        assert pipeline.parse_params(["--model", name]).preset == "tiny", name
    named = training.parse_params(["--model", str(model_dir), "--preset", "tiny"])
    assert named.training.preset == "tiny"
    config = tmp_path / "c.json"
    config.write_text('{"training": {"preset": "tiny"}}')
    from_file = training.parse_params(["--config", str(config), "--model", str(model_dir)])
    assert from_file.training.preset == "tiny"
    assert training.parse_params([]).training.preset == "tiny"  # no model named, no lookup


def test_without_model_the_trajectories_model_decides(model_dir: Path, monkeypatch) -> None:
    """The command's own run reads which model collected the trajectories; trajectories not
    found leave the preset to the preflight, which names what is missing."""
    seen = []

    def found(where, storage):
        seen.append(where)
        return SimpleNamespace(engine={"model": str(model_dir)})

    monkeypatch.setattr(training, "find_trajectories", found)
    p = training.parse_params(["--trajectories", "/runs/eval/k"], find_model=True)
    assert p.training.preset == "paper" and seen == ["/runs/eval/k"]

    def missing(where, storage):
        raise ProblemSetError("no trajectories")

    monkeypatch.setattr(training, "find_trajectories", missing)
    assert training.parse_params([], find_model=True).training.preset == "tiny"


def test_trajectories_of_the_tiny_model_keep_the_tiny_preset(tmp_path: Path, monkeypatch):
    """`flows.trajectories` (default: the random tiny model) records the directory it built;
    training on those trajectories keeps the tiny preset."""
    built = tmp_path / "runs" / "models" / "tiny-seed0"
    built.mkdir(parents=True)
    (built / TINY_MARKER).write_text("{}")
    found = SimpleNamespace(engine={"kind": "transformers", "model": str(built)})
    monkeypatch.setattr(training, "find_trajectories", lambda where, storage: found)
    assert training.parse_params([], find_model=True).training.preset == "tiny"


def test_the_flow_prints_its_settings_before_any_work(model_dir: Path, monkeypatch, capsys):
    params = training.parse_params(["--model", str(model_dir), "--lora"])
    ready = SimpleNamespace(
        model=str(model_dir),
        plan=SimpleNamespace(describe=lambda: "1 GPU"),
        trajectories=SimpleNamespace(evaluation=SimpleNamespace(uri="/runs/evaluation/k")),
    )
    monkeypatch.setattr(training, "preflight", lambda p: ready)

    class NoWork(Exception):
        pass

    def stages(*args):
        print("first stage")
        raise NoWork

    monkeypatch.setattr(training, "Stages", stages)
    with pytest.raises(NoWork):
        training.training_flow.fn(params)
    out = capsys.readouterr().out
    assert out.index("settings:") < out.index("first stage")
    for part in (
        f"preset paper: policy {model_dir}",
        "trajectories /runs/evaluation/k",
        "bandit contexts up to 10000 tokens (train selection)",
        "training: cobalt GRPO, paper preset: lr 1e-06, 16 samples per prompt",
        "LoRA",
        "training plan: 1 GPU",
    ):
        assert part in out, (part, out)
