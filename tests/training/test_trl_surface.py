"""TRL's private surface (cobalt.training.machinery.trl_trainer): every private member of TRL and
transformers the project relies on still has the parameters it was written for. When this fails
after an upgrade, the message names each member that changed; start there."""

from __future__ import annotations

import pytest

from cobalt.training.machinery import trl_trainer


def test_every_private_member_still_holds() -> None:
    changes = trl_trainer.surface_changes()
    assert not changes, "TRL's private surface changed:\n" + "\n".join(changes)


def test_a_changed_signature_a_gone_method_and_an_unset_attribute_are_named() -> None:
    surface = {
        "trl.GRPOTrainer._prepare_inputs": ("self", "batch"),
        "trl.GRPOTrainer._no_such_method": ("self",),
        "trl.GRPOTrainer.attr:_no_such_attribute": (),
        "trl.GRPOTrainer.attr:_metrics": (),
    }
    changes = trl_trainer.surface_changes(surface)
    assert len(changes) == 3
    assert changes[0].startswith("trl.GRPOTrainer._prepare_inputs: written for (self, batch), TRL")
    assert changes[0].endswith("has (self, generation_batch)")
    assert changes[1].startswith("trl.GRPOTrainer._no_such_method: gone in TRL")
    assert changes[2].startswith("trl.GRPOTrainer.attr:_no_such_attribute: no longer set")


def test_another_minor_version_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trl_trainer.version_mismatches() == []
    monkeypatch.setattr(trl_trainer.trl, "__version__", "1.17.2")
    assert trl_trainer.version_mismatches() == ["trl 1.17.2 (written for 1.16.x)"]


def test_no_other_module_touches_a_private_trl_member() -> None:
    """The rollouts, the overlap and the timing go through the trainer's public wrappers."""
    from pathlib import Path

    root = Path(trl_trainer.__file__).resolve().parents[1]
    private = ("._tokenize_prompts", "._generate_single_turn", "ProfilingContext._log_metrics")
    found = [
        f"{path.relative_to(root)}: {name}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "trl_trainer.py"
        for name in private
        if name in path.read_text()
    ]
    assert found == []
