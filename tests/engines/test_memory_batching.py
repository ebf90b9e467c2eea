"""Memory-aware batching: the estimates of `engines.memory`, the batch plan, and the transformers
engine on CPU with a forced small budget (several generate calls, input order, seeds) and with a
generate that runs out of memory above some batch size (halving retry)."""

import random
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from transformers import Qwen2Config, Qwen3Config

from engines import EngineConfig, InsufficientMemoryError, SamplingConfig
from engines.memory import (
    Footprint,
    activation_bytes_per_token,
    dtype_bytes,
    is_out_of_memory,
    kv_bytes_per_token,
    plan_batches,
)
from engines.transformers_engine import TransformersEngine

QWEN3_8B = dict(
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=12288,
    vocab_size=151936,
)

CONVERSATIONS = [
    [{"role": "user", "content": "x"}],
    [{"role": "user", "content": "Write a program that prints the sum of two numbers. " * 4}],
    [{"role": "user", "content": "Read n and print n squared."}],
    [{"role": "user", "content": "Sort a list of integers read from standard input. " * 2}],
    [{"role": "user", "content": "Print hello."}],
]


def test_kv_and_activation_bytes_of_a_qwen3_8b_shape():
    config = Qwen3Config(**QWEN3_8B)
    assert dtype_bytes(torch.bfloat16) == dtype_bytes("bfloat16") == 2
    assert kv_bytes_per_token(config, 2) == 2 * 36 * 8 * 128 * 2 == 147456
    # MLP 4 x 12288, q/k/v twice (32 + 2 x 8 heads x 128), 6 hidden copies; bf16
    assert activation_bytes_per_token(config, 2) == (4 * 12288 + 2 * 48 * 128 + 6 * 4096) * 2
    footprint = Footprint.of(config, torch.bfloat16)
    assert footprint.logits_per_row >= 151936 * 4
    # one conversation of 1000 prompt tokens x 16 rows x 6144 new tokens: ~17 GB of KV cache
    assert footprint.batch_bytes(1000, 16, 6144) > 16 * 7144 * 147456


def test_head_dim_and_kv_heads_defaults():
    qwen2 = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2)  # fmt: skip
    assert kv_bytes_per_token(qwen2, 4) == 2 * 2 * 2 * (64 // 4) * 4
    bare = SimpleNamespace(hidden_size=256, num_hidden_layers=3, num_attention_heads=8)
    assert kv_bytes_per_token(bare, 2) == 2 * 3 * 8 * 32 * 2  # no KV heads, no head_dim
    nested = SimpleNamespace(text_config=Qwen3Config(**QWEN3_8B))
    assert kv_bytes_per_token(nested, 2) == 147456


def test_plan_fits_the_budget_covers_all_and_sorts_by_length():
    rng = random.Random(0)
    lengths = [rng.randint(5, 400) for _ in range(60)]
    footprint = Footprint(kv_per_token=100, activation_per_token=50, logits_per_row=1000)
    n, new, cap = 4, 64, 6
    budget = footprint.batch_bytes(400, 3 * n, new)  # about 3 of the longest at once
    plan = plan_batches(lengths, n, new, footprint, budget, cap)
    flat = [i for group in plan for i in group]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for group in plan:
        assert 1 <= len(group) <= cap
        width = max(lengths[i] for i in group)
        assert footprint.batch_bytes(width, len(group) * n, new) <= budget
    assert len(plan) < len(lengths) / 3  # packed, not one per batch
    assert any(len(g) == cap for g in plan) and any(len(g) < cap for g in plan)
    # no budget: today's consecutive groups of `cap`, in input order
    assert plan_batches([9, 1, 5], n, new, footprint, None, 2) == [[0, 1], [2]]


def test_one_conversation_that_cannot_fit_names_the_fix():
    footprint = Footprint(kv_per_token=100, activation_per_token=50, logits_per_row=1000)
    lengths = [10, 500, 20]
    budget = footprint.batch_bytes(100, 4, 64)
    with pytest.raises(InsufficientMemoryError) as info:
        plan_batches(lengths, 4, 64, footprint, budget, 8)
    message = str(info.value)
    for part in ("conversation 1", "500 prompt tokens", "max_new_tokens=64", str(budget)):
        assert part in message
    assert "SamplingConfig.n" in message and "memory_fraction" in message and "vllm" in message
    assert plan_batches(lengths[::2], 4, 64, footprint, budget, 8)  # the others fit


def test_out_of_memory_detection():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(ValueError("index out of range"))


def test_config_validates_the_memory_fields():
    for bad in ({"memory_fraction": 0}, {"memory_fraction": 1.5}, {"memory_budget_gb": 0}):
        with pytest.raises(ValidationError):
            EngineConfig(model="m", **bad)
    assert EngineConfig(model="m").memory_fraction == 0.85


@pytest.fixture(scope="module")
def base_engine(tiny_model_dir):
    config = EngineConfig(kind="transformers", model=str(tiny_model_dir), device="cpu")
    with TransformersEngine(config) as engine:
        yield engine


def engine_with(base, **updates) -> TransformersEngine:
    """An engine over the same loaded tiny model with other settings."""
    config = base.config.model_copy(update=updates)
    return TransformersEngine(config, model=base.model, tokenizer=base.tokenizer)


def record_generate(monkeypatch, engine, n: int, fail=None) -> list[int]:
    """Wrap the real model's generate; returns the conversations of each call (its input rows
    are the conversations' `n` samples side by side). `fail(conversations)` may return an
    exception to raise instead of generating."""
    calls: list[int] = []
    real = engine.model.generate

    def generate(*args, **kwargs):
        rows = kwargs["input_ids"].shape[0] // n
        calls.append(rows)
        if fail is not None and (exc := fail(rows)) is not None:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.model, "generate", generate)
    return calls


