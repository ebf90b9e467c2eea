"""Generation engines for the trajectory stage: local transformers, LiteLLM (APIs and
OpenAI-compatible servers) and vLLM, behind one interface. No Prefect import.

    from engines import EngineConfig, SamplingConfig, make_engine

    with make_engine(EngineConfig(kind="transformers", model="/models/tiny")) as engine:
        results = engine.generate([[{"role": "user", "content": "hi"}]], SamplingConfig(n=4))
"""

from __future__ import annotations

from .auto import Choice, choose
from .base import Completion, Conversation, Engine, Message, Usage, sum_usage
from .config import EngineConfig, EngineKind, MissingAPIKeyError, SamplingConfig
from .cpu_threads import ThreadSettingError
from .memory import InsufficientMemoryError
from .thinking import opens_thinking, split_thinking, thinking_text, with_open_thinking

__all__ = [
    "Choice",
    "Completion",
    "Conversation",
    "Engine",
    "EngineConfig",
    "EngineKind",
    "InsufficientMemoryError",
    "Message",
    "MissingAPIKeyError",
    "SamplingConfig",
    "ThreadSettingError",
    "Usage",
    "choose",
    "make_engine",
    "opens_thinking",
    "resolve_kind",
    "split_thinking",
    "sum_usage",
    "thinking_text",
    "with_open_thinking",
]


def resolve_kind(
    kind: str,
    *,
    model: str | None = None,
    vllm_installed: bool | None = None,
    gpu: bool | None = None,
) -> str:
    """The engine kind to make: `auto` is `vllm` on a GPU with vLLM importable for a model of at
    least `engines.auto.SMALL_MODEL` parameters (its directory's config.json), else
    `transformers` (`engines.auto.choose`); other kinds are kept. The probes can be given."""
    if kind != "auto":
        return kind
    return choose(model, vllm_installed=vllm_installed, gpu=gpu).kind


def make_engine(config: EngineConfig) -> Engine:
    """The engine for `config.kind` (`auto` decided by `engines.auto.choose`, logged with its
    reason); heavy dependencies are imported only for the chosen kind."""
    if config.kind == "auto":
        import logging

        choice = choose(config.model)
        config = config.model_copy(update={"kind": choice.kind})
        logging.getLogger(__name__).info("engine kind auto: %s", choice)
    if config.kind == "transformers":
        from .transformers_engine import TransformersEngine

        return TransformersEngine(config)
    if config.kind == "litellm":
        from .litellm_engine import LiteLLMEngine

        return LiteLLMEngine(config)
    if config.kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(config)
    raise ValueError(f"unknown engine kind {config.kind!r}")
