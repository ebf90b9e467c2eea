"""What vLLM's fp8 KV cache does to a model's Pass@1, emulated on CPU and paired by seed.

With `--kv-cache-dtype fp8` and FlashAttention 3 (the GPU bundle's vLLM 0.26), vLLM quantizes
the query, the keys and the values to float8 e4m3 with a scale of 1.0 (no calibrated scales:
`Attention._init_kv_cache_quant` fills them with 1.0) and FlashAttention's fp8 kernel multiplies
the softmax's probabilities by the values in fp8 too. This script replaces transformers' SDPA
attention in this process by the same arithmetic (q, k, v rounded to e4m3 after clamping to
+/-448; the unnormalised probabilities exp(s - max) rounded to e4m3 before the product with the
values; the row sums kept in float32) and runs the product's evaluation (`flows.trajectories
--evaluation`, the transformers engine) with and without it, for each seed, so that each pair
draws the same random numbers and differs only in the attention's precision.

    python -m benchmarks.fp8_attention_emulation --model .gpu/fitted --seeds 0 1 \
        --json benchmarks/results/fp8_attention_emulation_fitted_cpu_<date>.json

Flags after `--` go to `flows.trajectories` unchanged (e.g. `-- --limit 10`).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn, where vLLM's quantization clamps


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float8 e4m3 (scale 1, clamped to +/-448) and back to x's dtype."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def fp8_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature ([batch, heads, length, dim] in, [batch, length, heads,
    dim] out) computed as FlashAttention's fp8 path does: inputs and probabilities in e4m3."""
    q, k, v = to_e4m3(query), to_e4m3(key), to_e4m3(value)
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    q_len, k_len = scores.shape[-2:]
    if attention_mask is None:  # SDPA's causal case: the queries are the last q_len positions
        keep = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril(k_len - q_len)
        scores = scores.masked_fill(~keep, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask[..., :k_len], float("-inf"))
    else:
        scores = scores + attention_mask[..., :k_len].float()
    top = scores.amax(dim=-1, keepdim=True).clamp_min(-1e30)  # a fully masked row stays finite
    probs = torch.exp(scores - top)
    sums = probs.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    out = (to_e4m3(probs) @ v.float()) / sums
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def install() -> None:
    """Route every model's SDPA attention in this process through fp8_attention."""
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa", fp8_attention)


PASS_ROW = re.compile(r"^\| (\w+) \| (\d) \| (\d+) \| (\d+) \| ([\d.]+) \|")


def evaluate(model: str, seed: int, storage: Path, extra: list[str]) -> dict:
    """One evaluation through the product's flow in this process; its per-turn Pass@1 rows."""
    from contextlib import redirect_stdout
    from io import StringIO

    from flows.trajectories import main

    argv = [
        "--evaluation",
        "--preset",
        "tiny",
        "--engine",
        "transformers",
        "--model",
        model,
        "--problems",
        "samples/synthetic_test.jsonl:taco",
        "--seed",
        str(seed),
        "--storage",
        str(storage),
        *extra,
    ]
    printed = StringIO()
    started = time.perf_counter()
    with redirect_stdout(printed):
        rc = main(argv)
    if rc:
        raise SystemExit(f"flows.trajectories {' '.join(argv)} exited {rc}:\n{printed.getvalue()}")
    rows = {}
    for line in printed.getvalue().splitlines():
        m = PASS_ROW.match(line)
        if m:
            rows[f"{m[1]} turn {m[2]}"] = float(m[5])
    if not rows:
        raise SystemExit(f"no Pass@1 table in the flow's output:\n{printed.getvalue()[-2000:]}")
    return {"pass@1": rows, "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fp8_attention_emulation",
        description="Pass@1 of a model with its attention in full precision and as vLLM's fp8 "
        "KV cache computes it (emulated on CPU), paired by sampling seed.",
    )
    parser.add_argument("--model", required=True, help="model directory (e.g. .gpu/fitted)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--storage",
        type=Path,
        default=Path("/tmp/fp8-emulation-runs"),
        help="the flow's storage (each run its own folder below it)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(own)

    runs: dict[str, dict] = {}
    for precision in ("full", "fp8"):  # full first: install() changes the process for good
        if precision == "fp8":
            install()
        for seed in args.seeds:
            name = f"{precision}-seed{seed}"
            runs[name] = evaluate(args.model, seed, args.storage / name, extra)
            print(name, json.dumps(runs[name]), flush=True)
    keys = runs[f"full-seed{args.seeds[0]}"]["pass@1"].keys()
    diff = {
        k: round(
            sum(
                runs[f"fp8-seed{s}"]["pass@1"][k] - runs[f"full-seed{s}"]["pass@1"][k]
                for s in args.seeds
            )
            / len(args.seeds),
            2,
        )
        for k in keys
    }
    print("fp8 - full, mean over seeds:", json.dumps(diff))
    if args.json:
        report = {
            "what": __doc__.split("\n\n")[1].replace("\n", " "),
            "command": "python -m benchmarks.fp8_attention_emulation " + " ".join(argv),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
            "date": time.strftime("%Y-%m-%d"),
            "runs": runs,
            "fp8_minus_full_mean": diff,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
