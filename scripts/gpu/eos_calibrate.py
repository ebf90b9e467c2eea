"""Give a random model (engines/tiny.py's builder) a chosen mean response length: the GPU runs of
the paper's recipe compare tokens/s with a peer whose responses averaged about 200 tokens (verl's
GSM8K GRPO run), and random weights otherwise run every response to the cap.

The end-of-turn row of the head is set to zero, so the end-of-turn logit is exactly 0 at every
position, and a `logit_bias` on it (vLLM's sampling parameter, passed by TRL from
`generation_kwargs`) sets its probability against the log-sum-exp of the other logits. One
forward pass over random token sequences measures that log-sum-exp per position; the bias whose
mean per-token stop probability gives a capped geometric mean length of --mean tokens (at
temperature 1, the GRPO preset's) is found by bisection. (Rescaling the builder's end-of-turn
row, this script's first form, cannot: at 8B that row's logit is ~0 +/- 0.03 at every position,
2026-11-27.) Writes `eos_calibration.json` into the model and prints it: the bias, the predicted
mean, the generation_kwargs to pass.

    python scripts/gpu/eos_calibrate.py /root/model-8b --mean 200 --cap 1024
    python -m flows.training ... --set "generation_kwargs=$(jq -c .generation_kwargs \\
        /root/model-8b/eos_calibration.json)"
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
    for path in sorted(args.model.glob("*.safetensors")):  # the end-of-turn row: zero
        tensors = load_file(str(path))
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"][eos] = 0
            save_file(tensors, str(path), metadata={"format": "pt"})
            break
    else:
        raise SystemExit("no lm_head.weight in the model's safetensors files")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.bfloat16)
    model.to(device).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (args.sequences, args.length), generator=generator)
    others = []
    with torch.no_grad():
        for row in ids.to(device).split(4):
            logits = model(row).logits.float()
            logits[..., eos] = -float("inf")
            others.append(torch.logsumexp(logits, dim=-1).flatten().cpu())
    rest = torch.cat(others)

    def stop(bias: float) -> float:
        return torch.sigmoid(bias - rest).mean().item()

    low, high = -50.0, 100.0
    for _ in range(80):
        middle = (low + high) / 2
        if capped_mean(stop(middle), args.cap) > args.mean:
            low = middle
        else:
            high = middle
    bias = round((low + high) / 2, 4)
    found = {
        "model": str(args.model),
        "eos_token_id": eos,
        "logit_bias": bias,
        "stop_probability": stop(bias),
        "predicted_mean_tokens": round(capped_mean(stop(bias), args.cap), 1),
        "others_logsumexp_mean_std": [round(rest.mean().item(), 3), round(rest.std().item(), 3)],
        "generation_kwargs": {"logit_bias": {str(eos): bias}},
    }
    (args.model / "eos_calibration.json").write_text(json.dumps(found, indent=1))
    print(json.dumps(found))
    return 0 if math.isfinite(bias) and -50 < bias < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