def prompt_lengths(engine, sampling):
    return [len(p) for p in engine._encode(CONVERSATIONS, sampling)]


def check_rows(engine, results, sampling):
    assert len(results) == len(CONVERSATIONS)
    for length, row in zip(prompt_lengths(engine, sampling), results, strict=True):
        assert len(row) == sampling.n
        for c in row:
            assert c.ok, c.error
            assert c.prompt_tokens == length  # results are back in input order


def test_small_budget_splits_a_call_and_keeps_order_and_seeds(base_engine, monkeypatch):
    sampling = SamplingConfig(n=3, max_new_tokens=12, seed=7)
    lengths = prompt_lengths(base_engine, sampling)
    assert len(set(lengths)) == len(lengths)  # distinct lengths make the order observable
    footprint = base_engine.footprint
    budget = footprint.batch_bytes(max(lengths), 2 * sampling.n, sampling.max_new_tokens)
    engine = engine_with(base_engine, batch_size=8, memory_budget_gb=budget / 1e9)
    calls = record_generate(monkeypatch, engine, sampling.n)
    first = engine.generate(CONVERSATIONS, sampling)
    check_rows(engine, first, sampling)
    assert len(calls) == len(engine.last_plan) >= 2 and sum(calls) == len(CONVERSATIONS)
    for group in engine.last_plan:
        width = max(lengths[i] for i in group)
        assert footprint.batch_bytes(width, len(group) * 3, 12) <= engine.memory_budget()
    again = engine.generate(CONVERSATIONS, sampling)
    assert [[c.text for c in r] for r in again] == [[c.text for c in r] for r in first]
    # no budget on CPU: one batch of batch_size, as before
    calls.clear()
    engine_with(base_engine, batch_size=8).generate(CONVERSATIONS, sampling)
    assert calls == [len(CONVERSATIONS)]


def test_budget_below_one_conversation_raises_before_generating(base_engine, monkeypatch):
    sampling = SamplingConfig(n=4, max_new_tokens=64, seed=0)
    for continuous in (False, True):
        engine = engine_with(base_engine, memory_budget_gb=1e-6, continuous_batching=continuous)
        calls = record_generate(monkeypatch, engine, sampling.n)
        with pytest.raises(InsufficientMemoryError, match="memory_fraction"):
            engine.generate(CONVERSATIONS, sampling)
        assert calls == []


def test_out_of_memory_halves_the_batch(base_engine, monkeypatch):
    sampling = SamplingConfig(n=2, max_new_tokens=10, seed=1)
    engine = engine_with(base_engine, batch_size=8)

    def oom_above_two(rows):
        return torch.cuda.OutOfMemoryError("CUDA out of memory.") if rows > 2 else None

    calls = record_generate(monkeypatch, engine, sampling.n, oom_above_two)
    results = engine.generate(CONVERSATIONS, sampling)
    check_rows(engine, results, sampling)
    assert calls == [5, 2, 3, 1, 2]  # halves, not one by one


def test_other_errors_still_isolate_each_conversation(base_engine, monkeypatch):
    sampling = SamplingConfig(n=2, max_new_tokens=10, seed=1)
    engine = engine_with(base_engine, batch_size=8)

    def fail(rows):
        if rows > 1:
            return ValueError("bad batch")
        return torch.cuda.OutOfMemoryError("CUDA out of memory.") if fail.alone == 0 else None

    fail.alone = 1
    calls = record_generate(monkeypatch, engine, sampling.n, fail)
    results = engine.generate(CONVERSATIONS, sampling)
    check_rows(engine, results, sampling)
    assert calls == [5, 1, 1, 1, 1, 1]
    fail.alone = 0  # one conversation alone runs out of memory: recorded, with the fixes
    (row,) = engine.generate(CONVERSATIONS[:1], sampling)
    assert len(row) == 2 and all(c.error and "SamplingConfig.n" in c.error for c in row)


def test_default_batch_is_small_on_cpu_and_the_memory_plan_on_gpu(base_engine, monkeypatch):
    """CPU: 8 conversations a call (a step costs in proportion to its rows). GPU: no count
    below the memory plan's (single-sample feedback turns in batches of 8 left an H100 idle);
    a batch_size given wins on both."""
    from engines.transformers_engine import CPU_BATCH, GPU_BATCH

    engine = engine_with(base_engine)
    assert engine.config.batch_size is None
    calls = record_generate(monkeypatch, engine, 1)
    engine.generate(CONVERSATIONS * 2, SamplingConfig(n=1, max_new_tokens=4, seed=0))
    assert calls == [CPU_BATCH, 2 * len(CONVERSATIONS) - CPU_BATCH]
    engine.device = torch.device("cuda")  # the rule alone: this machine has no GPU
    assert engine.batch_cap() == GPU_BATCH > CPU_BATCH
    pinned = engine_with(base_engine, batch_size=3)
    assert pinned.batch_cap() == 3
    pinned.device = torch.device("cuda")
    assert pinned.batch_cap() == 3
