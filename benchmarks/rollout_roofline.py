"""Rollout roofline: decode tokens/s of each generation engine for model shapes of the paper's
size, beside the GPU's physical limit for the same work (results in docs/RESULTS.md).

    python -m benchmarks.rollout_roofline                                   # GPU: 8b + 1.5b shapes
    python -m benchmarks.rollout_roofline --shapes 8b --engines vllm,transformers --batches 64,256
    python -m benchmarks.rollout_roofline --smoke                           # CPU: the code path

Workload per cell (engine x shape x batch B): B prompts of --prompt random token ids, each
continued by exactly --gen sampled tokens (temperature 0.6, top-p 0.95, end of sequence ignored).
Each cell is timed twice, with --gen tokens and with 1 token (prefill only); decode tokens/s =
B x (gen - 1) / (t_gen - t_1). Weights are random (vLLM: load_format=dummy; transformers: random
init on the GPU), so no checkpoint is read. Each engine and shape runs in a child process of its
own (a fresh GPU, a time limit, a result even if another cell dies).

The limit of one decode step over B sequences is the larger of
- memory: bytes read / HBM bandwidth, bytes = every weight that the step reads (all but the input
  embedding table, which is gathered row by row) + the KV cache of every sequence at its current
  length (mean over the decode: prompt + gen / 2);
- compute: FLOPs / peak dense bf16 FLOP/s, FLOPs = 2 x those weights x B + attention
  (4 x context x heads x head_dim per layer and sequence).
Limit tokens/s = B / that time. HBM bandwidth and peak FLOP/s are the vendor's figures for the
GPU (H100 SXM: 3.35 TB/s, 989 TFLOP/s; H200: 4.8 TB/s, 989 TFLOP/s); the copy bandwidth measured
in the run is printed beside them. Goal: >= 30% of the limit for the 8b shape at batch
>= 64.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.30


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (the fields of a Qwen2/Qwen3 config)."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False

    def hf_config(self) -> dict[str, Any]:
        return {
            "architectures": [
                "Qwen3ForCausalLM" if self.model_type == "qwen3" else "Qwen2ForCausalLM"
            ],
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16",
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 2,
        }

    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.model_type == "qwen3":
            attention += 2 * self.head_dim  # q_norm, k_norm
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.layer_params() + self.hidden

    def read_params(self) -> int:
        """Parameters a decode step reads whole: all but an untied input embedding table."""
        return self.params() - (0 if self.tied else self.vocab * self.hidden)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """The engines' own rule (`engines.memory`), on this shape's config."""
        from types import SimpleNamespace

        from engines.memory import kv_bytes_per_token

        return kv_bytes_per_token(SimpleNamespace(**self.hf_config()), dtype_bytes)


SHAPES: dict[str, Shape] = {
    # Qwen3-8B: 8.19B parameters
    "8b": Shape("qwen3", 4096, 36, 32, 8, 128, 12288, 151936, tied=False),
    # Qwen2.5-1.5B: 1.54B parameters
    "1.5b": Shape("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, tied=True, qkv_bias=True),
    # the CPU smoke
    "tiny": Shape("qwen3", 64, 2, 4, 2, 16, 128, 512, tied=False),
}

# vendor figures per GPU (dense bf16 without sparsity; HBM bandwidth)
GPUS: dict[str, tuple[float, float]] = {
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
}


def gpu_limits(name: str) -> tuple[float, float] | None:
    for key, value in GPUS.items():
        if key in name:
            return value
    return None


def roofline(shape: Shape, batch: int, prompt: int, gen: int, bandwidth: float, flops: float):
    """(tokens/s limit, bound) for one decode step over `batch` sequences at mean context."""
    context = prompt + gen / 2
    weights = shape.read_params() * 2
    kv = batch * context * shape.kv_bytes_per_token()
    t_memory = (weights + kv) / bandwidth
    attention = 4 * batch * context * shape.heads * shape.head_dim * shape.layers
    t_compute = (2 * shape.read_params() * batch + attention) / flops
    step = max(t_memory, t_compute)
    return batch / step, "memory" if t_memory >= t_compute else "compute"


# --- the child: one engine, one shape, every batch -------------------------------------------------


def copy_bandwidth() -> float | None:
    """Device-to-device copy, bytes read + written per second (None on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    rate = 2 * src.numel() * 10 / (time.perf_counter() - started)
    del src, dst
    torch.cuda.empty_cache()
    return rate


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    top = min(vocab, 30000) - 1
    return [[rng.randint(3, top) for _ in range(length)] for _ in range(batch)]


def write_model_dir(shape: Shape, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(shape.hf_config(), indent=1))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    return path


class VLLMRunner:
    def __init__(self, model: Path, max_batch: int, max_len: int, args: argparse.Namespace):
        from vllm import LLM

        self.llm = LLM(
            model=str(model),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=max_len,
            max_num_seqs=max_batch,
            enable_prefix_caching=False,  # the timed prefill must really run each time
            gpu_memory_utilization=args.gpu_memory_utilization,
            seed=0,
            enforce_eager=args.eager,
        )

    def run(self, batch: list[list[int]], gen: int) -> float:
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=gen,
            min_tokens=gen,
            ignore_eos=True,
            temperature=0.6,
            top_p=0.95,
            seed=0,
            detokenize=False,
        )
        inputs = [{"prompt_token_ids": ids} for ids in batch]
        started = time.perf_counter()
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        got = {len(o.outputs[0].token_ids) for o in outputs}
        if got != {gen}:
            raise RuntimeError(f"vLLM generated {got} tokens, expected {gen}")
        return seconds


