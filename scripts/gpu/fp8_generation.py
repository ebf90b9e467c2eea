"""GRPO's generation in bf16 against fp8 (`--fp8-generation`: the weights; `--fp8-kv-cache`: the
KV cache) on the training stage's own vLLM server, on one GPU: what fp8 gains the GPU that
generates in the split (`--vllm-server-gpus`), and how far its samples' probabilities drift from
the model the trainer computes (what TRL's importance-sampling correction weighs, and what its
default `sequence_mask` drops).

For each precision the stage's server is started as the stage starts it
(`cobalt.training.machinery.vllm_server.generation_server`: `quantization="fp8"` for fp8, the KV
cache in fp8 for fp8-kv, neither for bf16) on GPU 0, asked for the batch through TRL's
`VLLMClient.generate` (what each training process calls), once to warm up and once timed. Then,
the server stopped, the model is loaded in bf16 and the sampled tokens' log-probabilities are
recomputed (the sampling's logit bias added, temperature 1): per token |trainer - sampler|, and
per sequence exp(sum of the differences), the ratio TRL's `sequence_mask` keeps only within
[clip_min, clip_max] (TRL's defaults). The bf16 server is the yardstick: vLLM in bf16 already
differs from a transformers forward by its kernels' rounding.

    python scripts/gpu/fp8_generation.py /root/model-8b \\
        --shape verl:270:5:147:1024:/root/model-8b/eos_calibration.json \\
        --shape nemo:64:32:147:4096:/root/model-8b/eos_calibration_1000.json --json $OUT/fp8.json

With one precision and `--rows 0` it measures how fast the stage's server generates any batch,
e.g. the paper's lengths at 1, 2, 4 and 8 prompts of 16 samples (every response at the cap):

    python scripts/gpu/fp8_generation.py /root/model-8b --precisions bf16 --rows 0 \\
        --shape p16:1:16:9900:6144:ignore-eos --shape p128:8:16:9900:6144:ignore-eos --json ...

Each batch's figures include vLLM's own counters over it (`/metrics`): requests preempted (the KV
cache full) and the share of prompt tokens found in the prefix cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def prompts_of(vocab: int, count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of `tokens` random token ids (the same for both precisions)."""
    import random

    draw = random.Random(seed)
    return [[draw.randrange(100, vocab - 1) for _ in range(tokens)] for _ in range(count)]


PRECISIONS = {  # name: (the server's --quantization, its --kv-cache-dtype)
    "bf16": (None, None),
    "fp8": ("fp8", None),  # --fp8-generation
    "fp8-kv": (None, "fp8"),  # --fp8-kv-cache
}


def sample(model: Path, precision: str, shapes: list[Shape], log_dir: Path | None = None):
    """Each shape's timed batch from one server of the stage's in `precision` (a name of
    PRECISIONS); the server's log kept under `log_dir`/PRECISION if given."""
    from trl.generation.vllm_client import VLLMClient

    from cobalt.training.machinery.vllm_server import generation_server

    context = max(s.prompt_tokens + s.max_tokens for s in shapes)
    found: dict[str, Any] = {}
    outs = {}
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as scratch,
        generation_server(
            model,
            ["0"],
            kept(log_dir, precision) or scratch,
            max_model_len=context,
            quantization=PRECISIONS[precision][0],
            kv_cache_dtype=PRECISIONS[precision][1],
            timeout_s=900,
        ) as server,
    ):
        found["server_start_s"] = round(time.monotonic() - started, 1)  # until /health answers
        print(precision, "server up in", found["server_start_s"], "s", flush=True)
        client = VLLMClient(base_url=server.url, connection_timeout=60)
        for shape in shapes:
            ask = dict(n=shape.samples, temperature=1.0, max_tokens=shape.max_tokens)
            # warm-up: other prompts (the timed ones stay out of the prefix cache), few tokens
            warm = prompts_of(shape.vocab, 8, shape.prompt_tokens, seed=1)
            client.generate(warm, **{**ask, "max_tokens": 8}, generation_kwargs=shape.kwargs)
            before = counters(server.url)
            started = time.monotonic()
            out = client.generate(shape.prompts, **ask, generation_kwargs=shape.kwargs)
            seconds = time.monotonic() - started
            completion = sum(len(c) for c in out["completion_ids"])
            prompt = sum(len(p) for p in out["prompt_ids"]) * shape.samples
            found[shape.name] = {
                "seconds": round(seconds, 2),
                "completions": len(out["completion_ids"]),
                "completion_tokens": completion,
                "response_mean_tokens": round(completion / len(out["completion_ids"]), 1),
                "tokens_per_s": round((prompt + completion) / seconds, 1),
                "completion_tokens_per_s": round(completion / seconds, 1),
                **counted(before, counters(server.url)),
            }
            outs[shape.name] = out
            print(precision, shape.name, json.dumps(found[shape.name]), flush=True)
    return found, outs


