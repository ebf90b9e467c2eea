"""Generation engines for the trajectory stage: local transformers, LiteLLM (APIs and
OpenAI-compatible servers) and vLLM, behind one interface. No Prefect import.

    from engines import EngineConfig, SamplingConfig, make_engine

    with make_engine(EngineConfig(kind="transformers", model="/models/tiny")) as engine:
        results = engine.generate([[{"role": "user", "content": "hi"}]], SamplingConfig(n=4))
"""

from __future__ import annotations

from .base import Completion, Conversation, Engine, Message, Usage, sum_usage
from .config import EngineConfig, EngineKind, MissingAPIKeyError, SamplingConfig
from .memory import InsufficientMemoryError
from .thinking import split_thinking, thinking_text

__all__ = [
    "Completion",
    "Conversation",
    "Engine",
    "EngineConfig",
    "EngineKind",
    "InsufficientMemoryError",
    "Message",
    "MissingAPIKeyError",
    "SamplingConfig",
    "Usage",
    "make_engine",
    "split_thinking",
    "sum_usage",
    "thinking_text",
]


def make_engine(config: EngineConfig) -> Engine:
    """The engine for `config.kind`; heavy dependencies are imported only for the chosen kind."""
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
