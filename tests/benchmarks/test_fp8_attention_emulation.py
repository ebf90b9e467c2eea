"""The fp8 attention emulation computes SDPA's attention but for the e4m3 rounding it adds."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from benchmarks import fp8_attention_emulation as emu


def test_e4m3_rounds_to_three_mantissa_bits_and_clamps_at_448():
    x = torch.tensor([0.3, 1.0, -2.7, 1000.0, -1000.0])
    assert emu.to_e4m3(x).tolist() == [0.3125, 1.0, -2.75, 448.0, -448.0]


@pytest.mark.parametrize("q_len, mask", [(9, "none"), (1, "none"), (9, "bool"), (9, "float")])
def test_without_rounding_it_is_sdpa(monkeypatch, q_len, mask):
    torch.manual_seed(0)
    q = torch.randn(2, 4, q_len, 32)
    k, v = torch.randn(2, 2, 9, 32), torch.randn(2, 2, 9, 32)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    attention_mask = None
    if mask != "none":
        keep = torch.ones(2, 1, q_len, 9, dtype=torch.bool).tril(9 - q_len)
        keep[0, :, -2:, 0] = False  # a key hidden from the last queries of one row
        attention_mask = (
            keep
            if mask == "bool"
            else torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
        )
    expected, _ = sdpa_attention_forward(module, q, k, v, attention_mask)
    rounded, _ = emu.fp8_attention(module, q, k, v, attention_mask)
    monkeypatch.setattr(emu, "to_e4m3", lambda x: x)
    exact, _ = emu.fp8_attention(module, q, k, v, attention_mask)
    assert torch.allclose(exact, expected, atol=1e-5)
    assert 1e-3 < (rounded - expected).abs().mean() < 0.1  # fp8's rounding, and only that


def test_install_routes_a_models_attention_through_it(monkeypatch):
    from transformers import AttentionInterface, Qwen2ForCausalLM

    from engines.tiny import tiny_config

    monkeypatch.setattr(
        AttentionInterface, "_global_mapping", dict(AttentionInterface._global_mapping)
    )  # undone after the test
    torch.manual_seed(0)
    config = tiny_config(
        64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
    )
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        before = model(ids).logits
        emu.install()
        after = model(ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert not torch.equal(before, after)
    assert torch.allclose(before, after, atol=0.5)
