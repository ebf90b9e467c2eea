"""The micro-batches of a GRPO generation batch, and less padding in their forward and backward
passes.

TRL pads a process's whole generation batch to its longest completion (and prompt), shuffles it
and cuts it into `steps_per_generation` micro-batches, `gradient_accumulation_steps` of them an
optimizer step. `optimizer_windows` cuts it instead:

- Which optimizer step a completion belongs to depends only on its place in the *global*
  generation batch (row g goes to step g mod W, W the optimizer steps of one generation batch),
  never on how many processes share the batch: one process and N processes train each step on
  the same completions (TRL's shuffle draws a different split on every layout, so with two
  optimizer steps a generation batch, as the paper preset has, N GPUs did not compute what one
  computes). The completions of one prompt are i.i.d. samples and TRL's sampler shuffles the
  prompts, so the split is as random as TRL's, and every step holds its share of each group.
- Within an optimizer step (its accumulation window) only, the rows may be regrouped by completion
  length, longest first (`by_length`). The step's gradient is the same sum in another order for
  losses normalised over the generation batch (dapo, cispo, vespo: TRL's token count
  `num_items_in_batch`) or by equal-size micro-batches (grpo, sapo, dr_grpo). Sorting the whole
  buffer instead gave the first optimizer step all the long completions and the second all the
  short ones, which TRL's dapo normaliser (each step assumed to hold 1/W of the tokens) then
  weighted unequally.

`trimmed_logps`: each forward pass runs on length-sorted chunks cut to their own longest
completion (trailing padding) and prompt (leading padding); the log-probabilities land back in the
full-width tensor (0 past a chunk's longest completion; padding, masked out by every loss). Causal
attention never looks ahead, and a uniform shift of positions leaves rotary attention unchanged.

verl and NeMo-RL remove padding altogether (sequences packed into one row with per-sequence
attention); this keeps TRL's layout and gets most of the saving with sorted micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# losses whose step gradient does not depend on which rows share a micro-batch
REORDERABLE_LOSSES = ("dapo", "cispo", "vespo", "grpo", "sapo", "dr_grpo")
Compute = Callable[..., tuple[torch.Tensor, torch.Tensor | None, Any]]


def optimizer_windows(
    batch: dict[str, Any],
    *,
    micro_batches: int,
    windows: int,
    offset: int,
    by_length: bool,
    by_prompt: bool = False,
) -> list[dict[str, Any]]:
    """A process's generation batch (rows `offset` .. `offset + n` of the global one) as
    `micro_batches` equal micro-batches, `micro_batches // windows` per optimizer step: global row
    g goes to step g mod `windows`; within a step, longest completion first when `by_length`, and
    the rows of one prompt together when `by_prompt` (prompts in order of first appearance), so
    that a micro-batch's rows share their prompts
    (`cobalt.training.machinery.packing.packed_logps(share_prompts=True)`).
    Scalars (TRL's `num_items_in_batch`) are kept in every micro-batch."""
    rows = _row_count(batch)
    if micro_batches < 1 or windows < 1 or micro_batches % windows or rows % micro_batches:
        raise ValueError(
            f"{rows} rows do not split into {micro_batches} micro-batches of {windows} "
            "optimizer steps"
        )
    if offset % windows:
        raise ValueError(f"offset {offset} is not a multiple of {windows} optimizer steps")
    lengths = batch["completion_mask"].sum(1).tolist() if by_length else [0] * rows
    prompt = _prompt_ranks(batch) if by_prompt else [0] * rows
    order: list[int] = []
    for window in range(windows):
        members = [i for i in range(rows) if (offset + i) % windows == window]
        members.sort(key=lambda i: (prompt[i], -lengths[i]))  # stable: ties keep their order
        order += members
    size = rows // micro_batches
    return [
        {
            key: _rows(value, torch.tensor(order[k * size : (k + 1) * size]))
            for key, value in batch.items()
        }
        for k in range(micro_batches)
    ]


def _prompt_ranks(batch: dict[str, Any]) -> list[int]:
    """Each row's prompt, as the rank of its first appearance in the batch."""
    seen: dict[tuple[int, ...], int] = {}
    ranks = []
    for ids, mask in zip(batch["prompt_ids"].tolist(), batch["prompt_mask"].tolist(), strict=True):
        key = tuple(t for t, m in zip(ids, mask, strict=True) if m)
        ranks.append(seen.setdefault(key, len(seen)))
    return ranks


def _row_count(batch: dict[str, Any]) -> int:
    for value in batch.values():
        if (isinstance(value, torch.Tensor) and value.ndim > 0) or isinstance(value, list):
            return len(value)
    raise ValueError("a generation batch without rows")


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
