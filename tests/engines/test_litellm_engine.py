"""The LiteLLM engine against real servers: `transformers serve` with the tiny model, a closed
port, and a scripted OpenAI-compatible server for 429/503, `n` choices and reasoning."""

import asyncio
import logging
import time

import pytest

from engines import EngineConfig, MissingAPIKeyError, SamplingConfig, make_engine, sum_usage
from engines.keyed_sampling import conversation_seeds

CONVERSATIONS = [
    [{"role": "user", "content": "Write a program that prints the sum of two numbers."}],
    [
        {"role": "system", "content": "You are a safe Python programming assistant."},
        {"role": "user", "content": "Read n and print n squared."},
    ],
]


def served(served_model, **overrides) -> EngineConfig:
    fields = {
        "kind": "litellm",
        "model": served_model["model"],
        "api_base": served_model["api_base"],
        "timeout_s": 60,
        **overrides,
    }
    return EngineConfig(**fields)


@pytest.fixture(scope="module")
def local_engine(tiny_model_dir):
    """The same model in-process, to cross-check what the server reports."""
    return make_engine(EngineConfig(kind="transformers", model=str(tiny_model_dir), device="cpu"))


def test_samples_n_per_conversation_from_transformers_serve(served_model, local_engine):
    engine = make_engine(served(served_model, concurrency=4))
    sampling = SamplingConfig(n=2, max_new_tokens=16, seed=1)
    results = engine.generate(CONVERSATIONS, sampling)
    assert [len(row) for row in results] == [2, 2]
    for conversation, row in zip(CONVERSATIONS, results, strict=True):
        expected_prompt = local_engine.generate([conversation], SamplingConfig(max_new_tokens=1))
        for c in row:
            assert c.ok, c.error
            assert c.finish_reason in ("stop", "length")
            assert c.prompt_tokens == expected_prompt[0][0].prompt_tokens  # same chat template
            assert 1 <= c.completion_tokens <= 16
            assert c.cost_usd == 0.0  # a local model has no price
    # transformers serve ignores `n`: the engine learnt to send one request per sample
    assert engine._n_supported is False
    usage = sum_usage(results)
    assert usage.completions == 4 and usage.errors == 0 and usage.prompt_tokens > 0


def test_seeded_requests_are_reproducible(served_model):
    # one request at a time: the server's sampling RNG is shared by concurrent requests
    engine = make_engine(served(served_model, concurrency=1, use_n=False))
    sampling = SamplingConfig(n=2, max_new_tokens=12, seed=7)
    first = engine.generate(CONVERSATIONS, sampling)
    second = engine.generate(CONVERSATIONS, sampling)
    assert [[c.text for c in r] for r in first] == [[c.text for c in r] for r in second]


def test_thinking_flag_reaches_the_chat_template(served_model):
    engine = make_engine(served(served_model, use_n=False))
    base = SamplingConfig(max_new_tokens=2, seed=0)
    plain = engine.generate(CONVERSATIONS[:1], base)[0][0]
    off = engine.generate(CONVERSATIONS[:1], base.model_copy(update={"thinking": False}))[0][0]
    assert plain.ok and off.ok
    assert off.prompt_tokens > plain.prompt_tokens  # "<think>\n\n</think>\n\n" was appended


def test_generate_inside_a_running_event_loop(served_model):
    engine = make_engine(served(served_model, use_n=False))
    sampling = SamplingConfig(max_new_tokens=2, seed=0)

    async def main():
        from_sync = engine.generate(CONVERSATIONS[:1], sampling)
        from_async = await engine.agenerate(CONVERSATIONS[:1], sampling)
        return from_sync, from_async

    from_sync, from_async = asyncio.run(main())
    assert from_sync[0][0].ok and from_async[0][0].ok


