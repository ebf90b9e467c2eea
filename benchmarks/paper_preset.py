"""The paper preset at the paper's model size and lengths on one GPU (does it fit?):
GRPO with the `paper` training preset on a Qwen3-8B-shaped model (random weights, the real
151,936-token vocabulary, LoRA), prompts of --prompt-tokens and completions of
--completion-tokens, through the training stage's own path (`cobalt.training.launch.run_job`: a
process of its own on a GPU, the memory plan of `cobalt.training.machinery.memory`, fp32 adapters
over the bf16 base with bf16 compute). Prints and writes: whether it ran out of memory, the
micro-batch the plan chose, peak memory (the trainer's allocator, and the whole GPU with vLLM's
share), step time and its split, and the training phase's model FLOPs utilisation.

    python -m benchmarks.paper_preset --model-dir /root/model-8b-v152k --json out.json
    python -m benchmarks.paper_preset --smoke          # CPU: the code path only

Workload: one prompt per step (TRL's generation batch = 16 samples, the paper's group), the step
made of those 16 sequences (the paper's step is 64 prompts: the same sequences, 64 times as
many accumulation steps: memory is per micro-batch, so what fits here fits there). A random model
never ends a turn, so every completion runs to --completion-tokens: the worst case of the
preset's lengths. MFU = model FLOPs of the optimisation phase / (its seconds x --peak-tflops):
forward + backward (LoRA: activation gradients only, 4 x params per token), the reference
model's forward (2 x params per token), causal attention (4 x layers x hidden x context / 2 per
token and pass); gradient checkpointing's recomputation is not counted (it is not model work).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grpo_scaling import BenchSpec  # noqa: E402
from cobalt.bandit.dataset import commit_rows  # noqa: E402
from cobalt.bandit.rows import prepare_rows  # noqa: E402
from cobalt.judging import SandboxRuntime  # noqa: E402
from cobalt.storage import StorageConfig, open_storage  # noqa: E402
from cobalt.training.launch import Job, run_job  # noqa: E402
from cobalt.training.settings import LoraSettings, TrainingConfig  # noqa: E402

QWEN3_8B = {"hidden_size": 4096, "num_layers": 36, "num_heads": 32, "num_kv_heads": 8,
            "intermediate_size": 12288}  # fmt: skip
QWEN3_VOCAB = 151_936
H200_BF16_TFLOPS = 989.0  # dense bf16 peak (the roofline's figure, docs/RESULTS.md)


class GpuMemorySampler:
    """The whole GPU's used memory (every process: the trainer and vLLM), sampled every 0.2 s."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import torch

        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            self._stop.wait(0.2)

    def __enter__(self) -> GpuMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def build_model(path: Path, smoke: bool) -> Path:
    from engines.tiny import build_tiny_model

    if (path / "config.json").exists():
        return path
    if smoke:
        return build_tiny_model(path, seed=0, pad_vocab_to=4096)
    return build_tiny_model(
        path,
        seed=0,
        **QWEN3_8B,
        max_position_embeddings=32_768,
        eos_logit=0.0,
        pad_vocab_to=QWEN3_VOCAB,
        device="cuda",
        dtype="bfloat16",
    )


