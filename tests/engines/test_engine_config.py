import importlib.util

import pytest
from pydantic import ValidationError

from engines import EngineConfig, MissingAPIKeyError, SamplingConfig, make_engine


def test_sampling_defaults_follow_the_paper():
    s = SamplingConfig()
    assert (s.n, s.temperature, s.top_p, s.thinking) == (1, 0.6, 0.95, None)
    assert s.chat_template_kwargs() == {}
    assert SamplingConfig(thinking=False).chat_template_kwargs() == {"enable_thinking": False}
    assert SamplingConfig(temperature=0).greedy


def test_configs_reject_unknown_fields_and_bad_values():
    with pytest.raises(ValidationError):
        SamplingConfig(n=0)
    with pytest.raises(ValidationError):
        SamplingConfig(temprature=0.5)
    with pytest.raises(ValidationError):
        EngineConfig(kind="sglang", model="m")
    with pytest.raises(ValidationError, match="api_base"):
        EngineConfig(kind="transformers", model="m", api_base="http://x")


def test_every_field_has_a_description():
    for model in (SamplingConfig, EngineConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("COBALT_TEST_NO_SUCH_KEY", raising=False)
    config = EngineConfig(
        kind="litellm", model="openai/gpt-4o-mini", api_key_env="COBALT_TEST_NO_SUCH_KEY"
    )
    with pytest.raises(MissingAPIKeyError, match="COBALT_TEST_NO_SUCH_KEY"):
        config.api_key()
    monkeypatch.setenv("COBALT_TEST_NO_SUCH_KEY", "sk-secret-value")
    assert config.api_key() == "sk-secret-value"
    assert "sk-secret-value" not in repr(config)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_says_what_is_missing():
    with pytest.raises(ImportError, match=r"vLLM.*\[gpu\].*litellm"):
        make_engine(EngineConfig(kind="vllm", model="/nonexistent"))


# --- engine choice (kind="auto") -------------------------------------------------------------


def test_auto_picks_vllm_only_with_vllm_and_a_gpu():
    from engines import resolve_kind

    assert resolve_kind("auto", vllm_installed=True, gpu=True) == "vllm"
    assert resolve_kind("auto", vllm_installed=True, gpu=False) == "transformers"
    assert resolve_kind("auto", vllm_installed=False, gpu=True) == "transformers"
    assert resolve_kind("auto", vllm_installed=False, gpu=False) == "transformers"
    for kind in ("transformers", "litellm", "vllm"):  # a named kind is never second-guessed
        assert resolve_kind(kind, vllm_installed=False, gpu=False) == kind


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_auto_without_vllm_makes_the_transformers_engine(tiny_model_dir):
    """No vLLM here (CI): auto is the transformers engine, and it generates."""
    config = EngineConfig(kind="auto", model=str(tiny_model_dir))
    assert config.resolved().kind == "transformers"
    with make_engine(config) as engine:
        assert engine.kind == "transformers"
        out = engine.generate(
            [[{"role": "user", "content": "hi"}]], SamplingConfig(n=2, seed=0, max_new_tokens=4)
        )
    assert len(out[0]) == 2


def test_vllm_gives_each_conversation_its_own_seed():
    """vLLM seeds a request's sample i with seed + i: one seed for a whole call would give two
    identical conversations identical completions. Each conversation's seed comes from the run's
    seed, its messages and its occurrence in the call, not from its place in the call."""
    from engines.vllm_engine import conversation_seeds

    a = [{"role": "user", "content": "x"}]
    b = [{"role": "user", "content": "y"}]
    seeds = conversation_seeds(7, [a, b, a])
    assert len(set(seeds)) == 3  # the second `a` samples independently of the first
    assert conversation_seeds(7, [a, b, a]) == seeds
    assert conversation_seeds(7, [b, a]) == [seeds[1], seeds[0]]
    assert conversation_seeds(8, [a]) != seeds[:1]
    assert all(0 <= s < 2**62 for s in seeds)  # seed + n stays within vLLM's int64
    assert conversation_seeds(None, [a, b]) == [None, None]
