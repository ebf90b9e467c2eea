"""A model directory behind a local OpenAI-compatible server that the engine starts, waits for and
stops: every conversation of a `generate` call goes out at once through the litellm engine, and
the server spreads the requests over its engines. `EngineConfig(kind="vllm")` with
`data_parallel_size` N > 1 is this engine over `vllm serve --data-parallel-size N`
(`engines.vllm_engine.vllm_launch`); the same path runs on CPU over `transformers serve` (the
tests).

Its completions carry what the in-process engines' carry: each conversation is seeded with its
own seed (`conversation_seeds`; sample i of a request gets seed + i, as vLLM does in the
process), token counts come from the server's token ids where it returns them (vLLM's
`return_token_ids`: exact per completion, reasoning counted up to `</think>`), and a `<think>`
opened by the chat template is put back in front (`reopen_thinking`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from .base import Completion, Conversation, Engine, reopen_thinking, validate_conversations
from .config import EngineConfig, SamplingConfig
from .serving import ServerError, ServerKind, local_server

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 86_400.0  # requests queue in our own server: only a hang should end one


@dataclass(frozen=True)
class Launch:
    """How the engine starts its server and talks to it."""

    kind: ServerKind
    args: tuple[str, ...] = ()  # appended to the server's command line
    device: str = "cpu"  # transformers serve
    env: dict[str, str] = field(default_factory=dict)
    request_extra: dict[str, Any] = field(default_factory=dict)  # litellm.acompletion kwargs
    concurrency: int = 16  # requests in flight
    start_timeout_s: float = 300
    use_n: bool | None = None  # EngineConfig.use_n of the client
    replicas: int = 1  # engines behind the server (vLLM's data-parallel size)
    route: bool = False  # name each request's engine (vLLM's X-data-parallel-rank header)


class ServedEngine(Engine):
    def __init__(self, config: EngineConfig, launch: Launch):
        super().__init__(config)
        self.kind = config.kind
        self.launch = launch
        self.replicas = launch.replicas
        self._stack = ExitStack()
        self.log_dir = tempfile.mkdtemp(prefix=f"cobalt-{launch.kind}-serve-")
        self._stack.callback(shutil.rmtree, self.log_dir, ignore_errors=True)
        started = time.perf_counter()
        self.server = self._stack.enter_context(
            local_server(
                config.model,
                self.log_dir,
                kind=launch.kind,
                device=launch.device,
                extra_args=launch.args,
                env=launch.env,
            )
        )
        try:
            self.server.wait_until_up(launch.start_timeout_s)
            from transformers import AutoTokenizer

            from .litellm_engine import LiteLLMEngine

            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
            client = EngineConfig(
                kind="litellm",
                model=self.server.litellm_model,
                api_base=self.server.api_base,
                concurrency=launch.concurrency,
                use_n=launch.use_n,
                timeout_s=REQUEST_TIMEOUT_S,
                max_retries=config.max_retries,
                extra=launch.request_extra,
            )
            think_close = self.tokenizer.get_added_vocab().get("</think>")
            ranks = launch.replicas if launch.route else 1
            self.client = LiteLLMEngine(client, think_close_id=think_close, ranks=ranks)
        except BaseException:
            self._stack.close()
            raise
        self.start_s = time.perf_counter() - started
        log.info(
            "%s serve of %s up in %.0fs (log %s)",
            launch.kind,
            config.model,
            self.start_s,
            self.server.log,
        )

    def generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        validate_conversations(conversations)
        if not conversations:
            return []
        results = self.client.generate(conversations, sampling)  # seeded per conversation
        if self.server.proc.poll() is not None:  # not a request's failure: the engine is gone
            raise ServerError(
                f"{self.launch.kind} serve exited with {self.server.proc.returncode} during "
                f"generation:\n{self.server.tail()}"
            )
        return reopen_thinking(results, self.tokenizer, sampling)

    def close(self) -> None:
        """Stop the server (and its engine processes): its GPUs are free afterwards. Its log
        goes with it (errors carry its end)."""
        self._stack.close()
