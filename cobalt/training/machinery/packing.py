"""Packed forward passes: a micro-batch's sequences laid end to end in one row, no padding token
computed.

TRL pads every row of a micro-batch to its longest prompt and completion; `trimmed_logps`
(`cobalt.training.machinery.padding`) cuts each chunk to its own longest. `packed_logps` removes the
padding altogether: each row's real tokens (its prompt without the left padding, its completion up
to its last real token) are concatenated into a single row, positions restart at 0 for each
sequence, and attention stays inside each sequence. The per-token log-probabilities and entropies
land back in TRL's full-width layout.

`use_packed_attention` gives the model `cobalt_packed` (registered in transformers' attention and
mask registries) for its whole life: a call that carries `cu_seq_lens_q` (a packed forward, and
its recomputation under gradient checkpointing, which runs in the backward pass) attends inside
each sequence; any other call is SDPA with its usual mask, as before.

What it computes is what one sequence alone computes: positions from 0 (as vLLM generated it),
causal attention over its own tokens. The padded path shifts a left-padded prompt's positions by
its padding, which rotary attention does not see (a uniform shift), so the two agree to rounding.

Attention kernels (`KERNEL`): on a GPU in half precision, PyTorch's variable-length
FlashAttention (`torch.nn.attention.varlen.varlen_attn`, forward and backward, no padding
computed); elsewhere (CPU, float32), or with `KERNEL = "sdpa"`, PyTorch's SDPA one sequence at a
time. Under bf16 autocast over float32 weights a query can arrive in float32 (`compute_dtype`):
it is cast to the autocast's dtype for the varlen kernel, as SDPA's autocast does (without it, a
Qwen3-shaped model silently ran the one-sequence-at-a-time loop on a GPU; docs/RESULTS.md).

Rows whose attention mask has holes inside a completion (a masked tool output) cannot be packed
this way; `packable` says so and the caller keeps its padded path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import pairwise
from typing import Any

import torch

ATTENTION = "cobalt_packed"
_PACKED: ContextVar[bool] = ContextVar("cobalt_packed_forward", default=False)
HALF = (torch.float16, torch.bfloat16)
# the packed attention's kernel: "varlen" (PyTorch's variable-length FlashAttention where it
# runs: a GPU, half precision) or "sdpa" (SDPA one sequence at a time, everywhere)
KERNEL = "varlen"
VARLEN_DEVICES = ("cuda",)  # where PyTorch's varlen_attn runs


def packable(attention_mask: torch.Tensor, logits_to_keep: int) -> bool:
    """Every row one run of real tokens through the prompt's last position: a left-padded prompt
    and a right-padded completion (TRL's layout), no hole inside."""
    width = attention_mask.size(1)
    positions = torch.arange(width, device=attention_mask.device)
    real = attention_mask.bool()
    first = torch.where(real, positions, width).min(1).values
    last = torch.where(real, positions, -1).max(1).values
    prompt_end = width - logits_to_keep - 1
    one_run = (last - first + 1).clamp(min=0) == real.sum(1)
    return bool((one_run & (first <= prompt_end) & (last >= prompt_end)).all())


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> dict[str, Any]:
    """The rows' real tokens end to end, each row one sequence with positions from 0: the packed
    `ids` and `positions` [1, T], the sequences' bounds `cu_q` (int32) and each row's `starts`,
    the index of its prompt's last token (which predicts the completion's first)."""
    real = attention_mask.bool()
    lengths = real.sum(1)
    ids = input_ids[real]  # row-major: each row's tokens in order, rows one after another
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = lengths.cumsum(0)
    positions = torch.arange(ids.numel(), device=ids.device) - torch.repeat_interleave(
        cu[:-1], lengths
    )
    prompt_real = attention_mask[:, :-logits_to_keep].sum(1)
    return {
        "ids": ids[None],
        "positions": positions[None],
        "cu_q": cu,
        "starts": cu[:-1].long() + prompt_real - 1,
    }


def pack_shared(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> dict[str, Any]:
    """`pack` with each distinct prompt once: for the rows of one prompt P, P without its last
    token (a segment attending to itself), then per row P's last token and its completion (a
    segment attending to the shared part and to itself). Adds the keys each segment reads
    (`key_index` into the packed row) and their bounds (`cu_k`)."""
    width = attention_mask.size(1)
    prompt_width = width - logits_to_keep
    real = attention_mask.bool().cpu()
    rows = input_ids.cpu().tolist()
    prompts: dict[tuple[int, ...], list[int]] = {}
    for r, row in enumerate(rows):
        kept = real[r, :prompt_width].tolist()
        prompt = tuple(t for t, m in zip(row[:prompt_width], kept, strict=True) if m)
        prompts.setdefault(prompt, []).append(r)
    ids: list[int] = []
    positions: list[int] = []
    cu_q, cu_k, key_index = [0], [0], []
    starts = [0] * len(rows)
    for prompt, members in prompts.items():
        shared = list(range(len(ids), len(ids) + len(prompt) - 1))
        if shared:  # the prompt but its last token: one segment
            ids += prompt[:-1]
            positions += range(len(prompt) - 1)
            key_index += shared
            cu_q.append(len(ids))
            cu_k.append(len(key_index))
        for r in members:
            count = int(real[r, prompt_width:].sum())
            starts[r] = len(ids)
            own = list(range(len(ids), len(ids) + 1 + count))
            ids += [prompt[-1], *rows[r][prompt_width : prompt_width + count]]
            positions += range(len(prompt) - 1, len(prompt) + count)
            key_index += shared + own
            cu_q.append(len(ids))
            cu_k.append(len(key_index))
    device = input_ids.device

    def tensor(values: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return {
        "ids": tensor(ids)[None],
        "positions": tensor(positions)[None],
        "cu_q": tensor(cu_q, torch.int32),
        "cu_k": tensor(cu_k, torch.int32),
        "key_index": tensor(key_index),
        "starts": tensor(starts),
    }


def packed_logps(
    forward: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    compute_entropy: bool = False,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`forward(**inputs)` (a causal LM with TRL's fused head, `model(..., fused_lm_head=True)`)
    once over the packed rows (`pack`; `share_prompts`: `pack_shared`, each distinct prompt's
    tokens through the model once); each completion token's log-probability (and entropy) at
    TRL's full width [rows, logits_to_keep], 0 where the row has no real token."""
    layout = pack_shared if share_prompts else pack
    packed = layout(input_ids, attention_mask, logits_to_keep)
    ids, cu_q = packed["ids"], packed["cu_q"]
    cu_k = packed.get("cu_k", cu_q)
    completion = attention_mask[:, -logits_to_keep:].bool()
    row_of, column = completion.nonzero(as_tuple=True)
    # completion token j of row r is predicted at its row's start + j; every other position is
    # unscored (prompt tokens, each sequence's last token)
    source = packed["starts"][row_of] + column
    shift = torch.full_like(ids[0], -100)
    shift[source] = ids[0, source + 1]
    extra = {"cobalt_key_index": packed["key_index"]} if "key_index" in packed else {}
    with packed_forward():
        outputs = forward(
            input_ids=ids,
            position_ids=packed["positions"],
            shift_labels=shift[None],
            fused_lm_head=True,
            use_cache=False,
            cu_seq_lens_q=cu_q,
            cu_seq_lens_k=cu_k,
            max_length_q=int(cu_q.diff().max()),
            max_length_k=int(cu_k.diff().max()),
            **extra,
        )
    rows = attention_mask.size(0)
    logps = outputs.log_probs[0].new_zeros((rows, logits_to_keep))
    logps[row_of, column] = outputs.log_probs[0][source]
    entropies = None
    if compute_entropy and outputs.entropy is not None:
        entropies = outputs.entropy[0].new_zeros((rows, logits_to_keep))
        entropies[row_of, column] = outputs.entropy[0][source]
    return logps, entropies


def use_packed_attention(model: torch.nn.Module) -> None:
    """Switch `model` (and the submodels it wraps) to `cobalt_packed` for good: SDPA for every
    call but the packed ones, which attend inside each sequence. A switch for the model's whole
    life, not one forward: gradient checkpointing recomputes each layer in the backward pass,
    outside any forward's scope, and must run the attention the forward ran. A model loaded with
    FlashAttention keeps it (transformers' own varlen path reads the packed positions)."""
    register()
    for module in model.modules():
        config = getattr(module, "config", None)
        current = getattr(config, "_attn_implementation_internal", "absent")
        if current in (ATTENTION, "absent") or str(current).startswith("flash_attention"):
            continue
        if current not in (None, "sdpa"):
            raise ValueError(
                f"training.packing: the model attends with {current!r}; packing runs on sdpa "
                "(the default) or flash_attention_2/3: set training.attn_implementation to one "
                "of them, or training.packing false"
            )
        # transformers' private field (PRIVATE_SURFACE, machinery/trl_trainer.py): the switch
        config._attn_implementation_internal = ATTENTION


@contextmanager
def packed_forward() -> Iterator[None]:
    """Inside: the model's forward is a packed one (its mask function builds no mask)."""
    token = _PACKED.set(True)
    try:
        yield
    finally:
        _PACKED.reset(token)


def register() -> None:
    """`cobalt_packed` in transformers' attention and mask registries."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, packed_mask)


def packed_mask(*args: Any, **kwargs: Any) -> Any:
    """No mask for a packed forward (attention follows cu_seq_lens); SDPA's mask otherwise."""
    if _PACKED.get():
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention inside each packed sequence (`cu_seq_lens_q`): query [1, H, T, D], key and
    value [1, Hkv, T, D]; returns [1, T, H, D] as transformers' attention functions do. A call
    without `cu_seq_lens_q` (a padded forward, generation) is transformers' SDPA attention."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            sliding_window=sliding_window, softcap=softcap, **kwargs,
        )  # fmt: skip
    if sliding_window is not None or softcap is not None or dropout:
        raise ValueError(
            "training.packing: this model's attention uses a sliding window, a soft cap or "
            "dropout, which the packed attention does not implement; set training.packing false"
        )
    if query.size(0) != 1:
        raise ValueError("packed attention needs the sequences packed into one row")
    index = kwargs.get("cobalt_key_index")
    if index is not None:  # shared prompts: each segment reads its keys through the index
        key, value = key[:, :, index], value[:, :, index]
    longest = (kwargs.get("max_length_q"), kwargs.get("max_length_k"))
    cu_k = kwargs.get("cu_seq_lens_k")
    return _attend_packed(
        query, key, value, cu, cu if cu_k is None else cu_k, scaling, longest
    ), None


def _attend_packed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: torch.Tensor,
    cu_k: torch.Tensor,
    scaling: float | None,
    longest: tuple[int | None, int | None] = (None, None),
) -> torch.Tensor:
    """Causal attention of each query segment (`cu`) over its key segment (`cu_k`), aligned at
    the end (a segment's last query sees every key of its segment, as a continuation of the
    keys before it does): [1, T, H, D]."""
    groups = query.size(1) // key.size(1)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, D]
    half = compute_dtype(query)
    if (
        KERNEL == "varlen"
        and q.device.type in VARLEN_DEVICES
        and half is not None
        and _varlen() is not None
    ):
        q, k, v = (x.to(half) for x in (q, k, v))
        max_q = int(longest[0] or cu.diff().max())
        max_k = int(longest[1] or cu_k.diff().max())
        out = _varlen_call(q, k, v, cu, cu_k, max_q, max_k, scaling, groups)
    else:
        out = torch.empty_like(q)
        for (start, end), (k_start, k_end) in zip(
            pairwise(cu.tolist()), pairwise(cu_k.tolist()), strict=True
        ):
            if end == start:
                continue
            extra = (k_end - k_start) - (end - start)  # keys before the segment's first query
            mask = None
            if extra:
                rows = torch.arange(end - start, device=q.device)[:, None]
                cols = torch.arange(k_end - k_start, device=q.device)[None, :]
                mask = cols <= rows + extra
            part = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, start:end],
                key[:, :, k_start:k_end],
                value[:, :, k_start:k_end],
                attn_mask=mask,
                is_causal=mask is None,
                scale=scaling,
                enable_gqa=groups > 1,
            )
            out[start:end] = part[0].transpose(0, 1)
    return out[None]


def compute_dtype(query: torch.Tensor) -> torch.dtype | None:
    """The half-precision dtype the attention computes in: the query's own, or the autocast's.
    Under bf16 autocast over float32 weights the query is often float32 (Qwen3's q_norm and the
    rotary embedding compute in float32) while SDPA would autocast it to bf16: so does this."""
    if query.dtype in HALF:
        return query.dtype
    device = query.device.type
    if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in HALF:
        return torch.get_autocast_dtype(device)
    return None


def _varlen() -> Callable[..., torch.Tensor] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _varlen_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scaling: float | None,
    groups: int,
) -> torch.Tensor:
    """`varlen_attn`, causal, across the signatures PyTorch has shipped (2.9+: `is_causal`; later:
    `window_size=(-1, 0)` and `enable_gqa`)."""
    varlen = _varlen()
    assert varlen is not None
    accepted = inspect.signature(varlen).parameters
    options: dict[str, Any] = {}
    if "window_size" in accepted:
        options["window_size"] = (-1, 0)
    else:
        options["is_causal"] = True
    if scaling is not None and "scale" in accepted:
        options["scale"] = scaling
    elif scaling is not None and abs(scaling - q.size(-1) ** -0.5) > 1e-12:
        raise ValueError("this PyTorch's varlen_attn takes no scale; the model needs one")
    if groups > 1:
        if "enable_gqa" in accepted:
            options["enable_gqa"] = True
        else:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
    return varlen(q, k, v, cu.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, **options)
