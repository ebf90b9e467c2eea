"""Typed settings of the generation engines: how to sample, and which engine serves which model."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EngineKind = Literal["transformers", "litellm", "vllm", "auto"]
MAX_CONCURRENCY = 4096  # requests in flight of one engine


class SamplingConfig(BaseModel):
    """How to sample completions. Defaults: the paper's trajectory collection (METHOD §1.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1, le=1024, description="Completions sampled per conversation.")
    temperature: float = Field(
        0.6, ge=0.0, le=4.0, description="Sampling temperature; 0 means greedy decoding."
    )
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(
        6144, ge=1, le=1 << 20, description="Most tokens generated per completion."
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="Base seed. Local engines seed their generator with it; API engines send "
        "seed + i for the i-th sample of a conversation (servers may ignore it).",
    )
    thinking: bool | None = Field(
        None,
        description="Chat templates' `enable_thinking`: True/False to force reasoning on or off, "
        "None to keep the template's default.",
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def chat_template_kwargs(self) -> dict[str, Any]:
        return {} if self.thinking is None else {"enable_thinking": self.thinking}


class EngineConfig(BaseModel):
    """Which engine generates, for which model, and how hard it may push its backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EngineKind = Field(
        "transformers",
        description="transformers: local model in this process; litellm: an API model or any "
        "OpenAI-compatible server; vllm: vLLM on this machine's GPUs (in this process on one, "
        "a local `vllm serve` on several: data_parallel_size); auto: vllm on a GPU with vLLM "
        "importable for a model of 50M+ parameters, else transformers (engines.auto: vLLM's "
        "start-up costs more than it saves on a tiny model).",
    )
    model: str = Field(
        description="Local engines: a model directory (loaded with from_pretrained). litellm: a "
        "LiteLLM model name, e.g. `openai/gpt-4o-mini`, or `openai/<served-name>` with api_base.",
    )
    api_base: str | None = Field(
        None, description="litellm: base URL of an OpenAI-compatible server, e.g. http://h:8000/v1."
    )
    api_key_env: str | None = Field(
        None,
        description="litellm: name of the environment variable holding the API key (the key "
        "itself is never stored nor logged). A missing variable fails before the first request. "
        "None: no key is sent (local servers) and LiteLLM's own defaults apply.",
    )
    timeout_s: float = Field(600.0, gt=0, le=86400, description="Seconds per request (litellm).")
    max_retries: int = Field(
        3, ge=0, le=100, description="Retries of a request after a transient error (litellm)."
    )
    retry_backoff_s: float = Field(
        1.0,
        ge=0,
        le=600,
        description="First retry delay; doubles per retry, capped at 60 s; a server's "
        "Retry-After of up to 60 s wins (litellm).",
    )
    concurrency: int = Field(
        16,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Requests in flight at once (litellm; vllm on several GPUs sends every "
        f"request of a call at once, up to {MAX_CONCURRENCY}).",
    )
    use_n: bool | None = Field(
        None,
        description="litellm: send `n` in one request (True), one request per sample (False), or "
        "try `n` and fall back to single requests when the server returns fewer choices or "
        "rejects it (None).",
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="transformers: most conversations per padded generate() call (each expands "
        "to n rows); None: 8 on CPU, on GPU as many as the memory budget holds. With a memory "
        "budget (GPU, or memory_budget_gb) fewer when they do not fit.",
    )
    memory_fraction: float = Field(
        0.85,
        gt=0,
        le=1,
        description="transformers on GPU: share of the free GPU memory (measured after the model "
        "is loaded, at each generate call) that the padded batches' KV cache and activations "
        "may use; conversations are grouped so each batch's estimate fits (docs/ENGINES.md).",
    )
    memory_budget_gb: float | None = Field(
        None,
        gt=0,
        description="transformers: most memory a padded batch may use, in GB (1e9 bytes): caps "
        "free GPU memory x memory_fraction, and turns the memory rule on for CPU. None: measured "
        "on GPU, no memory rule on CPU (batches of batch_size).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype of local engines; auto: bfloat16 on GPU, float32 on CPU."
    )
    device: str = Field(
        "auto", description="transformers: torch device (auto: cuda when available, else cpu)."
    )
    continuous_batching: bool = Field(
        False,
        description="transformers: use generate_batch (continuous batching, paged KV cache) when "
        "the installed transformers has it; falls back to padded batches otherwise.",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vllm: GPUs per model.")
    data_parallel_size: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto",
        description="vllm: copies of the model, one per tensor_parallel_size GPUs, that share "
        "each call's conversations. 1: vLLM in this process (LLM.chat); N > 1: a local `vllm "
        "serve --data-parallel-size N` reached through the litellm engine (engines/"
        "served_engine.py); auto: every visible GPU (visible GPUs // tensor_parallel_size, at "
        "least 1), resolved where the engine is made (engines.resolve_data_parallel).",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vllm: fraction of GPU memory vLLM may take."
    )
    max_model_len: int | None = Field(
        None, ge=1, description="vllm: context length (prompt + completion); None: the model's."
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments passed as-is: to litellm.acompletion (e.g. "
        "extra_body), to vllm.LLM(...), or to from_pretrained (transformers).",
    )

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.api_base is not None and self.kind != "litellm":
            raise ValueError("api_base only applies to kind='litellm'")
        if self.data_parallel_size not in (1, "auto") and self.kind in ("transformers", "litellm"):
            raise ValueError(
                f"data_parallel_size {self.data_parallel_size} applies to kind 'vllm' (or 'auto' "
                f"on a GPU host with vLLM), not {self.kind!r}: leave it at 'auto' or 1"
            )
        return self

    def resolved(self) -> EngineConfig:
        """This config with `kind="auto"` replaced by the kind it means here (`resolve_kind`);
        where auto picks an engine without data parallelism (transformers for a tiny model), a
        data_parallel_size asked of auto (`--gpus N`) goes back to auto: the stage runs on one
        GPU, as its plan says (engines.plan)."""
        if self.kind != "auto":
            return self
        from . import resolve_kind

        kind = resolve_kind("auto", model=self.model)
        update: dict[str, Any] = {"kind": kind}
        if kind != "vllm":
            update["data_parallel_size"] = "auto"
        return self.model_copy(update=update)

    def api_key(self) -> str | None:
        """The API key from `api_key_env`, or None when no variable is configured.

        Raises `MissingAPIKeyError` (naming the variable, never a value) when it is unset or empty.
        """
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env, "")
        if not value:
            raise MissingAPIKeyError(
                f"environment variable {self.api_key_env} (api_key_env) is not set or empty; "
                f"export {self.api_key_env}=<key> for model {self.model!r}"
            )
        return value

    def __repr_args__(self):  # never show a key even if someone puts one into `extra`
        for name, value in super().__repr_args__():
            if name == "extra" and isinstance(value, dict):
                value = {k: ("***" if "key" in k.lower() else v) for k, v in value.items()}
            yield name, value


class MissingAPIKeyError(RuntimeError):
    """The environment variable named by `EngineConfig.api_key_env` is unset or empty."""


class GPUCountError(RuntimeError):
    """`EngineConfig.data_parallel_size` asks for more GPUs than this machine shows."""
