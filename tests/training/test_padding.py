"""Less padding in GRPO's forward passes (cobalt/training/padding.py): the trimmed, length-sorted
forward gives the log-probabilities of the padded one on a real (tiny) model, and regrouping the
micro-batches by length keeps every row once, with micro-batches of similar length."""

from __future__ import annotations

import pytest
import torch

from cobalt.training.padding import by_length, trimmed_logps


def padded_batch(vocab: int, rows: int = 7, prompt: int = 9, completion: int = 12):
    """Left-padded prompts and right-padded completions of varied lengths (TRL's layout)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (rows, prompt + completion), generator=generator)
    mask = torch.zeros_like(ids)
    for r in range(rows):
        p = 3 + (r * 5) % (prompt - 2)  # prompt tokens
        c = 1 + (r * 7) % completion  # completion tokens
        mask[r, prompt - p : prompt + c] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask, completion


def test_trimmed_forward_gives_the_padded_forwards_log_probabilities(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from engines.tiny import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(str(build_tiny_model(tmp_path / "m", seed=0)))
    model.eval()
    ids, mask, keep = padded_batch(model.config.vocab_size)
    calls: list[int] = []

    def compute(ids, mask, keep, batch_size=None, compute_entropy=False):
        calls.append(ids.size(1))
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # what a padding-aware model sees
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        logps = torch.log_softmax(logits[:, -keep - 1 : -1].float(), -1)
        token = logps.gather(-1, ids[:, -keep:, None]).squeeze(-1)
        entropy = -(logps.exp() * logps).sum(-1) if compute_entropy else None
        return token, entropy, None

    full, full_entropy, _ = compute(ids, mask, keep, compute_entropy=True)
    calls.clear()
    trimmed, entropy = trimmed_logps(compute, ids, mask, keep, batch_size=3, compute_entropy=True)
    real = mask[:, -keep:].bool()
    assert torch.allclose(trimmed[real], full[real], atol=1e-5)
    assert torch.allclose(entropy[real], full_entropy[real], atol=1e-5)
    assert len(calls) == 3 and max(calls) <= ids.size(1) and min(calls) < ids.size(1)


def test_micro_batches_regrouped_by_length_keep_every_row_once() -> None:
    _, mask, keep = padded_batch(100, rows=8)
    rows = torch.arange(8)
    batches = [
        {"completion_mask": mask[i : i + 2, -keep:], "row": rows[i : i + 2],
         "names": [f"r{j}" for j in range(i, i + 2)], "num_items_in_batch": torch.tensor(42)}
        for i in range(0, 8, 2)
    ]  # fmt: skip
    regrouped = by_length(batches)
    assert [len(b["row"]) for b in regrouped] == [2, 2, 2, 2]
    seen = torch.cat([b["row"] for b in regrouped])
    assert sorted(seen.tolist()) == list(range(8))
    assert [n for b in regrouped for n in b["names"]] == [f"r{i}" for i in seen.tolist()]
    lengths = [b["completion_mask"].sum(1).tolist() for b in regrouped]
    flat = [x for pair in lengths for x in pair]
    assert flat == sorted(flat, reverse=True)
    assert all(b["num_items_in_batch"].item() == 42 for b in regrouped)


@pytest.mark.timeout(300)
def test_a_grpo_step_with_trimmed_padding_trains_as_the_padded_one(tmp_path) -> None:
    """Two tiny GRPO runs from the same seed, padding trimmed or not: the same losses."""
    from test_grpo_tiny import SANDBOX, rows

    from cobalt.training.config import TrainingConfig
    from cobalt.training.grpo import train
    from engines.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    losses = {}
    for trim in (False, True):
        config = TrainingConfig(
            preset="tiny", mode="cobalt", sandbox=SANDBOX, max_steps=2, trim_padding=trim,
            report_to=[], overrides={"per_device_train_batch_size": 2,
                                     "gradient_accumulation_steps": 2},
        )  # fmt: skip
        history = train(config, rows(), model, tmp_path / f"out-{trim}").history
        losses[trim] = [h["loss"] for h in history if "loss" in h]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4, abs=1e-6)
