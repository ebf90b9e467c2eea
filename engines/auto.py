"""What `auto` means for a local model: vLLM where its start-up pays for itself, else the
transformers engine. One decision for the generating stages (`EngineConfig(kind="auto")`,
`engines.resolve_kind`) and GRPO's sampling (`TrainingConfig(generation="auto")`).

vLLM starts in 60-95 s per process (engine, torch.compile, CUDA graph capture), paid again by every
generating stage and by GRPO with vLLM colocated. At model scale it pays back many times: 1.5B and
8B shapes decode 6-22x faster than with the transformers engine (docs/RESULTS.md). On the embedded
default's ~0.85M-parameter model it never does: one H200, the trajectories took 24.9 s with the
transformers engine and 111 s with vLLM, the evaluation 21.5 s and 72.5 s, the 32 GRPO steps 37 s
and 78 s (docs/RESULTS.md, the pipeline on GPUs). So `auto` picks vLLM for a model of at least
`SMALL_MODEL` parameters (counted from its config.json on the meta device: no weights read), on a
GPU, with vLLM installed; the transformers engine otherwise. The crossover lies between the two
measured sizes and was not measured; the threshold sits above every tiny model of the project (the
embedded ones 0.2-0.9M, the learning check's 25M) and below the smallest real code model (0.5B).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

SMALL_MODEL = 50_000_000  # parameters: below, vLLM's start-up costs more than it saves


@dataclass(frozen=True)
class Choice:
    """The engine `auto` picked and why, in a few words (printed in a run's settings)."""

    kind: str  # "vllm" or "transformers"
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.reason})"


def count_parameters(config) -> int:
    """Parameters of a causal LM built from a transformers config, on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def model_parameters(model: str | Path | None) -> int | None:
    """Parameters of the model saved in directory `model` (its config.json); None when there is
    no such directory or its architecture is unknown to this transformers."""
    if model is None or not Path(model, "config.json").is_file():
        return None
    try:
        from transformers import AutoConfig

        return count_parameters(AutoConfig.from_pretrained(str(model)))
    except Exception:  # an architecture this transformers cannot build: size unknown
        return None


def choose(
    model: str | Path | None = None,
    *,
    parameters: int | None = None,
    vllm_installed: bool | None = None,
    gpu: bool | None = None,
) -> Choice:
    """The engine for `model` (a directory; or give its `parameters`). The probes of vLLM and
    the GPU can be given (tests)."""
    if gpu is None:
        gpu = _gpu_visible()
    if not gpu:
        return Choice("transformers", "no GPU")
    if vllm_installed is None:
        vllm_installed = _vllm_installed()
    if not vllm_installed:
        return Choice("transformers", "vLLM not installed")
    if parameters is None:
        parameters = model_parameters(model)
    if parameters is None:
        return Choice("vllm", "model size unknown")
    size = _size(parameters)
    if parameters < SMALL_MODEL:
        return Choice(
            "transformers",
            f"{size} parameters < {_size(SMALL_MODEL)}: vLLM's ~1 min start-up costs more",
        )
    return Choice("vllm", f"{size} parameters >= {_size(SMALL_MODEL)}")


def _size(parameters: int) -> str:
    if parameters >= 1e9:
        return f"{parameters / 1e9:.1f}B"
    return f"{parameters / 1e6:.2g}M" if parameters < 1e7 else f"{parameters / 1e6:.0f}M"


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _gpu_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