class TransformersRunner:
    """`model.generate` on padded batches; `static`: the static KV cache (transformers compiles
    the decode step for it); `paged`: `generate_batch` (continuous batching, paged KV cache)."""

    def __init__(self, shape: Shape, variant: str, args: argparse.Namespace):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self.torch = torch
        self.variant = variant
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        config = AutoConfig.for_model(**shape.hf_config())
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        torch.manual_seed(0)
        with self.device:
            self.model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        self.model.eval()

    def run(self, batch: list[list[int]], gen: int) -> float:
        torch = self.torch
        kwargs: dict[str, Any] = dict(
            max_new_tokens=gen,
            min_new_tokens=gen,
            do_sample=True,
            temperature=0.6,
            top_p=0.95,
            top_k=None,
            pad_token_id=2,
            eos_token_id=1,
        )
        started = time.perf_counter()
        if self.variant == "paged":
            from transformers import GenerationConfig

            out = self.model.generate_batch(
                batch, generation_config=GenerationConfig(**kwargs), progress_bar=False
            )
            lengths = {len(o.generated_tokens) for o in out.values()}
        else:
            if self.variant == "static":
                kwargs["cache_implementation"] = "static"
            ids = torch.tensor(batch, device=self.device)
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs
                )
            lengths = {out.shape[1] - ids.shape[1]}
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        if lengths != {gen}:
            raise RuntimeError(f"transformers generated {lengths} tokens, expected {gen}")
        return seconds


def child(args: argparse.Namespace) -> int:
    """Run one engine on one shape for every batch; one JSON line per cell on stdout."""
    import torch

    shape = SHAPES[args.shape]
    batches = [int(b) for b in args.batches.split(",")]
    bandwidth = copy_bandwidth()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="roofline-") as tmp:
        if args.engine == "vllm":
            model = write_model_dir(shape, Path(tmp) / "model")
            runner: Any = VLLMRunner(model, max(batches), args.prompt + args.gen + 8, args)
        else:
            variant = {"transformers": "padded", "transformers-static": "static"}.get(
                args.engine, "paged"
            )
            runner = TransformersRunner(shape, variant, args)
        load_s = time.perf_counter() - started
        runner.run(prompts(2, 16, shape.vocab, 99), 4)  # warm-up: kernels, graphs, allocator
        for b in batches:
            batch = prompts(b, args.prompt, shape.vocab, seed=b)
            runner.run(batch, args.gen)  # warm this batch's shapes (graphs, compiled steps)
            t1 = runner.run(batch, 1)
            tg = runner.run(batch, args.gen)
            if tg <= t1:  # the prefill alone took longer than the whole: no decode figure
                raise RuntimeError(f"batch {b}: {args.gen} tokens in {tg:.2f}s, 1 in {t1:.2f}s")
            peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
            cell = {
                "engine": args.engine,
                "shape": args.shape,
                "batch": b,
                "prefill_s": round(t1, 4),
                "total_s": round(tg, 4),
                "decode_tokens_per_s": round(b * (args.gen - 1) / max(1e-9, tg - t1), 1),
                "end_to_end_tokens_per_s": round(b * args.gen / tg, 1),
                "load_s": round(load_s, 1),
                "copy_bandwidth": bandwidth,
                "torch_peak_bytes": peak,
            }
            print("CELL " + json.dumps(cell), flush=True)
    return 0


# --- the parent: cells in child processes, limits, the table ---------------------------------------


def run_child(engine: str, shape: str, args: argparse.Namespace) -> tuple[list[dict], str]:
    command = [
        sys.executable, "-m", "benchmarks.rollout_roofline", "--child",
        "--engine", engine, "--shape", shape, "--batches", args.batches,
        "--prompt", str(args.prompt), "--gen", str(args.gen),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
    ] + (["--eager"] if args.eager else [])  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        proc = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.cell_timeout_s
        )
        out, err, note = (
            proc.stdout,
            proc.stderr,
            "" if proc.returncode == 0 else f"exit {proc.returncode}",
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        note = f"time limit {args.cell_timeout_s:.0f}s"
    cells = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("CELL ")]
    if note and args.json:  # the child's whole log beside the results
        args.json.with_name(f"{args.json.stem}_{engine}_{shape}.log").write_text(err)
    if note:
        tail = "\n".join(err.strip().splitlines()[-15:])
        print(f"{engine} {shape}: {note}\n{tail}", file=sys.stderr, flush=True)
    return cells, note


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        return child(args)
    if args.smoke:
        args.shapes, args.engines, args.batches = "tiny", "transformers", "2,4"
        # 32 new tokens: on a loaded CPU, 8 were within the timing noise of 1 (a flaky smoke)
        args.prompt, args.gen = 8, 32
    device = device_name()
    limits = gpu_limits(device)
    results: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    for shape in args.shapes.split(","):
        for engine in args.engines.split(","):
            print(f"running {engine} on the {shape} shape ...", file=sys.stderr, flush=True)
            cells, note = run_child(engine, shape, args)
            if note:
                failures[f"{engine}/{shape}"] = note
            for cell in cells:
                s = SHAPES[shape]
                cell["params"] = s.params()
                if limits:
                    limit, bound = roofline(s, cell["batch"], args.prompt, args.gen, *limits)
                    cell |= {
                        "limit_tokens_per_s": round(limit, 1),
                        "bound": bound,
                        "share_of_limit": round(cell["decode_tokens_per_s"] / limit, 4),
                    }
                results.append(cell)
            if args.json:  # after every child: a later crash loses nothing
                write_json(args, device, limits, results, failures)
    print(render(device, limits, args, results, failures))
    return 0


