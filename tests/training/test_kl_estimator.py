"""The recipe's KL penalty (k2 = 0.5 (log pi - log pi_ref)^2, verl's "mse") beside TRL's k3, in
the real GRPO trainer's loss (cobalt.training.machinery.trl_trainer): hand-computed values and
gradients."""

from __future__ import annotations

import math

import pytest
import torch

BETA = 0.5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from shared_models import tiny_model as shared_tiny_model

    return shared_tiny_model()


def trainer(tiny, tmp_path, estimator: str, bias_correction: bool = False):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from cobalt.training.machinery.trl_trainer import CobaltGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        beta=BETA,
        loss_type="dapo",
        use_bias_correction_kl=bias_correction,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=4,
        use_cpu=True,
        report_to="none",
    )
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 2)
    return CobaltGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=prompts,
        processing_class=AutoTokenizer.from_pretrained(str(tiny)),
        kl_estimator=estimator,
    )


def inputs(t, shift: float) -> dict:
    """A batch of 2 rows with zero advantages (so the loss is the KL term alone) whose reference
    log-probabilities are the policy's own shifted by `shift`: r = log pi_ref - log pi = shift."""
    prompt = torch.tensor([[5, 6, 7], [5, 6, 8]])
    completion = torch.tensor([[9, 10, 11, 12], [13, 14, 15, 16]])
    mask = torch.ones_like(completion)
    with torch.no_grad():
        logps, _, _ = t._get_per_token_logps_and_entropies(
            t.model,
            torch.cat([prompt, completion], 1),
            torch.ones(2, 7, dtype=torch.long),
            4,
        )
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": mask,
        "advantages": torch.zeros(2),
        "num_items_in_batch": mask.sum(),
        "ref_per_token_logps": logps + shift,
    }


@pytest.mark.parametrize("shift", [0.3, -0.7])
def test_k2_and_k3_values_and_gradients(tiny, tmp_path, shift) -> None:
    """With zero advantages the dapo loss is beta x the token mean of the estimator:
    k3 = exp(r) - r - 1 (TRL's), k2 = r^2 / 2 (the recipe's); their slopes in log pi are
    1 - exp(r) and -r, so each of the 8 tokens' log-probability gets beta x slope / 8. TRL's
    default multiplies k3 by the (differentiable) importance ratio, which makes its slope -r
    on-policy, as k2's (use_bias_correction_kl; k2 takes no such factor)."""
    for estimator, correction, value, slope in (
        ("k3", False, math.exp(shift) - shift - 1, 1 - math.exp(shift)),
        ("k3", True, math.exp(shift) - shift - 1, -shift),
        ("k2", False, 0.5 * shift**2, -shift),
        ("k2", True, 0.5 * shift**2, -shift),
    ):
        t = trainer(tiny, tmp_path / f"{estimator}{correction}", estimator, correction)
        t.model.train()
        t.current_gradient_accumulation_steps = 1  # set by train() for each window
        batch = inputs(t, shift)
        seen = []
        forward = t._get_per_token_logps_and_entropies

        def keep(*args, forward=forward, seen=seen, **kwargs):
            out = forward(*args, **kwargs)
            out[0].retain_grad()
            seen.append(out[0])
            return out

        t._get_per_token_logps_and_entropies = keep
        loss = t._compute_loss(t.model, batch)
        assert loss.item() == pytest.approx(BETA * value, rel=1e-4)
        assert t._metrics["train"]["kl"][-1] == pytest.approx(value, rel=1e-4)
        loss.backward()
        expected = torch.full((2, 4), BETA * slope / 8)
        assert torch.allclose(seen[0].grad, expected, rtol=1e-4, atol=1e-7)
        assert t._policy_logps is None  # k2: captured and released by the loss


def test_k2_needs_a_known_aggregation() -> None:
    from cobalt.training.settings import TrainingConfig

    assert TrainingConfig(preset="paper").kl() == "k2"
    assert TrainingConfig().kl() == "k3"
    assert TrainingConfig(kl_estimator="k2").kl() == "k2"


def test_k2_and_its_reductions_as_pure_functions() -> None:
    """k2 (cobalt.training.method.k2_kl) without a trainer: zero where the policy is the reference,
    a gradient equal to the drift, and each loss type's reduction by hand."""
    from cobalt.training.method.k2_kl import aggregate, k2_per_token

    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.5, -1.0], [-0.2, -3.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    per_token = k2_per_token(logps, ref)
    assert k2_per_token(ref, ref).abs().sum() == 0
    (per_token * mask).sum().backward()
    assert torch.allclose(logps.grad, (logps - ref).detach() * mask)
    k2 = per_token.detach()
    masked = (k2 * mask).sum()
    items = torch.tensor(10.0)  # the step's completion tokens over 2 processes and 2 micro-batches
    dapo = aggregate(k2, mask, "dapo", accumulation=2, num_items_in_batch=items, processes=2,
                     steps_per_generation=4)  # fmt: skip
    assert dapo == pytest.approx(float(masked / (10 / 2 * 2 / 4)))
    rows = (k2 * mask).sum(-1) / mask.sum(-1)
    assert aggregate(k2, mask, "grpo", accumulation=2) == pytest.approx(float(rows.mean() / 2))
    assert aggregate(k2, mask, "bnpo") == pytest.approx(float(masked / 5))
    dr = aggregate(k2, mask, "dr_grpo", max_completion_length=4)
    assert dr == pytest.approx(float(masked / 8))
    with pytest.raises(ValueError, match="loss type 'gspo'"):
        aggregate(k2, mask, "gspo")