def test_missing_key_fails_before_any_request(monkeypatch, scripted_server):
    monkeypatch.delenv("COBALT_TEST_API_KEY", raising=False)
    config = EngineConfig(
        kind="litellm",
        model="openai/any",
        api_base=scripted_server.api_base,
        api_key_env="COBALT_TEST_API_KEY",
    )
    with pytest.raises(MissingAPIKeyError, match="COBALT_TEST_API_KEY"):
        make_engine(config)
    assert scripted_server.requests == []


def test_key_is_sent_but_never_shown(monkeypatch, served_model):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("COBALT_TEST_API_KEY", secret)
    config = served(served_model, api_key_env="COBALT_TEST_API_KEY", use_n=False)
    engine = make_engine(config)
    assert engine.generate(CONVERSATIONS[:1], SamplingConfig(max_new_tokens=2))[0][0].ok
    wrong = make_engine(config.model_copy(update={"model": "openai/no-such-model"}))
    failed = wrong.generate(CONVERSATIONS[:1], SamplingConfig(max_new_tokens=2))[0][0]
    assert failed.error and secret not in failed.error
    assert secret not in repr(engine) and secret not in repr(config)


def test_wrong_model_is_an_error_outcome_without_retries(served_model):
    # 400 from the server: not transient, so no retry (a retry would wait >= 3.75 s here)
    engine = make_engine(
        served(served_model, model="openai/no-such-model", max_retries=3, retry_backoff_s=5)
    )
    started = time.monotonic()
    results = engine.generate(CONVERSATIONS, SamplingConfig(n=2, max_new_tokens=4))
    assert time.monotonic() - started < 3
    for row in results:
        assert len(row) == 2
        for c in row:
            assert not c.ok and c.finish_reason == "error" and c.text == ""
            assert "BadRequest" in c.error and "no-such-model" in c.error
    assert sum_usage(results).errors == 4
    assert engine._n_supported is None  # a bad model name says nothing about `n`


def test_stopped_server_is_an_error_outcome_after_retries(caplog, closed_port_api_base):
    engine = make_engine(
        EngineConfig(
            kind="litellm",
            model="openai/tiny",
            api_base=closed_port_api_base,
            max_retries=2,
            retry_backoff_s=0.05,
            timeout_s=5,
        )
    )
    with caplog.at_level(logging.INFO, logger="engines.litellm_engine"):
        results = engine.generate(CONVERSATIONS[:1], SamplingConfig(n=1, max_new_tokens=4))
    completion = results[0][0]
    assert not completion.ok and "Connection error" in completion.error
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2


def test_rate_limit_then_unavailable_then_success(scripted_server, caplog):
    engine = make_engine(
        EngineConfig(
            kind="litellm",
            model="openai/flaky",
            api_base=scripted_server.api_base,
            max_retries=3,
            retry_backoff_s=0.05,
        )
    )
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="engines.litellm_engine"):
        completion = engine.generate(CONVERSATIONS[:1], SamplingConfig(max_new_tokens=4))[0][0]
    assert completion.ok, completion.error
    assert len(scripted_server.requests) == 3
    assert time.monotonic() - started >= 1.0  # the 429's Retry-After: 1 was honoured
    kinds = [r.getMessage().split()[0] for r in caplog.records if "retrying" in r.getMessage()]
    assert kinds == ["RateLimitError", "ServiceUnavailableError"]


def test_n_choices_usage_and_reasoning(scripted_server):
    engine = make_engine(
        EngineConfig(kind="litellm", model="openai/reasoner", api_base=scripted_server.api_base)
    )
    sampling = SamplingConfig(n=3, max_new_tokens=64, seed=5, thinking=True)
    results = engine.generate(CONVERSATIONS, sampling)
    assert engine._n_supported is True
    assert len(scripted_server.requests) == 2  # one request per conversation, n=3 each
    request = scripted_server.requests[0]
    assert sorted(r["seed"] for r in scripted_server.requests) == sorted(
        conversation_seeds(5, CONVERSATIONS)
    )
    assert request["n"] == 3 and request["max_tokens"] == 64
    assert request["temperature"] == 0.6 and request["top_p"] == 0.95
    assert request["chat_template_kwargs"] == {"enable_thinking": True}
    row = results[0]
    assert [c.text for c in row] == [f"<think>thought {i}</think>answer {i}" for i in range(3)]
    # the request's usage (10 prompt, 21 completion, 9 reasoning) is shared by its choices
    assert sum(c.prompt_tokens for c in row) == 10
    assert [c.completion_tokens for c in row] == [7, 7, 7]
    assert [c.reasoning_tokens for c in row] == [3, 3, 3]


