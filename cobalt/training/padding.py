"""Less padding in GRPO's forward and backward passes (issue 38: tokens/s at verl's shape).

TRL pads a process's whole generation batch to its longest completion (and prompt), then runs
every forward pass (the reference model's over the whole batch, the policy's over each
micro-batch) at that width. With responses of mean 200 and a cap of 1024 tokens, a micro-batch
is ~4x padding. Two exact changes (`CobaltGRPOTrainer` applies them, `trim_padding`):

- `by_length`: the micro-batches of one generation batch hold rows of similar completion length
  (sorted, then cut where TRL cuts). With a loss normalised over the whole generation batch
  (dapo, cispo, vespo: TRL's token count `num_items_in_batch`) or by equal-size micro-batches
  (grpo, sapo, dr_grpo) the gradient of the optimizer step is the same sum in another order.
- `trimmed_logps`: each forward pass runs on length-sorted chunks cut to their own longest
  completion (trailing padding) and prompt (leading padding); the log-probabilities land back in
  the full-width tensor (0 past a chunk's longest completion; padding, masked out by every loss). Causal attention never
  looks ahead, and a uniform shift of positions leaves rotary attention unchanged.

verl and NeMo-RL remove padding altogether (sequences packed into one row with per-sequence
attention); this keeps TRL's layout and gets most of the saving with sorted micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# losses whose step gradient does not depend on which rows share a micro-batch
REORDERABLE_LOSSES = ("dapo", "cispo", "vespo", "grpo", "sapo", "dr_grpo")
Compute = Callable[..., tuple[torch.Tensor, torch.Tensor | None, Any]]


def by_length(batches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of equal-size micro-batches regrouped by completion length, longest first, in as
    many micro-batches of the same sizes. Scalars (TRL's `num_items_in_batch`) are kept."""
    if len(batches) < 2:
        return list(batches)
    merged: dict[str, Any] = {}
    for key, first in batches[0].items():
        values = [b[key] for b in batches]
        if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
            merged[key] = first
        elif isinstance(first, torch.Tensor):
            merged[key] = torch.cat(values)
        else:
            merged[key] = [v for value in values for v in value]
    order = torch.argsort(merged["completion_mask"].sum(1), descending=True, stable=True)
    size = len(order) // len(batches)
    out = []
    for i in range(len(batches)):
        rows = order[i * size : (i + 1) * size]
        out.append({key: _rows(value, rows) for key, value in merged.items()})
    return out


def _rows(value: Any, rows: torch.Tensor) -> Any:
    if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
        return value
    if isinstance(value, torch.Tensor):
        return value[rows.to(value.device)]
    return [value[i] for i in rows.tolist()]


def trimmed_logps(
    compute: Compute,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`compute(ids, mask, keep, batch_size=, compute_entropy=)` (TRL's per-token log-probs and
    entropies of the last `keep` positions) over length-sorted chunks of `batch_size` rows, each
    cut to its own longest prompt and completion; the results at full width (0 past a chunk's
    longest completion: padding either way)."""
    rows = input_ids.size(0)
    batch_size = batch_size or rows
    prompt_mask = attention_mask[:, :-logits_to_keep]
    # each completion's length up to its last real token (right padding; a masked token inside
    # a completion stays in)
    positions = torch.arange(1, logits_to_keep + 1, device=attention_mask.device)
    lengths = (attention_mask[:, -logits_to_keep:] * positions).max(1).values
    # leading padding of each (left-padded) prompt
    prompt_pad = (prompt_mask.cumsum(1) == 0).sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)
    logps: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    width = prompt_mask.size(1)
    for start in range(0, rows, batch_size):
        chunk = order[start : start + batch_size]
        keep = max(1, int(lengths[chunk].max()))
        first = int(prompt_pad[chunk].min()) if width else 0
        ids = input_ids[chunk, first : width + keep]
        mask = attention_mask[chunk, first : width + keep]
        part, part_entropy, _ = compute(
            ids, mask, keep, batch_size=len(chunk), compute_entropy=compute_entropy
        )
        if logps is None:
            logps = part.new_zeros((rows, logits_to_keep))
            if compute_entropy and part_entropy is not None:
                entropies = part_entropy.new_zeros((rows, logits_to_keep))
        logps[chunk, :keep] = part
        if entropies is not None and part_entropy is not None:
            entropies[chunk, :keep] = part_entropy
    assert logps is not None
    return logps, entropies
