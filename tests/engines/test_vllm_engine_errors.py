"""The in-process vLLM engine's failures (vLLM itself runs on GPUs only: its `LLM` is stood in by
an object that raises as vLLM does): a batch vLLM refuses comes back as failed completions, a
dead engine stops the stage with an error instead of turning every later completion into a
failure (a Pass@1 that collapses without a word)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engines import EngineConfig, SamplingConfig
from engines.vllm_engine import VLLMEngine, VLLMEngineError

CONVERSATION = [{"role": "user", "content": "hi"}]


def engine_raising(error: Exception) -> VLLMEngine:
    engine = VLLMEngine.__new__(VLLMEngine)  # vLLM's own constructor needs a GPU
    engine.config = EngineConfig(kind="vllm", model="m")

    def chat(*args, **kwargs):
        raise error

    engine._vllm = SimpleNamespace(SamplingParams=lambda **kw: kw)
    engine.llm = SimpleNamespace(chat=chat)
    return engine


def test_a_refused_batch_comes_back_as_failed_completions() -> None:
    engine = engine_raising(ValueError("The decoder prompt (length 9000) is longer than 8192"))
    [row] = engine.generate([CONVERSATION], SamplingConfig(n=2, seed=1))
    assert len(row) == 2 and all("longer than 8192" in (c.error or "") for c in row)


@pytest.mark.parametrize(
    "error",
    [RuntimeError("EngineDeadError: EngineCore encountered an issue"),
     RuntimeError("CUDA error: an illegal memory access was encountered")],
)  # fmt: skip
def test_a_dead_engine_stops_the_stage(error) -> None:
    with pytest.raises(VLLMEngineError, match=r"vLLM's engine failed while generating"):
        engine_raising(error).generate([CONVERSATION], SamplingConfig(n=2, seed=1))
