"""The recipe's KL penalty, k2 (verl's `kl_loss_type="mse"`), as pure functions of tensors.

k2 = 0.5 (log pi - log pi_ref)^2 per completion token; its gradient is (log pi - log pi_ref),
linear in the drift. TRL's GRPO trainer has one estimator, k3 = exp(r) - r - 1 with
r = log pi_ref - log pi, whose gradient is 1 - pi_ref / pi. Both are 0 at the start of training and
part as the policy drifts. The penalty enters the loss as beta * `aggregate(k2_per_token(...))`,
reduced exactly as TRL reduces the policy term of the run's loss type, so that beta means the same
as in TRL's loss. The trainer that adds it to TRL's loss: `cobalt.training.machinery.trl_trainer`.
"""

from __future__ import annotations

from typing import Any

K2_LOSS_TYPES = ("dapo", "cispo", "vespo", "grpo", "sapo", "bnpo", "dr_grpo")


def k2_per_token(logps: Any, ref_logps: Any) -> Any:
    """0.5 (log pi - log pi_ref)^2, elementwise ([B, T] tensors in, one out)."""
    return 0.5 * (logps - ref_logps) ** 2


def aggregate(
    per_token: Any,
    mask: Any,
    loss_type: str,
    *,
    accumulation: float = 1.0,
    num_items_in_batch: Any = None,
    processes: int = 1,
    steps_per_generation: int = 1,
    max_completion_length: int | None = None,
    training: bool = True,
) -> Any:
    """`per_token` [B, T] reduced over `mask` as TRL 1.16 reduces the policy term of `loss_type`:
    dapo, cispo and vespo divide the token sum by the step's token count (`num_items_in_batch`, over
    every process and micro-batch of the accumulation window); grpo and sapo average each
    sequence, then the sequences; bnpo divides by this micro-batch's tokens; dr_grpo by
    rows x `max_completion_length`. `accumulation`: the gradient accumulation steps (training)."""
    if loss_type not in K2_LOSS_TYPES:
        raise ValueError(f"k2 aggregation for loss type {loss_type!r}: use one of {K2_LOSS_TYPES}")
    if loss_type in ("dapo", "cispo", "vespo"):
        normalizer = num_items_in_batch.clamp(min=1.0) / processes
        if training:
            normalizer = normalizer * accumulation / steps_per_generation
        return (per_token * mask).sum() / normalizer
    if loss_type in ("grpo", "sapo"):
        per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_sequence.mean() / accumulation
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    total = per_token.size(0) * max_completion_length  # dr_grpo
    return (per_token * mask).sum() / total / accumulation
