"""Packed forward passes (cobalt/training/machinery/packing.py): a micro-batch's sequences end to
end in one row give the padded forward's log-probabilities, entropies and gradients on a real
(tiny) model, through TRL's fused head; rows it cannot pack are refused; a GRPO run with packing
trains as the padded one and really takes the packed path."""

from __future__ import annotations

import pytest
import torch
from test_padding import padded_batch

from cobalt.training.machinery import packing
from cobalt.training.machinery.packing import (
    pack,
    pack_shared,
    packable,
    packed_logps,
    use_packed_attention,
)


def tiny(tmp_path, **config):
    """The tiny model (or a variant of its config) with TRL's fused head, as the trainer has it."""
    from shared_models import tiny_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    path = tiny_model()
    if config:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(str(path), **config), attn_implementation="sdpa"
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path))
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model


def padded(model, ids, mask, keep):
    """TRL 1.16's own forward: the padded rows, completion tokens labelled."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def test_pack_lays_each_rows_real_tokens_end_to_end() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [0, 8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    packed = pack(ids, mask, logits_to_keep=3)  # prompts (5,) and (8, 9)
    assert packed["ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert packed["positions"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert packed["cu_q"].tolist() == [0, 3, 8] and packed["cu_q"].dtype == torch.int32
    assert packed["starts"].tolist() == [0, 4]  # each prompt's last token


@pytest.mark.parametrize(
    "variant", ["mha", "gqa", "checkpointed"]
)  # checkpointed: each layer recomputed in the backward pass, outside the forward
def test_packed_forward_gives_the_padded_forwards_log_probs_entropies_and_gradients(
    tmp_path, variant
) -> None:
    model = tiny(tmp_path, **({"num_key_value_heads": 1} if variant == "gqa" else {}))
    if variant == "gqa":
        assert model.config.num_attention_heads > model.config.num_key_value_heads == 1
    if variant == "checkpointed":
        model.gradient_checkpointing_enable({"use_reentrant": False})
        model.train()
    ids, mask, keep = padded_batch(model.config.vocab_size)
    assert packable(mask, keep)
    assert_packed_is_padded(model, ids, mask, keep)


def assert_packed_is_padded(model, ids, mask, keep, share_prompts: bool = False) -> None:
    """The packed forward's log-probabilities, entropies and gradients are the padded one's."""
    real = mask[:, -keep:].bool()
    logps, entropy = padded(model, ids, mask, keep)
    logps[real].sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    use_packed_attention(model)
    got, got_entropy = packed_logps(
        model, ids, mask, keep, compute_entropy=True, share_prompts=share_prompts
    )
    got[real].sum().backward()
    assert torch.allclose(got[real], logps[real], atol=2e-6)
    assert torch.allclose(got_entropy[real], entropy[real], atol=2e-6)
    assert got[~real].abs().max() == 0  # no real token: 0, as padding is for every loss
    for name, parameter in model.named_parameters():
        difference = (parameter.grad - expected[name]).norm() / expected[name].norm()
        assert difference < 1e-4, name


def sharing(ids: torch.Tensor, mask: torch.Tensor, keep: int) -> None:
    """Rows 1-2 take row 0's prompt and row 4 row 3's (in place): TRL's layout of a prompt's
    samples."""
    prompt = ids.size(1) - keep
    for source, row in ((0, 1), (0, 2), (3, 4)):
        ids[row, :prompt], mask[row, :prompt] = ids[source, :prompt], mask[source, :prompt]


def test_pack_shared_lays_each_prompt_once_and_each_completion_after_its_last_token() -> None:
    ids = torch.tensor([[0, 5, 6, 7, 8, 0], [0, 5, 6, 9, 0, 0], [4, 5, 6, 1, 2, 3]])
    mask = (ids != 0).long()
    packed = pack_shared(ids, mask, logits_to_keep=3)
    # prompt (5, 6): 5 once, then 6 + each completion; prompt (4, 5, 6): 4 5, then 6 + 1 2 3
    assert packed["ids"].tolist() == [[5, 6, 7, 8, 6, 9, 4, 5, 6, 1, 2, 3]]
    assert packed["positions"].tolist() == [[0, 1, 2, 3, 1, 2, 0, 1, 2, 3, 4, 5]]
    assert packed["cu_q"].tolist() == [0, 1, 4, 6, 8, 12]
    assert packed["key_index"].tolist() == [0, 0, 1, 2, 3, 0, 4, 5, 6, 7, 6, 7, 8, 9, 10, 11]
    assert packed["cu_k"].tolist() == [0, 1, 5, 8, 10, 16]
    assert packed["starts"].tolist() == [1, 4, 8]


@pytest.mark.parametrize("heads", [{}, {"num_key_value_heads": 1}], ids=["mha", "gqa"])
def test_shared_prompts_give_the_padded_forwards_log_probs_and_gradients(tmp_path, heads) -> None:
    """Rows of one prompt computed with the prompt once (gradient checkpointing on: the shared
    keys are gathered again when each layer is recomputed)."""
    model = tiny(tmp_path, **heads)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.train()
    ids, mask, keep = padded_batch(model.config.vocab_size)
    sharing(ids, mask, keep)
    assert_packed_is_padded(model, ids, mask, keep, share_prompts=True)


def test_packed_calls_attend_packed_and_every_other_call_is_sdpa_as_before(
    tmp_path, monkeypatch
) -> None:
    model = tiny(tmp_path)
    ids, mask, keep = padded_batch(model.config.vocab_size)
    with torch.no_grad():
        before, _ = padded(model, ids, mask, keep)
    use_packed_attention(model)
    assert model.config._attn_implementation == packing.ATTENTION
    seen: list[int] = []
    real_attention = packing._attend_packed

    def counted(query, *args, **kwargs):
        seen.append(query.size(2))
        return real_attention(query, *args, **kwargs)

    monkeypatch.setattr(packing, "_attend_packed", counted)
    with torch.no_grad():
        after, _ = padded(model, ids, mask, keep)  # a padded forward: SDPA and its mask
        assert seen == [] and torch.equal(after, before)
        packed_logps(model, ids, mask, keep)
    assert seen == [int(mask.sum())] * model.config.num_hidden_layers  # one row, no padding


def test_a_model_on_eager_attention_is_refused_naming_the_setting(tmp_path) -> None:
    model = tiny(tmp_path)
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match=r"training\.attn_implementation"):
        use_packed_attention(model)


def test_rows_with_a_hole_or_a_right_padded_prompt_are_not_packable() -> None:
    _, mask, keep = padded_batch(100)
    holed = mask.clone()
    holed[0, -keep + 0] = 0  # a masked token inside row 0's completion (its first)
    holed[0, -keep + 1] = 1
    right_padded_prompt = mask.clone()
    right_padded_prompt[1, : mask.size(1) - keep] = 0
    right_padded_prompt[1, :3] = 1
    assert packable(mask, keep)
    assert not packable(holed, keep)
    assert not packable(right_padded_prompt, keep)


def test_shared_prompts_without_packing_and_packing_offline_are_refused_by_name() -> None:
    from cobalt.training.settings import TrainingConfig

    with pytest.raises(ValueError, match=r"set training\.packing true too"):
        TrainingConfig(share_prompts=True)
    with pytest.raises(ValueError, match=r"training\.packing: packed passes are GRPO's"):
        TrainingConfig(mode="offline", packing=True)
    assert TrainingConfig(packing=True, share_prompts=True).share_prompts


def test_a_sliding_window_model_is_refused_naming_the_setting() -> None:
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"training\.packing"):
        packing.packed_attention(
            torch.nn.Module(), q, q, q, None, sliding_window=2, cu_seq_lens_q=torch.tensor([0, 4])
        )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_grpo_run_with_packing_trains_as_the_padded_one(
    tmp_path, monkeypatch, lora, tiny_model
) -> None:
    """The trainer's wiring: two tiny GRPO runs from the same seed, padded and packed, full and
    LoRA (the PEFT-wrapped model; the reference is the adapter switched off): the packed run's
    forwards, the loss's included, take the packed path, and both runs log the same steps.
    The tiny random model writes no code and predicts near-uniform tokens (advantages 0,
    entropy ~ln V), so these runs cannot tell a subtly wrong forward apart: the unit tests above
    compare log-probabilities and gradients, and the parity harness's `+pack` layouts
    (tests/benchmarks/test_parity.py) compare runs that learn."""
    from test_grpo_tiny import SANDBOX, rows

    from cobalt.training.grpo import train
    from cobalt.training.settings import LoraSettings, TrainingConfig

    calls: list[int] = []
    real_logps = packing.packed_logps

    def counted(*args, **kwargs):
        calls.append(bool(kwargs.get("compute_entropy")))  # True: the loss's own forward
        return real_logps(*args, **kwargs)

    monkeypatch.setattr("cobalt.training.machinery.trl_trainer.packed_logps", counted)
    model = tiny_model
    losses = {}
    for packed in (False, True):
        config = TrainingConfig(
            preset="tiny", mode="cobalt", sandbox=SANDBOX, max_steps=2, packing=packed,
            lora=LoraSettings(r=4, alpha=8) if lora else None, report_to=[], overrides={"per_device_train_batch_size": 2,
                                     "gradient_accumulation_steps": 2, "beta": 0.04},
        )  # fmt: skip
        history = train(config, rows(), model, tmp_path / f"out-{packed}").history
        losses[packed] = [(h["loss"], h["entropy"]) for h in history if "loss" in h]
        assert bool(calls) == packed and (not packed or any(calls))
    assert len(losses[True]) == 2 and all(entropy > 1 for _, entropy in losses[True])
    for (loss, entropy), (padded_loss, padded_entropy) in zip(*losses.values(), strict=True):
        assert loss == pytest.approx(padded_loss, abs=1e-6)
        assert entropy == pytest.approx(padded_entropy, rel=1e-5)


def test_the_packing_cost_script_compares_every_path_on_cpu(tmp_path) -> None:
    """scripts/gpu/packing_cost.py at a toy shape: every path runs on the same batch, packing
    computes only the real tokens, and each path's log-probabilities and gradients are the
    padded path's to bf16 rounding (the GPU run's yardstick)."""
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "packing_cost.py"
    spec = importlib.util.spec_from_file_location("packing_cost", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "cost.json"
    argv = ["--hidden", "64", "--layers", "2", "--heads", "4", "--vocab", "512", "--rows", "8",
            "--micro-batch", "4", "--response-cap", "48", "--prompt-min", "8", "--prompt-max",
            "24", "--response-mean", "16", "--repeats", "1", "--samples", "2",
            "--json", str(out)]  # fmt: skip
    assert module.main(argv) == 0
    report = json.loads(out.read_text())
    rows = {r["path"]: r for r in report["results"]}
    assert list(rows) == ["padded", "trimmed", "packed", "packed-sdpa", "shared"]
    computed = [rows[p]["computed_tokens"] for p in ("padded", "trimmed", "packed", "shared")]
    assert computed[0] > computed[1] > computed[2] > computed[3]
    assert computed[2] == report["real_tokens"]
    for path in ("trimmed", "packed", "packed-sdpa", "shared"):
        assert rows[path]["logp_max_abs_diff"] < 0.02
        assert max(rows[path]["grad_rel_diff"].values()) < 0.05


def fake_varlen(signature: str):
    """PyTorch's varlen_attn as each release shipped its signature (2.9: is_causal; 2.11:
    window_size, no enable_gqa), computed by SDPA one sequence at a time, recording its calls."""
    calls: list[dict] = []

    def attend(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
        assert k.size(1) == q.size(1)  # the key/value heads were repeated: no enable_gqa
        assert causal and cu_q.dtype == cu_k.dtype == torch.int32
        out = torch.empty_like(q)
        bounds = zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist(),
                     strict=True)  # fmt: skip
        for start, end, k_start, k_end in bounds:
            # FlashAttention's causal mask is aligned at the end: a query segment shorter than
            # its keys sees the keys before it whole
            seen = torch.arange(k_end - k_start)[None, :] <= torch.arange(end - start)[:, None] + (
                (k_end - k_start) - (end - start)
            )
            part = torch.nn.functional.scaled_dot_product_attention(
                q[start:end].transpose(0, 1)[None], k[k_start:k_end].transpose(0, 1)[None],
                v[k_start:k_end].transpose(0, 1)[None], attn_mask=seen, scale=scale,
            )  # fmt: skip
            out[start:end] = part[0].transpose(0, 1)
        calls.append({"dtype": q.dtype, "max_q": max_q, "max_k": max_k})
        return out

    if signature == "2.9":

        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
                        return_aux=None):  # fmt: skip
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None)
    else:

        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                        scale=None, window_size=(-1, -1)):  # fmt: skip
            causal = tuple(window_size) == (-1, 0)
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, scale)

    return varlen_attn, calls


@pytest.mark.parametrize(("signature", "shared"), [("2.9", False), ("2.11", False), ("2.11", True)])
def test_the_varlen_kernel_gets_half_precision_causal_packed_sequences(
    tmp_path, monkeypatch, signature, shared
) -> None:
    """The GPU kernel's path, on CPU with a stand-in for PyTorch's varlen_attn: a Qwen3-shaped
    model (its q_norm leaves the query in float32 under bf16 autocast) over float32 weights
    sends the kernel bf16 queries, causal, its key/value heads repeated, and gets what the
    one-sequence-at-a-time path computes."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    from trl.trainer.utils import add_fused_lm_head

    config = Qwen3Config(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, intermediate_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="sdpa"
    )
    add_fused_lm_head(model)
    use_packed_attention(model)
    ids, mask, keep = padded_batch(512)
    if shared:  # segments whose keys start before their queries: the kernel's alignment
        sharing(ids, mask, keep)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        monkeypatch.setattr(packing, "KERNEL", "sdpa")
        loop, _ = packed_logps(model, ids, mask, keep, share_prompts=shared)
        varlen, calls = fake_varlen(signature)
        monkeypatch.setattr(packing, "KERNEL", "varlen")
        monkeypatch.setattr(packing, "VARLEN_DEVICES", ("cpu",))
        monkeypatch.setattr(packing, "_varlen", lambda: varlen)
        got, _ = packed_logps(model, ids, mask, keep, share_prompts=shared)
    assert len(calls) == config.num_hidden_layers
    assert {c["dtype"] for c in calls} == {torch.bfloat16}
    if not shared:
        assert calls[0]["max_q"] == calls[0]["max_k"] == int(mask.sum(1).max())
    else:
        assert calls[0]["max_q"] < calls[0]["max_k"] == int(mask.sum(1).max())
    real = mask[:, -keep:].bool()
    assert torch.allclose(got[real], loop[real], atol=1e-2)
    assert packing.compute_dtype(torch.zeros(1, dtype=torch.float32)) is None  # no autocast


@pytest.mark.timeout(300)
def test_sharing_prompts_in_micro_batches_of_one_row_says_it_shares_nothing(
    tmp_path, caplog, tiny_model
) -> None:
    """--share-prompts where each micro-batch holds one row (the paper's lengths on an 80 GB
    card): the run trains, and its log says the passes are packed only and what would help."""
    from test_grpo_tiny import SANDBOX, rows

    from cobalt.training.grpo import train
    from cobalt.training.settings import TrainingConfig

    model = tiny_model
    said = "training.share_prompts: micro-batches of 1 row share no prompt"
    for micro in (1, 2):
        caplog.clear()
        config = TrainingConfig(
            preset="tiny", mode="cobalt", sandbox=SANDBOX, max_steps=1, packing=True,
            share_prompts=True, report_to=[],
            overrides={"per_device_train_batch_size": micro, "gradient_accumulation_steps": 4 // micro},
        )  # fmt: skip
        with caplog.at_level("WARNING", logger="cobalt"):
            history = train(config, rows(), model, tmp_path / f"out-{micro}").history
        assert any("loss" in h for h in history)
        assert (said in caplog.text) == (micro == 1), caplog.text[-2000:]
