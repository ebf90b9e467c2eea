import asyncio

import pytest

from engines import Completion, EngineConfig, SamplingConfig, make_engine, sum_usage

CONVERSATIONS = [
    [{"role": "user", "content": "Write a program that prints the sum of two numbers."}],
    [
        {"role": "system", "content": "You are a safe Python programming assistant."},
        {"role": "user", "content": "Read n and print n squared."},
        {"role": "assistant", "content": "```python\nprint(int(input()) ** 2)\n```"},
        {"role": "user", "content": "The public tests failed. Fix it."},
    ],
    [{"role": "user", "content": "x"}],
]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with make_engine(
        EngineConfig(kind="transformers", model=str(tiny_model_dir), device="cpu", batch_size=2)
    ) as engine:
        yield engine


def prompt_len(engine, conversation, sampling):
    return len(
        engine.tokenizer(engine.render(conversation, sampling), add_special_tokens=False)[
            "input_ids"
        ]
    )


def texts(results):
    return [[c.text for c in row] for row in results]


def check_shape_and_usage(engine, results, sampling):
    assert len(results) == len(CONVERSATIONS)
    for conversation, row in zip(CONVERSATIONS, results, strict=True):
        assert len(row) == sampling.n
        for c in row:
            assert isinstance(c, Completion) and c.ok, c.error
            assert c.prompt_tokens == prompt_len(engine, conversation, sampling)
            assert 1 <= c.completion_tokens <= sampling.max_new_tokens
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert c.completion_tokens == sampling.max_new_tokens
            assert c.cost_usd == 0.0 and c.seconds > 0


def test_n_completions_per_conversation_with_usage(engine):
    sampling = SamplingConfig(n=3, max_new_tokens=24, seed=11)
    results = engine.generate(CONVERSATIONS, sampling)
    check_shape_and_usage(engine, results, sampling)
    usage = sum_usage(results)
    assert usage.completions == 9 and usage.errors == 0
    assert usage.prompt_tokens == sum(c.prompt_tokens for row in results for c in row)
    assert usage.completion_tokens == sum(c.completion_tokens for row in results for c in row)
    assert len({c.text for row in results for c in row}) > 5  # samples differ


def test_seed_makes_it_deterministic(engine):
    sampling = SamplingConfig(n=2, max_new_tokens=16, seed=3)
    first, second = (
        engine.generate(CONVERSATIONS, sampling),
        engine.generate(CONVERSATIONS, sampling),
    )
    assert texts(first) == texts(second)
    other = engine.generate(CONVERSATIONS, sampling.model_copy(update={"seed": 4}))
    assert texts(other) != texts(first)


def test_greedy_repeats_the_one_answer(engine):
    results = engine.generate(
        CONVERSATIONS[:1], SamplingConfig(n=3, temperature=0, max_new_tokens=8)
    )
    assert len(results[0]) == 3 and len({c.text for c in results[0]}) == 1


def test_thinking_off_extends_the_prompt(engine):
    on = SamplingConfig(max_new_tokens=4, seed=0)
    off = on.model_copy(update={"thinking": False})
    results = engine.generate(CONVERSATIONS[:1], off)
    assert engine.render(CONVERSATIONS[0], off).endswith("<think>\n\n</think>\n\n")
    assert results[0][0].prompt_tokens > prompt_len(engine, CONVERSATIONS[0], on)


def test_async_and_empty(engine):
    sampling = SamplingConfig(n=1, max_new_tokens=4, seed=0)
    assert asyncio.run(engine.agenerate(CONVERSATIONS[:1], sampling))[0][0].ok
    assert engine.generate([], sampling) == []


def test_invalid_input_raises(engine):
    sampling = SamplingConfig(max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], sampling)
    with pytest.raises(ValueError, match="role"):
        engine.generate([[{"role": "tool", "content": "x"}]], sampling)
    with pytest.raises(TypeError):
        engine.generate(CONVERSATIONS[0], sampling)


def test_continuous_batching(tiny_model_dir):
    config = EngineConfig(
        kind="transformers", model=str(tiny_model_dir), device="cpu", continuous_batching=True
    )
    with make_engine(config) as engine:
        sampling = SamplingConfig(n=2, max_new_tokens=16, seed=5)
        first = engine.generate(CONVERSATIONS, sampling)
        assert engine._cb_available, "fell back to padded batches"
        check_shape_and_usage(engine, first, sampling)
        assert texts(engine.generate(CONVERSATIONS, sampling)) == texts(first)