def long_prompt(model: Path, tokens: int) -> list[dict[str, str]]:
    """A turn-0 conversation whose templated prompt is `tokens` tokens long, give or take one
    sentence."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    piece = "Read a list of integers and print their sum. "

    def length(pieces: int) -> int:
        messages = [{"role": "user", "content": piece * pieces + "Solve it in Python."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    per_piece = length(2) - length(1)
    pieces = max(1, (tokens - length(0)) // per_piece)
    while length(pieces) > tokens and pieces > 1:
        pieces -= 1
    return [{"role": "user", "content": piece * pieces + "Solve it in Python."}]


def run(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    import torch

    from sandbox import TestSuite

    storage = StorageConfig(url=str(work / "runs"))
    prompt = long_prompt(model, args.prompt_tokens)
    row = {
        "prompt": prompt,
        "test_cases": TestSuite(inputs=["1 2\n"], outputs=["3\n"]).model_dump(),
        "prev_best_pass_rate": 0.0,
        "difficulty": "bench",
        "example_id": "long",
    }
    st = open_storage(storage)
    dataset = commit_rows(
        st, st.path("bandit", "paper"), "paper", prepare_rows([row] * 4, "cobalt"), {},
        BenchSpec(prompts=4),
    )  # fmt: skip
    overrides: dict[str, Any] = {
        "gradient_accumulation_steps": 1,  # the step: one generation batch (16 sequences)
        "generation_batch_size": 16,
        "max_completion_length": args.completion_tokens,
        "save_strategy": "no",
    }
    if torch.cuda.is_available():
        overrides["vllm_gpu_memory_utilization"] = args.vllm_memory
    else:
        overrides |= {"use_cpu": True, "gradient_checkpointing": False, "num_generations": 4,
                      "generation_batch_size": 4}  # fmt: skip
    config = TrainingConfig(
        preset="paper",
        mode="single_turn",
        lora=LoraSettings(),
        max_steps=args.steps,
        max_prompt_length=args.prompt_tokens + 256,
        report_to=[],
        overrides=overrides,
    )
    job = Job(
        config=config,
        dataset=dataset,
        storage=storage,
        sandbox=SandboxRuntime(backend=args.backend, concurrency=4),
        model=str(model),
        output_dir=str(work / "out"),
    )
    started = time.perf_counter()
    error = None
    with GpuMemorySampler() if torch.cuda.is_available() else _Null() as sampler:
        try:
            history, timing, extra = run_job(job)
        except Exception as exc:  # noqa: BLE001 - an out-of-memory failure is a result here
            history, timing, extra = [], {}, {}
            error = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    wall = time.perf_counter() - started
    result: dict[str, Any] = {
        "ran": error is None,
        "error": error,
        "wall_s": round(wall, 1),
        "memory_plan": extra.get("memory_plan"),
        "numerics": extra.get("numerics"),
        "trainer_peak_allocated_gib": extra.get("gpu_peak_memory_gib"),
        "trainer_peak_reserved_gib": extra.get("gpu_peak_reserved_gib"),
        "gpu_peak_used_gib": round(sampler.peak / 2**30, 1) if sampler.peak else None,
    }
    if error is None:
        steps = [h for h in history if "loss" in h]
        step_s = timing["step_s"]
        tokens = [int(h["num_tokens"]) for h in steps if "num_tokens" in h]
        per_step = [b - a for a, b in zip([0, *tokens[:-1]], tokens, strict=True)]
        flops = sum(step_flops(model, t) for t in per_step)
        optimisation = timing.get("optimisation_s") or 0.0
        result |= {
            "steps": len(steps),
            "step_s": [round(x, 1) for x in step_s],
            "step_s_median": round(statistics.median(step_s), 1) if step_s else None,
            "generation_share": timing.get("generation_share"),
            "optimisation_s": optimisation,
            "tokens_per_step": per_step,
            "completion_mean_length": [h.get("completions/mean_length") for h in steps],
            "mfu_training_phase": round(flops / (optimisation * args.peak_tflops * 1e12), 3)
            if optimisation and torch.cuda.is_available()
            else None,
        }
    return result


class _Null:
    peak = 0

    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def step_flops(model: Path, tokens: int, sequences: int = 16) -> float:
    """Model FLOPs of one step's optimisation phase (module docstring), `tokens` over
    `sequences` sequences of equal length."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model))
    h, layers, v = config.hidden_size, config.num_hidden_layers, config.vocab_size
    inter, kv = config.intermediate_size, config.num_key_value_heads
    head = h // config.num_attention_heads
    params = layers * (2 * h * h + 2 * h * kv * head + 3 * h * inter) + 2 * v * h
    length = tokens / sequences
    attention = 4 * layers * h * length / 2  # per token, one forward
    per_token = (4 + 2) * params + 3 * 2 * attention  # fwd + act-grad bwd + reference fwd
    return per_token * tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paper_preset", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    arg = parser.add_argument
    arg("--model-dir", type=Path, help="where the 8B-shaped model is built (kept for reruns)")
    arg("--prompt-tokens", type=int, default=10_000)
    arg("--completion-tokens", type=int, default=6144)
    arg("--steps", type=int, default=3)
    arg("--vllm-memory", type=float, default=0.5, help="vLLM's share of the GPU (colocated)")
    arg("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    arg("--backend", default="namespace")
    arg("--smoke", action="store_true", help="CPU: a tiny model, short lengths, 1 step")
    arg("--json", type=Path, help="write the result here")
    arg("--work", type=Path, help="keep the work directory here (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompt_tokens, args.completion_tokens, args.steps = 64, 8, 1
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = build_model(args.model_dir or work / "model", args.smoke)
        result = run(args, model, work)
    result |= {
        "machine": _machine(),
        "date": dt.date.today().isoformat(),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if result["ran"] else 1


def _machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}: {gpu}"


if __name__ == "__main__":
    sys.exit(main())