COUNTERS = {  # vLLM's Prometheus counters: what the batch made the engine do
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}


def counters(url: str) -> dict[str, float]:
    """COUNTERS' values summed over the server's engines, from its `/metrics` (empty if it
    does not answer: the figures are then left out, the timing stands)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    return metric_totals(text)


def metric_totals(text: str) -> dict[str, float]:
    """COUNTERS' totals in a Prometheus text exposition (each series summed over its labels)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name, metric in COUNTERS.items():
            if line.startswith(metric + "{") or line.startswith(metric + " "):
                found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def counted(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the batch added to each counter, and the prefix cache's hit share of its prompts."""
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    out: dict[str, Any] = {}
    if "preemptions" in delta:
        out["preemptions"] = int(delta["preemptions"])
    if delta.get("prefix_cache_queries"):
        out["prefix_cache_hit_share"] = round(
            delta.get("prefix_cache_hits", 0.0) / delta["prefix_cache_queries"], 3
        )
    return out


def kept(log_dir: Path | None, name: str) -> Path | None:
    """`log_dir`/`name`, made, or None without a `log_dir`."""
    if log_dir is None:
        return None
    (log_dir / name).mkdir(parents=True, exist_ok=True)
    return log_dir / name


@dataclass
class Shape:
    """One batch: `prompts` (token ids) x `samples`, responses up to `max_tokens`, `kwargs` the
    sampling's generation_kwargs (eos_calibrate.py's logit bias)."""

    name: str
    prompts: list[list[int]]
    samples: int
    prompt_tokens: int
    max_tokens: int
    kwargs: dict[str, Any]
    vocab: int

    @classmethod
    def parse(cls, text: str, vocab: int) -> Shape:
        """NAME:PROMPTS:SAMPLES:PROMPT_TOKENS:MAX_TOKENS[:CALIBRATION_FILE]"""
        name, prompts, samples, prompt_tokens, max_tokens, *rest = text.split(":")
        kwargs: dict[str, Any] = {}
        if rest and Path(rest[0]).is_file():
            kwargs = json.loads(Path(rest[0]).read_text())["generation_kwargs"]
        elif rest:
            kwargs = {"ignore_eos": True}  # no calibration: every response at the cap
        # each batch's own prompts (seeded by its name: the same for both precisions), so no
        # batch finds another's in the prefix cache; the warm-up draws with seed 1
        return cls(
            name,
            prompts_of(vocab, int(prompts), int(prompt_tokens), seed=2 + zlib.crc32(name.encode())),
            int(samples),
            int(prompt_tokens),
            int(max_tokens),
            kwargs,
            vocab,
        )


def drift(
    model: Path,
    out: dict[str, Any],
    samples: int,
    rows: int,
    bias: dict[int, float],
    dtype: Any = None,
):
    """The sampled tokens' log-probabilities recomputed (in bf16 unless `dtype`) against the
    sampler's: `out` as `VLLMClient.generate` returns it, the first `rows` completions."""
    import torch

    dtype = dtype or torch.bfloat16
    from transformers import AutoModelForCausalLM
    from trl.trainer.grpo_config import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}  # TRL's own bounds
    low = defaults["vllm_importance_sampling_clip_min"]
    high = defaults["vllm_importance_sampling_clip_max"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype).to(device).eval()
    token_diffs, sequence_logs = [], []
    with torch.no_grad():
        for i in range(min(rows, len(out["completion_ids"]))):
            prompt = out["prompt_ids"][i // samples]
            completion = out["completion_ids"][i]
            if not completion:
                continue
            ids = torch.tensor([prompt + completion], device=device)
            logits = policy(ids).logits[0, len(prompt) - 1 : -1].float()
            for token, value in bias.items():
                logits[:, token] += value
            own = torch.log_softmax(logits, -1).gather(
                1, torch.tensor(completion, device=device)[:, None]
            )[:, 0]
            sampler = torch.tensor([lp[0] for lp in out["logprobs"][i]], device=device)
            diff = (own - sampler).cpu()
            token_diffs.append(diff)
            sequence_logs.append(float(diff.sum()))
    del policy
    torch.cuda.empty_cache()
    every = torch.cat(token_diffs)
    ratios = [math.exp(min(s, 50.0)) for s in sequence_logs]
    dropped = sum(1 for r in ratios if r < (low or 0.0) or r > (high or math.inf))
    return {
        "sequences": len(ratios),
        "tokens": int(every.numel()),
        "token_abs_diff_mean": round(float(every.abs().mean()), 5),
        "token_abs_diff_p99": round(float(every.abs().quantile(0.99)), 5),
        "token_diff_mean": round(float(every.mean()), 6),
        "sequence_log_ratio_abs_mean": round(sum(abs(s) for s in sequence_logs) / len(ratios), 4),
        "sequence_mask_bounds": [low, high],
        "sequence_mask_dropped": dropped,
        "sequence_mask_dropped_share": round(dropped / len(ratios), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument(
        "--shape",
        action="append",
        required=True,
        help="NAME:PROMPTS:SAMPLES:PROMPT_TOKENS:MAX_TOKENS[:CALIBRATION_FILE] (repeatable; "
        "a calibration file that is missing: every response at the cap)",
    )
    parser.add_argument(
        "--rows", type=int, default=160, help="sequences recomputed in bf16 (0: no drift)"
    )
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=list(PRECISIONS),
        default=["bf16", "fp8"],
        help="the servers to start, in this order: bf16, fp8 (weights, --fp8-generation), "
        "fp8-kv (the KV cache, --fp8-kv-cache); each other one is compared with bf16's speed",
    )
    parser.add_argument("--log-dir", type=Path, help="keep each server's log under DIR/PRECISION")
    args = parser.parse_args(argv)
    vocab = int(json.loads((args.model / "config.json").read_text())["vocab_size"])
    shapes = [Shape.parse(text, vocab) for text in args.shape]
    found: dict[str, Any] = {"model": str(args.model), "shapes": args.shape}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    outs = {}
    for name in args.precisions:
        try:
            found[name], outs[name] = sample(args.model, name, shapes, args.log_dir)
        except Exception as exc:  # the other precision's figures still land in the JSON
            found[name] = {"error": str(exc)[-4000:]}
            args.json.write_text(json.dumps(found, indent=1))
            print(name, "failed:", str(exc)[-4000:], flush=True)
            return 1
    for name in args.precisions if "bf16" in args.precisions else []:
        for shape in shapes if name != "bf16" else []:
            ratio = (
                found[name][shape.name]["tokens_per_s"] / found["bf16"][shape.name]["tokens_per_s"]
            )
            found[f"{shape.name}_{name}_vs_bf16"] = round(ratio, 3)
            print(f"{shape.name}: {name} / bf16 generation tokens/s {ratio:.3f}", flush=True)
    args.json.write_text(json.dumps(found, indent=1))
    for shape in shapes if args.rows > 0 else []:
        bias = {int(k): float(v) for k, v in (shape.kwargs.get("logit_bias") or {}).items()}
        for name in args.precisions:
            measured = drift(args.model, outs[name][shape.name], shape.samples, args.rows, bias)
            found[name][shape.name]["drift_from_bf16_forward"] = measured
            print(name, shape.name, "drift", json.dumps(measured), flush=True)
    args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
