"""Give a random model (engines/tiny.py's builder) a chosen mean response length: the GPU runs of
issue 38 compare tokens/s with a peer whose responses averaged about 200 tokens (verl's GSM8K
GRPO run), and random weights otherwise run every response to the cap.

The builder writes the end-of-turn row of the head as `direction x eos_logit / sqrt(hidden)`,
so the end-of-turn logit is linear in that scale. One forward pass over random token sequences
gives, per position, that logit at the built scale and the log-sum-exp of the others; the scale
whose mean per-token stop probability gives a capped geometric mean length of --mean tokens
(at temperature 1, the GRPO preset's) is found by bisection, and the row is rescaled in the
saved weights. Prints a JSON line: the scale, the predicted mean, the stop probability.

    python scripts/gpu/eos_calibrate.py /root/model-8b-v152k --mean 200 --cap 1024
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def capped_mean(p: float, cap: int) -> float:
    """Mean of min(T, cap) for T geometric with stop probability p per token."""
    if p <= 0:
        return float(cap)
    return (1 - (1 - p) ** cap) / p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--mean", type=float, default=200.0, help="target mean length (tokens)")
    parser.add_argument("--cap", type=int, default=1024, help="max completion tokens")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args(argv)
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    config = json.loads((args.model / "config.json").read_text())
    eos = int(config["eos_token_id"])
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.bfloat16)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (args.sequences, args.length), generator=generator)
    eos_logits, others = [], []
    with torch.no_grad():
        for row in ids.to(device).split(4):
            logits = model(row).logits.float()
            eos_logits.append(logits[..., eos].flatten().cpu().clone())
            logits[..., eos] = -float("inf")
            others.append(torch.logsumexp(logits, dim=-1).flatten().cpu())
    a, rest = torch.cat(eos_logits), torch.cat(others)

    def stop(scale: float) -> float:  # scale: multiple of the built row
        return torch.sigmoid(a * scale - rest).mean().item()

    low, high = 0.0, 64.0
    for _ in range(60):
        middle = (low + high) / 2
        if capped_mean(stop(middle), args.cap) > args.mean:
            low = middle
        else:
            high = middle
    scale = (low + high) / 2
    files = sorted(args.model.glob("*.safetensors"))
    for path in files:
        tensors = load_file(str(path))
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"][eos] *= scale
            save_file(tensors, str(path), metadata={"format": "pt"})
            break
    else:
        raise SystemExit("no lm_head.weight in the model's safetensors files")
    found = {
        "model": str(args.model),
        "row_scale": round(scale, 4),
        "stop_probability": stop(scale),
        "predicted_mean_tokens": round(capped_mean(stop(scale), args.cap), 1),
        "built_stop_probability": stop(1.0),
        "eos_logit_mean_std_at_built": [round(a.mean().item(), 3), round(a.std().item(), 3)],
    }
    (args.model / "eos_calibration.json").write_text(json.dumps(found, indent=1))
    print(json.dumps(found))
    return 0 if math.isfinite(scale) and 0 < scale < 64 else 1


if __name__ == "__main__":
    sys.exit(main())
