"""GRPO's micro-batches and less padding in their forward passes
(cobalt/training/machinery/padding.py): the trimmed, length-sorted forward gives the
log-probabilities of the padded one on a real (tiny) model; each optimizer step of a generation
batch holds the same completions on one process as on
several, every row once, regrouped by length only inside its own step."""

from __future__ import annotations

import pytest
import torch

from cobalt.training.machinery.padding import optimizer_windows, trimmed_logps


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


def test_trimmed_forward_gives_the_padded_forwards_log_probabilities(tmp_path, tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
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


def generation_batch(rows: int = 16, first: int = 0) -> dict:
    """TRL's buffer for global rows first .. first + rows: row r's completion is 1 + (7 r mod 12)
    tokens long."""
    _, mask, keep = padded_batch(100, rows=first + rows)
    return {
        "completion_mask": mask[first:, -keep:],
        "row": torch.arange(first, first + rows),
        "names": [f"r{j}" for j in range(first, first + rows)],
        "num_items_in_batch": torch.tensor(42),
    }


def steps_of(micro_batches: list[dict], accumulation: int) -> list[list[int]]:
    """The global rows of each optimizer step (`accumulation` micro-batches each)."""
    return [
        sorted(r for b in micro_batches[k : k + accumulation] for r in b["row"].tolist())
        for k in range(0, len(micro_batches), accumulation)
    ]


@pytest.mark.parametrize("by_length", [False, True])
def test_each_optimizer_step_trains_on_the_same_rows_on_one_process_and_on_two(by_length) -> None:
    """The paper preset's shape: two optimizer steps per generation batch. One process holding
    all 16 rows and two processes holding 8 each put the same rows in each step."""
    one = optimizer_windows(
        generation_batch(16), micro_batches=4, windows=2, offset=0, by_length=by_length
    )
    halves = [
        optimizer_windows(
            generation_batch(8, first), micro_batches=2, windows=2, offset=first,
            by_length=by_length,
        )
        for first in (0, 8)
    ]  # fmt: skip
    one_steps = steps_of(one, 2)
    two_steps = [sorted(a + b) for a, b in zip(*(steps_of(h, 1) for h in halves), strict=True)]
    assert one_steps == two_steps == [list(range(0, 16, 2)), list(range(1, 16, 2))]


def test_length_regrouping_stays_inside_each_optimizer_step() -> None:
    """Sorting the whole buffer (the old `by_length`) gave step 1 every long completion and step 2
    every short one; now each step keeps its rows, longest first inside it, every row once."""
    batch = generation_batch(16)
    micro = optimizer_windows(batch, micro_batches=4, windows=2, offset=0, by_length=True)
    assert [len(b["row"]) for b in micro] == [4, 4, 4, 4]
    seen = torch.cat([b["row"] for b in micro]).tolist()
    assert sorted(seen) == list(range(16))
    assert [n for b in micro for n in b["names"]] == [f"r{i}" for i in seen]
    assert all(b["num_items_in_batch"].item() == 42 for b in micro)
    lengths = batch["completion_mask"].sum(1)
    for k, step in enumerate(steps_of(micro, 2)):
        assert all(r % 2 == k for r in step)
        inside = [n for b in micro[2 * k : 2 * k + 2] for n in b["completion_mask"].sum(1).tolist()]
        assert inside == sorted(inside, reverse=True)
    tokens = [int(lengths[step].sum()) for step in steps_of(micro, 2)]
    ranked = sorted(lengths.tolist(), reverse=True)
    whole_buffer_sort = [sum(ranked[:8]), sum(ranked[8:])]
    assert tokens == [40, 60] and whole_buffer_sort == [75, 25]


def test_a_batch_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError, match="do not split"):
        optimizer_windows(generation_batch(6), micro_batches=4, windows=2, offset=0, by_length=True)
    with pytest.raises(ValueError, match="offset"):
        optimizer_windows(
            generation_batch(8), micro_batches=2, windows=2, offset=3, by_length=False
        )


@pytest.mark.timeout(300)
def test_a_grpo_step_with_trimmed_padding_trains_as_the_padded_one(tmp_path, tiny_model) -> None:
    """Two tiny GRPO runs from the same seed, padding trimmed or not: the same losses."""
    from test_grpo_tiny import SANDBOX, rows

    from cobalt.training.grpo import train
    from cobalt.training.settings import TrainingConfig

    model = tiny_model
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


def test_rows_of_one_prompt_share_micro_batches_inside_their_own_step() -> None:
    """`by_prompt` (shared prompts): TRL's buffer holds each prompt's samples in a row (4 here);
    within each optimizer step the rows of one prompt sit together, longest first among them,
    and each step keeps its own rows."""
    batch = generation_batch(16)
    prompts = torch.arange(16) // 4  # rows 4p .. 4p + 3 share prompt p
    batch["prompt_ids"] = torch.stack([torch.tensor([0, 7, int(p) + 10]) for p in prompts])
    batch["prompt_mask"] = torch.tensor([[0, 1, 1]] * 16)
    plain = optimizer_windows(batch, micro_batches=4, windows=2, offset=0, by_length=True)
    micro = optimizer_windows(
        batch, micro_batches=4, windows=2, offset=0, by_length=True, by_prompt=True
    )
    assert steps_of(micro, 2) == steps_of(plain, 2)
    rows = [r for b in micro for r in b["row"].tolist()]
    assert [int(prompts[r]) for r in rows] == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    lengths = batch["completion_mask"].sum(1)
    for first in range(0, 16, 2):  # longest first within a prompt's rows
        assert lengths[rows[first]] >= lengths[rows[first + 1]]
