"""Memory-aware batching of padded generation: how many conversations fit on the GPU at once.

Pure functions over a transformers model config (no torch import). A padded batch of `rows`
sequences, `width` prompt tokens wide (the longest prompt, left-padded), generating up to
`max_new_tokens`, needs about

    rows * (width + max_new_tokens) * kv_per_token      the KV cache, at its largest
  + rows * width * activation_per_token                  prefill activations (one layer at a time)
  + rows * logits_per_row                                fp32 logits of the last position and the
                                                         sampling's copies of them

and `plan_batches` groups conversations (n rows each) so that every batch fits a budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}
# Concurrent fp32 copies of a row's last-position logits while sampling: the logits, the
# processed scores, top-p's sorted values and their int64 indices (two fp32 widths), the softmax.
LOGITS_COPIES = 6
FIXES = (
    "lower SamplingConfig.n or SamplingConfig.max_new_tokens, raise EngineConfig.memory_fraction "
    "(or memory_budget_gb), use a smaller model or dtype, or use the vllm engine (paged KV cache)"
)


class InsufficientMemoryError(RuntimeError):
    """Even one conversation (its n rows) does not fit the memory budget."""


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a torch dtype (or its name, e.g. "bfloat16", "torch.float16")."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[name]


def text_config(config: Any) -> Any:
    """The language model's part of a config (multimodal configs nest it as text_config)."""
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        return getter()
    return getattr(config, "text_config", None) or config


def _shape(config: Any) -> tuple[int, int, int, int]:
    """(layers, attention heads, KV heads, head dim) of a decoder config."""
    config = text_config(config)
    heads = int(config.num_attention_heads)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return int(config.num_hidden_layers), heads, int(kv_heads), int(head_dim)


def kv_bytes_per_token(config: Any, bytes_per_element: int) -> int:
    """KV-cache bytes per token: 2 (K and V) x layers x KV heads x head dim x dtype bytes."""
    layers, _, kv_heads, head_dim = _shape(config)
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def activation_bytes_per_token(config: Any, bytes_per_element: int) -> int:
    """Peak prefill activation bytes per token of one decoder layer, a conservative estimate.

    The MLP dominates: gate, up, act(gate) and their product are 4 intermediate-wide tensors; add
    q, k, v (twice: before and after the rotary embedding) and 6 hidden-wide residual/norm copies.
    """
    _, heads, kv_heads, head_dim = _shape(config)
    config = text_config(config)
    intermediate = getattr(config, "intermediate_size", None) or 4 * config.hidden_size
    qkv = (heads + 2 * kv_heads) * head_dim
    return (4 * int(intermediate) + 2 * qkv + 6 * int(config.hidden_size)) * bytes_per_element


def logits_bytes_per_row(config: Any) -> int:
    """fp32 logits of a row's last position, times the copies sampling makes (LOGITS_COPIES)."""
    return int(text_config(config).vocab_size) * 4 * LOGITS_COPIES


@dataclass(frozen=True)
class Footprint:
    """Per-token and per-row memory costs of one model in one dtype."""

    kv_per_token: int
    activation_per_token: int
    logits_per_row: int

    @classmethod
    def of(cls, config: Any, dtype: Any) -> Footprint:
        size = dtype_bytes(dtype)
        return cls(
            kv_bytes_per_token(config, size),
            activation_bytes_per_token(config, size),
            logits_bytes_per_row(config),
        )

    def batch_bytes(self, width: int, rows: int, max_new_tokens: int) -> int:
        """Bytes of a padded batch of `rows` sequences with prompts `width` tokens wide."""
        return rows * (
            (width + max_new_tokens) * self.kv_per_token
            + width * self.activation_per_token
            + self.logits_per_row
        )


def plan_batches(
    lengths: Sequence[int],
    rows_per_conversation: int,
    max_new_tokens: int,
    footprint: Footprint,
    budget_bytes: int | None,
    cap: int,
) -> list[list[int]]:
    """Groups of conversation indices (into `lengths`), one group per padded generate call.

    With a budget, conversations are sorted longest first (similar lengths share a batch, and the
    largest batch comes first), then grouped greedily: a group grows while its batch, padded to
    its longest prompt, fits `budget_bytes` and holds at most `cap` conversations. Without a
    budget: consecutive groups of `cap` in input order. The caller puts results back by index.
    Raises `InsufficientMemoryError` when one conversation alone does not fit.
    """
    if cap < 1 or rows_per_conversation < 1:
        raise ValueError("cap and rows_per_conversation must be at least 1")
    if budget_bytes is None:
        return [list(range(s, min(s + cap, len(lengths)))) for s in range(0, len(lengths), cap)]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    width = 0
    for i in order:
        check_fits(lengths[i], rows_per_conversation, max_new_tokens, footprint, budget_bytes, i)
        if groups and len(groups[-1]) < cap:
            grown = footprint.batch_bytes(
                max(width, lengths[i]),
                (len(groups[-1]) + 1) * rows_per_conversation,
                max_new_tokens,
            )
            if grown <= budget_bytes:
                groups[-1].append(i)
                width = max(width, lengths[i])
                continue
        groups.append([i])
        width = lengths[i]
    return groups


def check_fits(
    prompt_tokens: int,
    rows: int,
    max_new_tokens: int,
    footprint: Footprint,
    budget_bytes: int,
    index: int | None = None,
) -> None:
    """Raise `InsufficientMemoryError` if one conversation's `rows` do not fit `budget_bytes`."""
    needed = footprint.batch_bytes(prompt_tokens, rows, max_new_tokens)
    if needed <= budget_bytes:
        return
    which = "a conversation" if index is None else f"conversation {index}"
    raise InsufficientMemoryError(
        f"{which} does not fit in memory even alone: {prompt_tokens} prompt tokens x n={rows} "
        f"rows with max_new_tokens={max_new_tokens} need about {needed / 1e9:.3f} GB "
        f"({needed} bytes) but the budget is {budget_bytes / 1e9:.3f} GB ({budget_bytes} bytes); "
        f"{FIXES}"
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an accelerator out-of-memory error (torch's or by its message)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "OutOfMemoryError" in names or "out of memory" in str(exc).lower()
