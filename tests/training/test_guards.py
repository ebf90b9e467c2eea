"""The non-finite guard: a step with an inf/NaN gradient is not taken (AdamW leaves the weights
exactly as they were), every process decides it together (two processes over gloo, the NaN in one
of them), training stops without a checkpoint of that step, and the error names the step and the
parameters; finite steps pass untouched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cobalt.training.reporting.guards import NonFiniteError, NonFiniteGuard


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
    assert all(p.grad is None for p in model.parameters())  # the optimizer skips them all
    control.should_save = True  # the save schedule asked for this step
    guard.on_step_end(None, SimpleNamespace(global_step=7), control)
    assert not control.should_save
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


def test_a_void_step_leaves_adamw_weights_exactly_as_they_were() -> None:
    """Zeroed gradients (the old guard) still move every weight by Adam's momentum and weight
    decay; dropped gradients move none."""
    model = model_with_grads(None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    optimizer.step()  # a finite step first: momentum to carry
    before = [p.detach().clone() for p in model.parameters()]
    for p, q in zip(model.parameters(), model_with_grads(float("nan")).parameters(), strict=True):
        p.grad = q.grad
    control = SimpleNamespace(should_training_stop=False)
    NonFiniteGuard().on_pre_optimizer_step(
        None, SimpleNamespace(global_step=1), control, model=model
    )
    optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def _two_processes(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = model_with_grads(float("nan") if rank == 1 else None)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        guard, control = NonFiniteGuard(), SimpleNamespace(should_training_stop=False)
        before = [p.detach().clone() for p in model.parameters()]
        guard.on_pre_optimizer_step(None, SimpleNamespace(global_step=3), control, model=model)
        optimizer.step()
        moved = any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
        try:
            guard.check()
            message = ""
        except NonFiniteError as exc:
            message = str(exc)
        results[rank] = (control.should_training_stop, moved, message)
        dist.barrier()  # both leave together, as the trainers' processes do
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_every_process_voids_the_step_when_one_of_them_sees_a_nan() -> None:
    """Under FSDP a NaN lives in one process's shard: the old, local guard voided the step there
    only, and the other processes stepped (and then waited for it in the next collective)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_two_processes, args=(port, results), nprocs=2, join=True)
    assert results[0][:2] == results[1][:2] == (True, False)  # both stop, neither moves
    assert "step 4 (in another process's gradients)" in results[0][2]
    assert "step 4 (1 parameters, first 1.weight)" in results[1][2]
