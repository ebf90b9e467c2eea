"""vLLM on this machine's GPUs: on one engine's worth of GPUs, vLLM offline in this process
(`LLM(...).chat(conversations, SamplingParams(n=...))`); with `data_parallel_size` N > 1, a local
`vllm serve --data-parallel-size N` that spreads each call's requests over N engine cores, one per
GPU (vLLM refuses `LLM(data_parallel_size=N)` in one process), reached through the litellm engine
(`engines/served_engine.py`). Both send the same sampling parameters and per-conversation seeds.

vLLM is the `gpu` extra (not installable on the CPU machines this project is developed and tested
on), so this module is imported lazily; it ran on an H200 with vLLM 0.26.0 (docs/RESULTS.md). vLLM
schedules every conversation of a call at once (continuous batching, paged KV cache sized by
`gpu_memory_utilization`): one `generate` call per step of the trajectory stage is all it needs. To
reach a `vllm serve` endpoint elsewhere, use the litellm engine with `api_base`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from .base import Completion, Conversation, Engine, reopen_thinking, validate_conversations
from .config import MAX_CONCURRENCY, EngineConfig, SamplingConfig
from .keyed_sampling import conversation_seeds

log = logging.getLogger(__name__)


class VLLMEngineError(RuntimeError):
    """vLLM's engine failed while generating (not a request it refused)."""


MISSING = (
    "EngineConfig(kind='vllm') needs vLLM, which is not installed: install the GPU extra (pip "
    "install -e '.[gpu]') on a CUDA machine, or serve the model with `vllm serve` elsewhere and "
    "use kind='litellm' with api_base"
)
SERVE_START_TIMEOUT_S = 1200  # N engines load, compile and capture CUDA graphs side by side
DAEMONIC = (
    "EngineConfig(kind='vllm') cannot start vLLM in this daemonic process (a Dask worker under "
    "its nanny: vLLM starts its engine core as a child process, which a daemonic process may "
    "not have): start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker ..."
)


def check_can_start_children() -> None:
    """Raises `RuntimeError(DAEMONIC)` in a daemonic process, before vLLM would fail there on
    an AssertionError naming neither the engine nor the fix."""
    import multiprocessing

    if multiprocessing.current_process().daemon:
        raise RuntimeError(DAEMONIC)


def make_vllm_engine(config: EngineConfig) -> Engine:
    """vLLM in this process for one engine (`data_parallel_size` 1, or auto on one GPU), else a
    local `vllm serve` with that many engines behind the litellm engine."""
    import importlib.util

    from . import resolve_data_parallel

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(MISSING)
    engines = resolve_data_parallel(config)
    if engines == 1:
        check_can_start_children()
        return VLLMEngine(config)
    from .served_engine import ServedEngine

    log.info("vLLM on %d GPUs: vllm serve --data-parallel-size %d", engines, engines)
    return ServedEngine(config, vllm_launch(config, engines))


def engine_kwargs(config: EngineConfig) -> dict[str, Any]:
    """vLLM's engine arguments for `config`: `LLM(**kwargs)` in this process, the same as flags
    of `vllm serve` (`serve_flags`)."""
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "dtype": "auto" if config.dtype == "auto" else config.dtype,
    }
    if config.max_model_len is not None:
        kwargs["max_model_len"] = config.max_model_len
    kwargs.update(config.extra)
    return kwargs


def serve_flags(kwargs: dict[str, Any]) -> list[str]:
    """Engine arguments as `vllm serve` flags: `load_format="dummy"` -> `--load-format dummy`,
    True -> `--flag`, False -> `--no-flag`, dicts and lists as JSON, None left out."""
    flags: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict | list | tuple):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def vllm_launch(config: EngineConfig, engines: int):
    """How the served engine starts `vllm serve` with `engines` data-parallel engine cores: the
    in-process engine's arguments as flags, and the server's sampling defaults left at vLLM's
    own (`--generation-config vllm`: a model's generation_config.json, e.g. Qwen3's top-k 20,
    would otherwise apply to the served requests but not to `LLM.chat`'s explicit
    SamplingParams). Each request asks for its token ids, so reasoning tokens are counted as
    the in-process engine counts them."""
    from .served_engine import Launch

    flags = ["--data-parallel-size", str(engines), "--generation-config", "vllm"]
    flags += ["--disable-uvicorn-access-log", *serve_flags(engine_kwargs(config))]
    return Launch(
        kind="vllm",
        args=tuple(flags),
        request_extra={"extra_body": {"return_token_ids": True}},
        concurrency=MAX_CONCURRENCY,
        start_timeout_s=SERVE_START_TIMEOUT_S,
        use_n=True,  # vLLM honours n: sample i of a request gets its seed + i, as LLM.chat's
        replicas=engines,
        route=True,  # a conversation's samples on one engine: its prompt computed once
    )


class VLLMEngine(Engine):
    """vLLM in this process. A batch vLLM refuses (ValueError: a prompt longer than the context)
    comes back as failed completions; any other error (a dead engine, CUDA out of memory) is
    raised as `VLLMEngineError`: recording it per batch would turn every later completion into a
    failure and the stage's Pass@1 into a collapse instead of an error."""

    kind = "vllm"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(MISSING) from exc
        self._vllm = vllm
        # vLLM forks its engine core unless it sees CUDA initialised; in the pipeline's Dask worker
        # it saw none, forked, and the child failed ("Cannot re-initialize CUDA in forked
        # subprocess", docs/SCALING.md): a spawned engine core inherits nothing of its parent's
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self.llm = vllm.LLM(model=config.model, **engine_kwargs(config))
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
        except ValueError as exc:  # requests vLLM refused (a prompt past max_model_len): recorded
            error = f"{type(exc).__name__}: {exc}"
            log.warning("vLLM refused the batch: %s", error)
            return [[Completion.failed(error) for _ in range(sampling.n)] for _ in conversations]
        except Exception as exc:  # the engine itself failed: stop, never a silent Pass@1 of 0
            raise VLLMEngineError(
                f"vLLM's engine failed while generating ({type(exc).__name__}: {exc}); the stage "
                "stops here: its finished records are kept and a rerun resumes after them"
            ) from exc
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
