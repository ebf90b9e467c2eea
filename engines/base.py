"""The engine interface: conversations in, `n` completions per conversation out, in order."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .config import EngineConfig, SamplingConfig

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
Conversation = list[Message]

FinishReason = Literal["stop", "length", "error"] | str

ROLES = ("system", "user", "assistant")


class Completion(BaseModel):
    """One sampled assistant turn. A failed request is a recorded outcome: `error` is set, `text`
    is empty and `finish_reason` is "error"; it never raises out of `Engine.generate`."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field("", description="The generated text (reasoning included, if any).")
    finish_reason: FinishReason | None = Field(
        None, description="stop (end of turn), length (max_new_tokens), error, or the server's."
    )
    prompt_tokens: int = Field(0, ge=0, description="Prompt tokens of the request.")
    completion_tokens: int = Field(0, ge=0, description="Generated tokens (reasoning included).")
    reasoning_tokens: int = Field(0, ge=0, description="Reasoning tokens, when the API says.")
    cost_usd: float = Field(0.0, ge=0, description="Price of this completion (0 if unknown).")
    error: str | None = Field(None, description="Why the request failed, after retries.")
    seconds: float = Field(0.0, ge=0, description="Wall seconds spent on it (share of a batch).")

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failed(cls, error: str, seconds: float = 0.0) -> Completion:
        return cls(finish_reason="error", error=error, seconds=seconds)


class Usage(BaseModel):
    """Totals over a run (or any set of completions)."""

    model_config = ConfigDict(extra="forbid")

    completions: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0

    def add(self, completion: Completion) -> Usage:
        self.completions += 1
        self.errors += completion.error is not None
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        self.reasoning_tokens += completion.reasoning_tokens
        self.cost_usd += completion.cost_usd
        self.seconds += completion.seconds
        return self

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})


def sum_usage(completions: Iterable[Completion] | Iterable[Iterable[Completion]]) -> Usage:
    """Totals of completions, flat or nested as `generate` returns them."""
    usage = Usage()
    for item in completions:
        if isinstance(item, Completion):
            usage.add(item)
        else:
            for completion in item:
                usage.add(completion)
    return usage


def validate_conversations(conversations: Sequence[Conversation]) -> None:
    """Reject malformed input early (a programming error, unlike a failed request)."""
    if isinstance(conversations, dict) or (conversations and isinstance(conversations[0], dict)):
        raise TypeError("generate() takes a list of conversations (each a list of messages)")
    for i, conversation in enumerate(conversations):
        if not conversation:
            raise ValueError(f"conversation {i} is empty")
        for message in conversation:
            if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
                raise ValueError(
                    f"conversation {i}: each message needs role in {ROLES} and a str content, "
                    f"got {sorted(message)}"
                )


class Engine(abc.ABC):
    """Generates `sampling.n` completions for each conversation.

    `generate` returns one list per conversation, in input order, each with exactly `n`
    completions. Failures of single requests come back as `Completion.error`; only invalid input
    or an engine that cannot start (missing model, missing API key, missing package) raises.
    """

    kind: str = "base"
    # model copies that generate side by side (vLLM on N GPUs: N); the trajectory stage gives
    # each call this many times its chunk of problems, so each copy gets a whole chunk's work
    replicas: int = 1

    def __init__(self, config: EngineConfig):
        self.config = config

    @abc.abstractmethod
    def generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]: ...

    async def agenerate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Async form; local engines run `generate` in a worker thread."""
        return await asyncio.to_thread(self.generate, conversations, sampling)

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the model or connections. The engine is unusable afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def reopen_thinking(
    results: list[list[Completion]], tokenizer: object, sampling: SamplingConfig
) -> list[list[Completion]]:
    """Local engines: when the chat template opened `<think>` in the prompt (R1-Distill), put it
    back in front of every completion's text, so that a response cut before `</think>` reads as
    reasoning without an answer (`engines.thinking`)."""
    from .thinking import template_opens_thinking, with_open_thinking

    if not template_opens_thinking(tokenizer, **sampling.chat_template_kwargs()):
        return results
    return [
        [
            c.model_copy(update={"text": with_open_thinking(c.text, True)}) if c.ok else c
            for c in row
        ]
        for row in results
    ]
