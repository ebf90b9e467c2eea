"""vLLM offline engine (GPU): `LLM(...).chat(conversations, SamplingParams(n=...))`.

vLLM is the `gpu` extra (not installable on the CPU machines this project is developed and tested
on), so this module is imported lazily; it ran on an H200 with vLLM 0.26.0 (docs/ENGINES.md,
docs/BENCHMARKS.md). vLLM schedules every conversation of a call at once (continuous batching,
paged KV cache sized by `gpu_memory_utilization`): one `generate` call per step of the trajectory
stage is all it needs. To reach a `vllm serve` endpoint instead, use the litellm engine with
`api_base`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from .base import Completion, Conversation, Engine, reopen_thinking, validate_conversations
from .config import EngineConfig, SamplingConfig
from .keyed_sampling import row_keys

log = logging.getLogger(__name__)


# how this engine seeds its requests: part of a vLLM stage's cache key (a call used to share one
# seed; trajectories seeded that way are not read back as this scheme's)
SEEDING = "per-conversation seeds from row_keys"


def conversation_seeds(seed: int | None, conversations: Sequence[Conversation]) -> list[int | None]:
    """One vLLM seed per conversation, from the run's seed, the conversation and its occurrence
    among identical conversations of the call (`row_keys`, the transformers engine's keys): with
    one seed for the whole call, two identical conversations (two samples that wrote the same
    program and got the same feedback) would get identical completions, and every conversation
    would share the others' noise. vLLM gives sample i of a request the seed + i."""
    if seed is None:
        return [None] * len(conversations)
    encoded = [tuple(json.dumps(list(c), sort_keys=True).encode()) for c in conversations]
    return [keys[0] for keys in row_keys(seed, encoded, 1)]


class VLLMEngine(Engine):
    kind = "vllm"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "EngineConfig(kind='vllm') needs vLLM, which is not installed: install the GPU "
                "extra (pip install -e '.[gpu]') on a CUDA machine, or serve the model with "
                "`vllm serve` elsewhere and use kind='litellm' with api_base"
            ) from exc
        self._vllm = vllm
        kwargs: dict[str, Any] = {
            "model": config.model,
            "tensor_parallel_size": config.tensor_parallel_size,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "dtype": "auto" if config.dtype == "auto" else config.dtype,
        }
        if config.max_model_len is not None:
            kwargs["max_model_len"] = config.max_model_len
        kwargs.update(config.extra)
        self.llm = vllm.LLM(**kwargs)
        self._think_close_id = self.llm.get_tokenizer().get_added_vocab().get("</think>")

    def generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        validate_conversations(conversations)
        if not conversations:
            return []
        params = [
            self._vllm.SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                seed=seed,
            )
            for seed in conversation_seeds(sampling.seed, conversations)
        ]
        started = time.perf_counter()
        try:
            outputs = self.llm.chat(
                [list(c) for c in conversations],
                sampling_params=params,
                use_tqdm=False,
                chat_template_kwargs=sampling.chat_template_kwargs() or None,
            )
        except Exception as exc:  # one failed batch is recorded, not raised
            error = f"{type(exc).__name__}: {exc}"
            log.warning("vLLM generation failed: %s", error)
            return [[Completion.failed(error) for _ in range(sampling.n)] for _ in conversations]
        seconds = (time.perf_counter() - started) / (len(conversations) * sampling.n)
        results = []
        for output in outputs:
            prompt_tokens = len(output.prompt_token_ids or [])
            row = []
            for sample in output.outputs:
                ids = list(sample.token_ids)
                reasoning = 0
                if self._think_close_id is not None and self._think_close_id in ids:
                    reasoning = ids.index(self._think_close_id) + 1
                row.append(
                    Completion(
                        text=sample.text,
                        finish_reason=sample.finish_reason or "stop",
                        prompt_tokens=prompt_tokens,
                        completion_tokens=len(ids),
                        reasoning_tokens=reasoning,
                        seconds=seconds,
                    )
                )
            results.append(row)
        return reopen_thinking(results, self.llm.get_tokenizer(), sampling)

    def close(self) -> None:
        """Stop vLLM's engine process and free its GPU memory (another engine may follow)."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        import gc

        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