def write_json(args, device, limits, results, failures) -> None:
    report = {
        "benchmark": "rollout_roofline",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"device": device, "cpus": os.cpu_count(), "python": platform.python_version()},
        "limits": {"hbm_bytes_per_s": limits[0], "bf16_flops": limits[1]} if limits else None,
        "settings": {"prompt": args.prompt, "gen": args.gen, "batches": args.batches},
        "shapes": {
            k: asdict(SHAPES[k]) | {"params": SHAPES[k].params()} for k in args.shapes.split(",")
        },
        "results": results,
        "failures": failures,
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")


def render(device, limits, args, results, failures) -> str:
    bw = max((r["copy_bandwidth"] or 0 for r in results), default=0)
    head = f"rollout roofline on {device}; prompt {args.prompt} tokens, {args.gen} generated"
    if limits:
        head += (
            f"; limits: HBM {limits[0] / 1e12:.2f} TB/s (copy measured here: {bw / 1e12:.2f}), "
            f"{limits[1] / 1e12:.0f} TFLOP/s bf16"
        )
    lines = [
        head,
        "",
        "| shape | engine | batch | decode tok/s | limit tok/s (bound) | share of limit | "
        "prefill s | end-to-end tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        limit = (
            f"{r['limit_tokens_per_s']:.0f} ({r['bound']})" if "limit_tokens_per_s" in r else "-"
        )
        share = f"{100 * r['share_of_limit']:.1f}%" if "share_of_limit" in r else "-"
        lines.append(
            f"| {r['shape']} ({r['params'] / 1e9:.2f}B) | {r['engine']} | {r['batch']} | "
            f"{r['decode_tokens_per_s']:.0f} | {limit} | {share} | {r['prefill_s']:.2f} | "
            f"{r['end_to_end_tokens_per_s']:.0f} |"
        )
    by = {(r["shape"], r["engine"], r["batch"]): r for r in results}
    engines = args.engines.split(",")
    for (shape, engine, b), r in by.items():
        if engine != engines[0]:
            base = by.get((shape, engines[0], b))
            if base:
                ratio = base["decode_tokens_per_s"] / r["decode_tokens_per_s"]
                lines.append(f"{shape} batch {b}: {engines[0]} / {engine} decode = {ratio:.2f}x")
    goal = [r for r in results if r["shape"] == "8b" and r["batch"] >= 64 and "share_of_limit" in r]
    if goal:
        best = max(goal, key=lambda r: r["share_of_limit"])
        verdict = "met" if best["share_of_limit"] >= GOAL else "NOT met"
        lines.append(
            f"goal >= {GOAL:.0%} of the limit (8b, batch >= 64): {verdict} "
            f"(best {100 * best['share_of_limit']:.1f}%, {best['engine']} at batch {best['batch']})"
        )
    for name, note in failures.items():
        lines.append(f"{name}: no result for some batches ({note})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rollout_roofline",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arg = parser.add_argument
    arg("--shapes", default="8b,1.5b", help=f"comma list of {', '.join(SHAPES)}")
    arg(
        "--engines",
        default="vllm,transformers",
        help="comma list of: vllm (LLM.generate), transformers (padded generate, the engine's "
        "path), transformers-static (static KV cache, compiled decode), transformers-paged "
        "(generate_batch); the first is the reference of the printed ratios",
    )
    arg("--batches", default="64,256", help="comma list of batch sizes (sequences)")
    arg("--prompt", type=int, default=512, help="prompt tokens per sequence")
    arg("--gen", type=int, default=256, help="generated tokens per sequence")
    arg("--gpu-memory-utilization", type=float, default=0.85, help="vllm: memory share")
    arg("--eager", action="store_true", help="vllm: no CUDA graphs / torch.compile")
    arg("--cell-timeout-s", type=float, default=420, help="time limit of one engine x shape")
    arg("--smoke", action="store_true", help="CPU: the tiny shape, transformers, small batches")
    arg("--json", type=Path, help="also write the results here (after every engine x shape)")
    arg("--child", action="store_true", help=argparse.SUPPRESS)
    arg("--engine", help=argparse.SUPPRESS)
    arg("--shape", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
