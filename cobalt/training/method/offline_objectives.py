"""The offline objectives (the paper's METHOD §2): AWR (advantage-weighted regression), REINFORCE
with the leave-one-out baseline, and PPO's clipped ratio, as pure functions of tensors, testable on
a CPU without a model.

Objectives, with l_t = log pi(y_t | x, y_<t) of completion token t under the policy (temperature 1)
and A the row's leave-one-out advantage; every loss is a token-level mean over the completion
tokens of the whole optimizer step (as TRL's "dapo" loss: the step's token count taken over every
micro-batch of its accumulation window and every process), so a step's gradient is the same on one
process as on N, whatever its micro-batches:

- `reinforce_loo`: -A * l_t (REINFORCE with the leave-one-out baseline, "Buy 4 REINFORCE
  samples"); row weight w = 1.
- `awr`: -w * l_t with w = min(exp(A / beta), max_weight) (advantage-weighted regression, AWAC):
  a weighted SFT on the logged turns that favours the better ones; every row has w > 0.
- `clipped_ratio`: -min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A) with r_t = exp(l_t - l_ref_t)
  (PPO's clipped surrogate). l_ref are the starting policy's log-probabilities (the reference
  model that collected the trajectories, unless another --model is given), computed once before
  the first step, under the same precision as training, and carried in the dataset's
  `ref_logprobs` column; a resumed run computes them again from the same starting weights. At the
  first step r = 1 and the gradient is REINFORCE's; the clip bounds how far later steps and epochs
  move each token's probability from the reference. The reference log-probabilities are the same
  numbers in every process: each computes them for every row on a plain copy of the starting
  policy on its own device, before the trainer shards the model (FSDP and ZeRO-3 place it only when
  training starts), so a pass takes as long on N processes as on one. The logged turns were sampled
  at temperature
  0.6 / top-p 0.95, so l_ref is not the behaviour policy's probability: the ratio is a trust
  region around the starting policy, not an importance correction for the sampling.

The trainer around them: `cobalt.training.offline`.
"""

from __future__ import annotations

from typing import Any, Protocol


class ObjectiveSettings(Protocol):
    """What an objective reads of the offline settings
    (`cobalt.training.settings.OfflineSettings`)."""

    objective: str
    awr_beta: float
    awr_max_weight: float
    ratio_clip: float

    def clip_high(self) -> float: ...


def awr_weights(advantages: Any, beta: float, max_weight: float) -> Any:
    """min(exp(A / beta), max_weight), elementwise (a tensor in, a tensor out)."""
    import torch

    return torch.clamp(torch.exp(advantages / beta), max=max_weight)


def offline_loss(
    logprobs: Any,
    mask: Any,
    advantages: Any,
    settings: ObjectiveSettings,
    ref_logprobs: Any | None = None,
    normalizer: Any | None = None,
) -> tuple[Any, dict[str, float]]:
    """The objective's loss and its metrics. `logprobs` [B, T]: the policy's log-probability of
    each target token; `mask` [B, T]: 1 on completion tokens; `advantages` [B]; `ref_logprobs`
    [B, T] (clipped_ratio only); `normalizer`: what the token sum is divided by (the trainer's
    share of the optimizer step's tokens; None: this micro-batch's own tokens, a token mean).
    Metrics are this micro-batch's."""
    import torch

    mask = mask.to(logprobs.dtype)
    tokens = mask.sum().clamp(min=1.0)
    row_tokens = mask.sum(dim=1).clamp(min=1.0)
    adv = advantages.to(logprobs.dtype)
    metrics: dict[str, float] = {}
    objective = settings.objective
    if objective == "reinforce_loo":
        weights = torch.ones_like(adv)
        per_token = -adv[:, None] * logprobs
    elif objective == "awr":
        weights = awr_weights(adv, settings.awr_beta, settings.awr_max_weight).detach()
        per_token = -weights[:, None] * logprobs
        metrics["weight_capped"] = float((weights >= settings.awr_max_weight).to(adv.dtype).mean())
    elif objective == "clipped_ratio":
        if ref_logprobs is None:
            raise ValueError("clipped_ratio needs the reference log-probabilities (ref_logprobs)")
        ratio = torch.exp(logprobs - ref_logprobs.to(logprobs.dtype))
        low, high = 1.0 - settings.ratio_clip, 1.0 + settings.clip_high()
        a = adv[:, None]
        unclipped, clipped = ratio * a, torch.clamp(ratio, low, high) * a
        per_token = -torch.min(unclipped, clipped)
        weights = ((ratio * mask).sum(dim=1) / row_tokens).detach()
        active = ((ratio < low) & (a < 0)) | ((ratio > high) & (a > 0))
        metrics["ratio"] = float(weights.mean())
        metrics["clip_fraction"] = float((active.to(mask.dtype) * mask).sum() / tokens)
    else:
        raise ValueError(
            f"offline objective {objective!r}: use reinforce_loo, awr or clipped_ratio"
        )
    if ref_logprobs is not None and objective != "clipped_ratio":  # diagnostics: drift only
        log_ratio = (logprobs.detach() - ref_logprobs.to(logprobs.dtype)) * mask
        metrics["ratio"] = float(((torch.exp(log_ratio) * mask).sum(dim=1) / row_tokens).mean())
    if ref_logprobs is not None:
        back = (ref_logprobs.to(logprobs.dtype) - logprobs.detach()) * mask
        k3 = (torch.exp(back) - back - 1.0) * mask
        metrics["kl_ref"] = float(k3.sum() / tokens)
        metrics["logprob_drift"] = float(-back.sum() / tokens)
    loss = (per_token * mask).sum() / (tokens if normalizer is None else normalizer)
    row_logprob = (logprobs.detach() * mask).sum(dim=1) / row_tokens
    for name, rows in (("logprob_positive", adv > 0), ("logprob_negative", adv < 0)):
        if bool(rows.any()):
            metrics[name] = float(row_logprob[rows].mean())
    signal = (weights * adv).abs()
    negative = adv < 0
    metrics |= {
        "advantage": float(adv.mean()),
        "advantage_std": float(adv.std(unbiased=False)),
        "negative_share": float(negative.to(adv.dtype).mean()),
        "negative_weight_share": float(signal[negative].sum() / signal.sum().clamp(min=1e-12)),
        "weight": float(weights.mean()),
        "weight_std": float(weights.std(unbiased=False)),
        "weight_max": float(weights.max()),
        "weighted_advantage": float((weights * adv).mean()),
        "logprob": float((logprobs.detach() * mask).sum() / tokens),
    }
    return loss, metrics
