"""Generation engines for the trajectory stage: local transformers, LiteLLM (APIs and
OpenAI-compatible servers) and vLLM, behind one interface. No Prefect import.

    from engines import EngineConfig, SamplingConfig, make_engine

    with make_engine(EngineConfig(kind="transformers", model="/models/tiny")) as engine:
        results = engine.generate([[{"role": "user", "content": "hi"}]], SamplingConfig(n=4))
"""

from __future__ import annotations

from .auto import Choice, choose
from .base import Completion, Conversation, Engine, Message, Usage, sum_usage
from .config import EngineConfig, EngineKind, GPUCountError, MissingAPIKeyError, SamplingConfig
from .cpu_threads import ThreadSettingError
from .machine import visible_gpus
from .memory import InsufficientMemoryError
from .thinking import opens_thinking, split_thinking, thinking_text, with_open_thinking

__all__ = [
    "Choice",
    "Completion",
    "Conversation",
    "Engine",
    "EngineConfig",
    "EngineKind",
    "GPUCountError",
    "InsufficientMemoryError",
    "Message",
    "MissingAPIKeyError",
    "SamplingConfig",
    "ThreadSettingError",
    "Usage",
    "choose",
    "make_engine",
    "opens_thinking",
    "resolve_data_parallel",
    "resolve_kind",
    "split_thinking",
    "sum_usage",
    "thinking_text",
    "visible_gpus",
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


def resolve_data_parallel(config: EngineConfig, *, gpus: int | None = None) -> int:
    """How many vLLM engines `config` runs here: `data_parallel_size`, with `auto` = the visible
    GPUs // tensor_parallel_size (at least 1). Raises `GPUCountError` (naming the field and the
    fix) when more than one engine is asked for and the GPUs are not there. `gpus`: the visible
    count (tests); None probes this machine."""
    size, per_engine = config.data_parallel_size, config.tensor_parallel_size
    if size == 1:
        return 1
    gpus = visible_gpus() if gpus is None else gpus
    if size == "auto":
        return max(1, gpus // per_engine)
    if size * per_engine > gpus:
        import os

        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        raise GPUCountError(
            f"engine.data_parallel_size {size} x tensor_parallel_size {per_engine} needs "
            f"{size * per_engine} GPUs but {gpus} are visible here{where}: pass --gpus "
            f"{max(1, gpus // per_engine)} or fewer (engine.data_parallel_size), or leave it at "
            "auto (every visible GPU)"
        )
    return size


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
        from .vllm_engine import make_vllm_engine

        return make_vllm_engine(config)
    raise ValueError(f"unknown engine kind {config.kind!r}")