def test_server_rejecting_n_gets_one_request_per_sample(scripted_server):
    engine = make_engine(
        EngineConfig(kind="litellm", model="openai/no-n", api_base=scripted_server.api_base)
    )
    results = engine.generate(CONVERSATIONS[:1], SamplingConfig(n=3, seed=10, max_new_tokens=8))
    assert [c.ok for c in results[0]] == [True, True, True]
    assert engine._n_supported is False
    seeds = [(r.get("n"), r["seed"]) for r in scripted_server.requests]
    (base,) = conversation_seeds(10, CONVERSATIONS[:1])
    assert seeds[0] == (3, base)
    assert sorted(seeds[1:]) == [(None, base), (None, base + 1), (None, base + 2)]
    engine.generate(CONVERSATIONS[:1], SamplingConfig(n=2, max_new_tokens=8))
    assert all("n" not in r for r in scripted_server.requests[4:])  # learnt once


def test_inline_reasoning_comes_back_verbatim(scripted_server):
    engine = make_engine(
        EngineConfig(kind="litellm", model="openai/raw-think", api_base=scripted_server.api_base)
    )
    completion = engine.generate(CONVERSATIONS[:1], SamplingConfig(max_new_tokens=8))[0][0]
    assert completion.text == scripted_server.RAW_THINK


def test_per_sample_requests_get_distinct_seeds(scripted_server):
    engine = make_engine(
        EngineConfig(
            kind="litellm", model="openai/reasoner", api_base=scripted_server.api_base, use_n=False
        )
    )
    engine.generate(CONVERSATIONS[:1], SamplingConfig(n=3, seed=100, max_new_tokens=8))
    (base,) = conversation_seeds(100, CONVERSATIONS[:1])
    assert sorted(r["seed"] for r in scripted_server.requests) == [base, base + 1, base + 2]
    assert all("n" not in r for r in scripted_server.requests)


def test_each_conversation_is_seeded_on_its_own(scripted_server):
    """By default every conversation of a call gets a seed of its own (a hash of the run's
    seed, the conversation and its occurrence): two identical conversations do not get the same
    completions, no two conversations share their noise, and the runs of seeds 0 and 1 share no
    sample's seed (with the call's seed and vLLM's seed + i they shared 31 of 32: seen on a GPU,
    2026-12-02). Reproducible: the same call sends the same seeds."""
    engine = make_engine(
        EngineConfig(
            kind="litellm", model="openai/reasoner", api_base=scripted_server.api_base, use_n=False
        )
    )
    calls = [CONVERSATIONS[0], CONVERSATIONS[1], CONVERSATIONS[0]]

    def sent(seed: int) -> list[int]:
        scripted_server.requests.clear()
        engine.generate(calls, SamplingConfig(n=4, seed=seed, max_new_tokens=8))
        return sorted(r["seed"] for r in scripted_server.requests)

    zero, one = sent(0), sent(1)
    assert len(set(zero)) == 12 and not set(zero) & set(one)
    assert sent(0) == zero
    scripted_server.requests.clear()
    engine.generate(calls, SamplingConfig(n=1, max_new_tokens=8))  # no seed: none is sent
    assert all("seed" not in r for r in scripted_server.requests)


def test_cost_of_a_priced_model(scripted_server):
    # a known model name behind api_base: LiteLLM prices it from its bundled cost map (offline)
    engine = make_engine(
        EngineConfig(kind="litellm", model="openai/gpt-4o-mini", api_base=scripted_server.api_base)
    )
    completion = engine.generate(CONVERSATIONS[:1], SamplingConfig(max_new_tokens=8))[0][0]
    assert completion.ok and completion.cost_usd > 0


