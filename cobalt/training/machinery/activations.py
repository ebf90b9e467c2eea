"""Activation memory of one checkpointed forward/backward pass of GRPO's loss: what a
micro-batch adds to the fixed state `cobalt.training.machinery.memory` counts (pure arithmetic over
the model's config, `engines.memory` for the per-layer shapes).

    per sequence = layers x length x hidden x residual bytes      (checkpointed layer inputs)
                 + length x activation bytes per token x 2         (one layer recomputed + grads)
                 + completion x hidden x 4   (the fused head's float32 gradient of the last
                                              hidden states; never the logits: TRL tiles them)

With prompts shared (--share-prompts) a micro-batch computes each of its prompts once for the
rows that sample it, so its length is the prompts' tokens once plus every row's completion, and
each row's attention gathers the shared keys and values of the layer it is in.
"""

from __future__ import annotations

from typing import Any

from engines.memory import (
    activation_bytes_per_token,
    dtype_bytes,
    kv_bytes_per_token,
    text_config,
)

# TRL 1.16's fused head (trl.kernels.chunked_logprob): a tile is 4,096 tokens x 32,768 vocabulary
# entries in the compute dtype, one in the forward and one in the backward
HEAD_TILE = 4096 * 32768


def fused_head_bytes(model_config: Any, compute_dtype: str) -> int:
    """The backward of TRL's fused head beyond the sequences' own: the float32 accumulator of
    the head's weight gradient (vocabulary x hidden x 4) and two logit tiles."""
    config = text_config(model_config)
    head = int(config.vocab_size) * int(config.hidden_size) * 4
    return head + 2 * HEAD_TILE * dtype_bytes(compute_dtype)


def sequence_bytes(
    model_config: Any,
    sequence_tokens: int,
    completion_tokens: int,
    *,
    compute_dtype: str,
    residual_dtype: str,
) -> int:
    """Activation bytes of one sequence in a checkpointed forward/backward (module docstring)."""
    config = text_config(model_config)
    compute = dtype_bytes(compute_dtype)
    checkpoints = (
        int(config.num_hidden_layers)
        * sequence_tokens
        * int(config.hidden_size)
        * dtype_bytes(residual_dtype)
    )
    layer = sequence_tokens * activation_bytes_per_token(config, compute) * 2
    head = completion_tokens * int(config.hidden_size) * 4  # the fused head's hidden gradient
    return checkpoints + layer + head


def prompts_in_micro_batch(rows: int, group: int, rows_per_step: int) -> int:
    """The most prompts a micro-batch of `rows` holds when a step's rows come `group` to a prompt,
    put together by prompt (`optimizer_windows(by_prompt=True)`). Aligned (each process's step
    whole groups, micro-batches whole groups or within one): rows / group, or 1; else a
    micro-batch may also straddle a group at each end."""
    if group <= 1:
        return rows
    if rows_per_step % group == 0 and (rows % group == 0 or group % rows == 0):
        return max(1, rows // group)
    return min(rows, -(-rows // group) + 1)


def micro_batch_bytes(
    model_config: Any,
    rows: int,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    compute_dtype: str,
    residual_dtype: str,
    group: int = 1,
    rows_per_step: int = 1,
) -> int:
    """Activation bytes of a micro-batch of `rows` rows at their longest. With prompts shared
    (`group` rows to a prompt, --share-prompts) a prompt's tokens are computed once for its rows
    in the micro-batch, and each row's attention gathers the shared keys and values of its layer
    (and their gradients in the backward pass); else `rows` whole sequences."""
    prompts = prompts_in_micro_batch(rows, group, rows_per_step)
    found = sequence_bytes(
        model_config,
        prompts * prompt_tokens + rows * completion_tokens,
        rows * completion_tokens,
        compute_dtype=compute_dtype,
        residual_dtype=residual_dtype,
    )
    if group > 1:
        layers = int(text_config(model_config).num_hidden_layers)
        per_layer = kv_bytes_per_token(model_config, dtype_bytes(compute_dtype)) // layers
        found += rows * (prompt_tokens + completion_tokens) * per_layer * 2
    return found
