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