def test_a_seed_per_conversation_replaces_the_calls_seed(scripted_server):
    """The served vLLM engine seeds each conversation on its own: with `n`, one request per
    conversation carries its seed; without, sample i is sent that seed + i."""
    base = {"kind": "litellm", "model": "openai/reasoner", "api_base": scripted_server.api_base}
    sampling = SamplingConfig(n=2, seed=7, max_new_tokens=8)
    conversations = [CONVERSATIONS[0], CONVERSATIONS[1], CONVERSATIONS[0]]
    make_engine(EngineConfig(**base, use_n=True)).generate(
        conversations, sampling, seeds=[100, 200, 300]
    )
    assert sorted((r["n"], r["seed"]) for r in scripted_server.requests) == [
        (2, 100),
        (2, 200),
        (2, 300),
    ]
    scripted_server.requests.clear()
    make_engine(EngineConfig(**base, use_n=False)).generate(
        conversations, sampling, seeds=[100, 200, 300]
    )
    assert sorted(r["seed"] for r in scripted_server.requests) == [100, 101, 200, 201, 300, 301]
    with pytest.raises(ValueError, match="2 seeds for 3 conversations"):
        make_engine(EngineConfig(**base)).generate(conversations, sampling, seeds=[1, 2])


def test_token_ids_from_the_server_give_exact_counts(scripted_server):
    """vLLM's `return_token_ids`: each completion gets the whole prompt, its own tokens and its
    reasoning up to `</think>`, as the in-process engines count them (not a share of the
    request's usage)."""
    from engines.litellm_engine import LiteLLMEngine

    config = EngineConfig(
        kind="litellm",
        model="openai/reasoner",
        api_base=scripted_server.api_base,
        use_n=True,
        extra={"extra_body": {"return_token_ids": True}},
    )
    row = LiteLLMEngine(config, think_close_id=99).generate(
        CONVERSATIONS[:1], SamplingConfig(n=3, max_new_tokens=8, thinking=False)
    )[0]
    request = scripted_server.requests[0]
    assert request["return_token_ids"] is True
    assert request["chat_template_kwargs"] == {"enable_thinking": False}  # merged, not replaced
    assert [c.prompt_tokens for c in row] == [5, 5, 5]
    assert [c.completion_tokens for c in row] == [4, 6, 1]
    assert [c.reasoning_tokens for c in row] == [3, 2, 0]
    assert [c.text for c in row] == [f"<think>thought {i}</think>answer {i}" for i in range(3)]


def test_requests_to_data_parallel_engines_name_the_least_loaded_one(scripted_server):
    """Behind `vllm serve --data-parallel-size 4` (ranks 4), each request names the engine
    with the fewest samples in flight: a request's n samples stay together, the loads even."""
    from engines.litellm_engine import LiteLLMEngine

    base = {"kind": "litellm", "api_base": scripted_server.api_base, "use_n": True}
    engine = LiteLLMEngine(EngineConfig(**base, model="openai/slow"), ranks=4)
    conversations = [[{"role": "user", "content": f"task {i}"}] for i in range(10)]
    results = engine.generate(conversations, SamplingConfig(n=3, seed=1, max_new_tokens=8))
    assert all(c.ok for row in results for c in row)
    ranks = [int(h["x-data-parallel-rank"]) for h in scripted_server.headers]
    assert sorted(ranks) == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]  # 10 requests of 3 samples: 9/9/6/6
    assert engine._in_flight == [0, 0, 0, 0]  # every request's samples released
    # one engine (or a server that is not vLLM's data-parallel one): no header
    scripted_server.headers.clear()
    LiteLLMEngine(EngineConfig(**base, model="openai/any")).generate(
        conversations[:2], SamplingConfig(n=2, max_new_tokens=8)
    )
    assert [h.get("x-data-parallel-rank") for h in scripted_server.headers] == [None, None]
