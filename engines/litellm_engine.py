"""LiteLLM engine: hosted API models and any OpenAI-compatible server (`vllm serve`,
`transformers serve`, SGLang, ...), with bounded concurrency, retries and per-request usage/cost.

Retries are done here rather than with LiteLLM's `num_retries`, which retries every error (bad
requests and authentication failures included) without backing off; the decision uses LiteLLM's
exception classes and its status-code rule (`litellm._should_retry`: 408, 409, 429, 5xx).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .base import Completion, Conversation, Engine, validate_conversations
from .config import MAX_CONCURRENCY, EngineConfig, SamplingConfig
from .keyed_sampling import conversation_seeds

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0


def _import_litellm():
    # Without this LiteLLM downloads its model price list at import time.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # LiteLLM's HTTP connection pool (1000 by default) would queue requests beyond it, their
    # timeout running; the engine's own semaphore (`concurrency`) bounds what is in flight
    os.environ.setdefault("AIOHTTP_CONNECTOR_LIMIT", str(MAX_CONCURRENCY))
    import litellm

    litellm.suppress_debug_info = True
    if "LITELLM_LOG" not in os.environ:  # one INFO line per request otherwise, under Prefect too
        logger = logging.getLogger("LiteLLM")
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    return litellm


class LiteLLMEngine(Engine):
    """`think_close_id`: the `</think>` token id of a local model whose server returns token ids
    (vLLM's `return_token_ids`): reasoning tokens are then counted up to it, as the in-process
    engines count them (the served engine sets it).

    `ranks`: the data-parallel engines behind a `vllm serve --data-parallel-size` (the served
    engine sets it). vLLM fans a request's `n` samples out as separate requests and balances
    them one by one, so one conversation's samples land on every engine and each computes its
    prompt; here each request names the engine (vLLM's `X-data-parallel-rank` header) with the
    fewest samples in flight, so a conversation's samples share one prompt computation (the
    prefix cache) and the engines' loads stay even."""

    kind = "litellm"

    def __init__(self, config: EngineConfig, *, think_close_id: int | None = None, ranks: int = 1):
        super().__init__(config)
        self._think_close_id = think_close_id
        self._in_flight = [0] * ranks  # samples in flight per data-parallel engine
        self._api_key = config.api_key()  # fails now, naming the variable, if it is missing
        self._litellm = _import_litellm()
        lm = self._litellm
        self._transient = (
            lm.RateLimitError,
            lm.Timeout,
            lm.APIConnectionError,
            lm.InternalServerError,
            lm.ServiceUnavailableError,
            lm.BadGatewayError,
        )
        # use_n=None: learnt on the first request that asks for n > 1
        self._n_supported: bool | None = config.use_n

    def __repr__(self) -> str:
        return f"LiteLLMEngine(model={self.config.model!r}, api_base={self.config.api_base!r})"

    # --- sync / async entry points ---------------------------------------------------------

    def generate(
        self,
        conversations: Sequence[Conversation],
        sampling: SamplingConfig,
        *,
        seeds: Sequence[int | None] | None = None,
    ) -> list[list[Completion]]:
        """`seeds`: one base seed per conversation (sample i of conversation j is sent
        seeds[j] + i; with `n`, seeds[j]); by default `conversation_seeds(sampling.seed, ...)`,
        a hash of the seed, the conversation and its occurrence in the call, so that no two
        conversations (nor two runs' seeds) share their samples' seeds."""
        validate_conversations(conversations)
        coro = self.agenerate(conversations, sampling, seeds=seeds)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        # called from inside an event loop (a notebook, an async task): run on a fresh loop
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    async def agenerate(
        self,
        conversations: Sequence[Conversation],
        sampling: SamplingConfig,
        *,
        seeds: Sequence[int | None] | None = None,
    ) -> list[list[Completion]]:
        validate_conversations(conversations)
        if seeds is None:
            seeds = conversation_seeds(sampling.seed, conversations)
        if len(seeds) != len(conversations):
            raise ValueError(f"{len(seeds)} seeds for {len(conversations)} conversations")
        semaphore = asyncio.Semaphore(self.config.concurrency)
        per_conversation = [sampling.model_copy(update={"seed": seed}) for seed in seeds]
        tasks = [
            self._sample(list(c), s, semaphore)
            for c, s in zip(conversations, per_conversation, strict=True)
        ]
        return list(await asyncio.gather(*tasks))

    # --- one conversation ------------------------------------------------------------------

    async def _sample(
        self, messages: Conversation, sampling: SamplingConfig, semaphore: asyncio.Semaphore
    ) -> list[Completion]:
        n = sampling.n
        done: list[Completion] = []
        if n > 1 and self._n_supported is not False:
            try:
                done = await self._request(messages, sampling, n, sampling.seed, semaphore)
            except Exception as exc:
                if self._n_supported is not None or not isinstance(
                    exc, self._litellm.BadRequestError
                ):
                    return [self._failed(exc) for _ in range(n)]
                # a 400: was it `n`? One plain request tells (a bad model name fails it too)
                first = await self._single(messages, sampling, 0, semaphore)
                if not first.ok:
                    return [first] + [first.model_copy() for _ in range(n - 1)]
                log.info("server rejected n=%d (%s); sending one request per sample", n, exc)
                self._n_supported = False
                done = [first]
            if len(done) < n and self._n_supported is None:
                log.info("server returned %d of n=%d choices; one request per sample", len(done), n)
                self._n_supported = False
            elif len(done) >= n and self._n_supported is None:
                self._n_supported = True
            done = done[:n]
        singles = await asyncio.gather(
            *[self._single(messages, sampling, i, semaphore) for i in range(len(done), n)]
        )
        return done + list(singles)

    async def _single(
        self,
        messages: Conversation,
        sampling: SamplingConfig,
        index: int,
        semaphore: asyncio.Semaphore,
    ) -> Completion:
        seed = None if sampling.seed is None else sampling.seed + index
        try:
            completions = await self._request(messages, sampling, 1, seed, semaphore)
        except Exception as exc:
            return self._failed(exc)
        if not completions:
            return Completion.failed("the server returned no choices")
        return completions[0]

    def _failed(self, exc: BaseException) -> Completion:
        """The request's error as a failed completion, naming the model (LiteLLM 1.110 leaves the
        server's reason out of a 400's text) and never the API key."""
        message = f"{type(exc).__name__}: {exc}"
        if self.config.model not in message:
            message += f" (model {self.config.model})"
        if self._api_key:
            message = message.replace(self._api_key, "***")
        return Completion.failed(message[:2000])

    # --- one request -----------------------------------------------------------------------

    def _request_kwargs(self, sampling: SamplingConfig, n: int, seed: int | None) -> dict:
        config = self.config
        kwargs: dict[str, Any] = {
            "model": config.model,
            "temperature": sampling.temperature,
            "max_tokens": sampling.max_new_tokens,
            "timeout": config.timeout_s,
            "num_retries": 0,  # retries happen in _request, with backoff
            "max_retries": 0,  # the OpenAI client's own retries, likewise
            "drop_params": True,  # e.g. temperature/top_p on models that take none
        }
        if not sampling.greedy:
            kwargs["top_p"] = sampling.top_p
        if n > 1:
            kwargs["n"] = n
        if seed is not None:
            kwargs["seed"] = seed
        if config.api_base is not None:
            kwargs["api_base"] = config.api_base
        if self._api_key is not None:
            kwargs["api_key"] = self._api_key
        elif config.api_base is not None:
            kwargs["api_key"] = "none"  # local servers take any key; the client needs one
        kwargs.update(config.extra)
        template_kwargs = sampling.chat_template_kwargs()
        if template_kwargs and config.api_base is not None:  # vLLM / transformers serve / SGLang
            extra_body = dict(kwargs.get("extra_body") or {})
            extra_body.setdefault("chat_template_kwargs", template_kwargs)
            kwargs["extra_body"] = extra_body
        return kwargs

    def _retry_delay(self, attempt: int, exc: BaseException) -> float:
        retry_after = -1.0
        # LiteLLM keeps the server's headers on the exception (its `response` is rebuilt)
        for headers in (
            getattr(exc, "litellm_response_headers", None),
            getattr(getattr(exc, "response", None), "headers", None),
        ):
            try:
                retry_after = float(headers.get("retry-after"))
                break
            except (AttributeError, TypeError, ValueError):
                continue
        if 0 < retry_after <= MAX_BACKOFF_S:
            return retry_after
        base = min(self.config.retry_backoff_s * 2**attempt, MAX_BACKOFF_S)
        return base * (0.75 + 0.5 * random.random())

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, self._transient):
            return True
        status = getattr(exc, "status_code", None)
        if isinstance(status, int):
            return bool(self._litellm._should_retry(status))
        return isinstance(exc, asyncio.TimeoutError | ConnectionError)

    async def _request(
        self,
        messages: Conversation,
        sampling: SamplingConfig,
        n: int,
        seed: int | None,
        semaphore: asyncio.Semaphore,
    ) -> list[Completion]:
        """One chat completion request (with retries): one Completion per returned choice."""
        kwargs = self._request_kwargs(sampling, n, seed)
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                async with semaphore:
                    with self._routed(kwargs, n) as routed:
                        started = time.perf_counter()
                        response = await self._litellm.acompletion(messages=messages, **routed)
                break
            except Exception as exc:
                if attempt >= self.config.max_retries or not self._is_transient(exc):
                    raise
                delay = self._retry_delay(attempt, exc)
                log.info(
                    "%s on %s (attempt %d/%d); retrying in %.1fs",
                    type(exc).__name__,
                    self.config.model,
                    attempt + 1,
                    self.config.max_retries + 1,
                    delay,
                )
                attempt += 1
                await asyncio.sleep(delay)
        return self._completions(response, time.perf_counter() - started)

    @contextlib.contextmanager
    def _routed(self, kwargs: dict, samples: int) -> Iterator[dict]:
        """The request's kwargs, sent to the data-parallel engine with the fewest samples in
        flight (`ranks`), which holds them until the request ends."""
        if len(self._in_flight) == 1:
            yield kwargs
            return
        rank = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
        headers = {**(kwargs.get("extra_headers") or {}), "X-data-parallel-rank": str(rank)}
        self._in_flight[rank] += samples
        try:
            yield {**kwargs, "extra_headers": headers}
        finally:
            self._in_flight[rank] -= samples

    def _completions(self, response: Any, seconds: float) -> list[Completion]:
        choices = list(response.choices or [])
        if not choices:
            return []
        k = len(choices)
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        details = getattr(usage, "completion_tokens_details", None)
        reasoning = int(getattr(details, "reasoning_tokens", 0) or 0)
        cost = self._cost(response)
        prompt_ids = getattr(response, "prompt_token_ids", None)
        out = []
        for i, choice in enumerate(choices):
            ids = (getattr(choice, "provider_specific_fields", None) or {}).get("token_ids")
            if prompt_ids is not None and ids is not None:  # exact, per completion (vLLM)
                out.append(self._counted(choice, len(prompt_ids), ids, cost / k, seconds / k))
                continue
            out.append(
                Completion(
                    text=_text(choice.message),
                    finish_reason=choice.finish_reason,
                    # one request's usage is shared by its choices so that sums match billing
                    prompt_tokens=_share(prompt, k, i),
                    completion_tokens=_share(completion, k, i),
                    reasoning_tokens=_share(reasoning, k, i),
                    cost_usd=cost / k,
                    seconds=seconds / k,
                )
            )
        return out

    def _counted(
        self, choice: Any, prompt_tokens: int, ids: list[int], cost: float, seconds: float
    ) -> Completion:
        """A choice of a server that returned its token ids: counts as the in-process engines
        give them (the whole prompt, this completion's tokens, reasoning up to `</think>`)."""
        close = self._think_close_id
        return Completion(
            text=_text(choice.message),
            finish_reason=choice.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
            reasoning_tokens=ids.index(close) + 1 if close is not None and close in ids else 0,
            cost_usd=cost,
            seconds=seconds,
        )

    def _cost(self, response: Any) -> float:
        try:
            return float(self._litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # models without a price (local servers) cost nothing
            return 0.0


def _text(message: Any) -> str:
    text = message.content or ""
    thought = getattr(message, "reasoning_content", None)
    if thought is not None:
        # LiteLLM moves a leading <think>…</think> out of `content` (and servers with a
        # reasoning parser send it apart): put it back, as local engines return it
        text = f"<think>{thought}</think>{text}"
    return text


def _share(total: int, parts: int, index: int) -> int:
    """Split `total` into `parts` integers that sum to it; the first ones take the remainder."""
    return total // parts + (1 if index < total % parts else 0)
