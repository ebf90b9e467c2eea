"""What `auto` means (engines.auto): vLLM on a GPU with vLLM installed for a model of 50M+
parameters, else the transformers engine, for the generating stages and GRPO's sampling alike;
the run's printed settings say what it chose and why. The size comes from a config.json alone
(an 8B-shaped config, no weights); the GPU and vLLM probes are given, as on a GPU worker."""

from __future__ import annotations

from pathlib import Path

import pytest

import engines.auto as auto
from cobalt.training.settings import TrainingConfig
from engines import EngineConfig, choose, resolve_kind


@pytest.fixture(scope="module")
def model_8b(tmp_path_factory) -> Path:
    """A Qwen3-8B-shaped config.json, no weights (what the paper's models look like)."""
    from transformers import Qwen3Config

    path = tmp_path_factory.mktemp("qwen3-8b-shape")
    Qwen3Config(
        vocab_size=151_936,
        hidden_size=4096,
        intermediate_size=12_288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ).save_pretrained(path)
    return path


GPU = {"gpu": True, "vllm_installed": True}


def test_a_tiny_model_gets_transformers_an_8b_one_vllm(tiny_model, model_8b):
    tiny = choose(tiny_model, **GPU)
    assert tiny.kind == "transformers" and tiny.reason.startswith("0.21M parameters < 50M")
    assert "start-up" in tiny.reason
    big = choose(model_8b, **GPU)
    assert (big.kind, big.reason) == ("vllm", "8.2B parameters >= 50M")
    assert str(big) == "vllm (8.2B parameters >= 50M)"
    assert resolve_kind("auto", model=str(tiny_model), **GPU) == "transformers"
    assert resolve_kind("auto", model=str(model_8b), **GPU) == "vllm"
    assert resolve_kind("vllm", model=str(tiny_model), **GPU) == "vllm"  # a named kind stays


def test_without_a_gpu_or_vllm_it_is_transformers_whatever_the_size(model_8b, tmp_path):
    assert choose(model_8b, gpu=False, vllm_installed=True) == auto.Choice("transformers", "no GPU")
    assert choose(model_8b, gpu=True, vllm_installed=False).reason == "vLLM not installed"
    # no config.json to size it (a served name, a directory not built yet): vLLM, as before
    assert choose(tmp_path, **GPU) == auto.Choice("vllm", "model size unknown")
    assert choose("fitted", parameters=850_000, **GPU).kind == "transformers"
    assert EngineConfig(kind="auto", model=str(model_8b)).resolved().kind == "transformers"  # CPU


def test_grpo_sampling_follows_the_same_choice(tiny_model, model_8b, monkeypatch):
    import cobalt.training.settings as training

    monkeypatch.setattr(training, "vllm_available", lambda: True)
    config = TrainingConfig()
    mode, why = config.generation_choice(True, tiny_model)
    assert mode == "transformers" and why == choose(tiny_model, **GPU).reason
    assert config.generation_kwargs(True, tiny_model) == {"use_transformers_paged": False}
    assert config.generation_choice(True, model_8b) == ("vllm_colocate", "8.2B parameters >= 50M")
    assert config.generation_kwargs(True, model_8b) == {"use_vllm": True, "vllm_mode": "colocate"}
    assert config.grpo_kwargs("out", tiny_model)["use_transformers_paged"] is False
    named = TrainingConfig(generation="vllm_colocate")  # only auto decides
    assert named.generation_choice(True, tiny_model) == ("vllm_colocate", None)


def test_the_printed_settings_say_what_auto_chose_and_why(model_8b, monkeypatch):
    import torch

    import cobalt.training.settings as training
    from cobalt.pipeline import settings_text
    from flows.pipeline import parse_params

    on_cpu = settings_text(parse_params([]))
    assert "engine auto -> transformers (no GPU)" in on_cpu
    assert "generation auto -> transformers (no GPU)" in on_cpu
    # as on a GPU worker with vLLM installed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(auto, "_gpu_visible", lambda: True)
    monkeypatch.setattr(auto, "_vllm_installed", lambda: True)
    monkeypatch.setattr(training, "vllm_available", lambda: True)
    embedded = settings_text(parse_params([]))  # the fitted model, before it is fitted
    small = "(0.85M parameters < 50M: vLLM's ~1 min start-up costs more)"
    assert f"engine auto -> transformers {small}" in embedded, embedded
    assert f"generation auto -> transformers {small}" in embedded, embedded
    paper = settings_text(parse_params(["--model", str(model_8b)]))
    assert "engine auto -> vllm (8.2B parameters >= 50M)" in paper, paper
    assert "generation auto -> vllm_colocate (8.2B parameters >= 50M)" in paper, paper
