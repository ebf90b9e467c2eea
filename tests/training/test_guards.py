"""The non-finite guard: a step with an inf/NaN gradient is not taken, training stops, and the
error names the step and the parameters; finite steps pass untouched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cobalt.training.guards import NonFiniteError, NonFiniteGuard


def model_with_grads(bad: float | None) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    if bad is not None:
        model[1].weight.grad[0, 1] = bad
    return model


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_gradient_stops_training_before_the_step(bad) -> None:
    guard, control = NonFiniteGuard(), SimpleNamespace(should_training_stop=False)
    model = model_with_grads(bad)
    guard.on_log(None, SimpleNamespace(global_step=6), control, logs={"loss": 0.5, "reward": 0.1})
    guard.on_pre_optimizer_step(None, SimpleNamespace(global_step=6), control, model=model)
    assert control.should_training_stop
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())  # the step is void
    with pytest.raises(
        NonFiniteError, match=r"step 7 \(1 parameters, first 1\.weight\).*'reward': 0\.1"
    ):
        guard.check()


def test_finite_steps_pass_and_a_nan_loss_is_caught_from_the_logs() -> None:
    guard, control = NonFiniteGuard(), SimpleNamespace(should_training_stop=False)
    model = model_with_grads(None)
    guard.on_pre_optimizer_step(None, SimpleNamespace(global_step=0), control, model=model)
    guard.on_log(None, SimpleNamespace(global_step=1), control, logs={"loss": 0.3})
    assert not control.should_training_stop and all(
        float(p.grad.sum()) == p.numel() for p in model.parameters()
    )
    guard.check()  # nothing to report
    guard.on_log(None, SimpleNamespace(global_step=2), control, logs={"grad_norm": float("nan")})
    assert control.should_training_stop
    with pytest.raises(NonFiniteError, match=r"step 2 .*logged loss or gradient norm"):
        guard.check()
