"""What torch's deterministic mode costs (the learning check turns it on, docs/LEARNING.md):
training steps and sampled generation of a ~1M-parameter Qwen2-shaped model (`engines.tiny`),
the mode off and on in alternating rounds, best round of each.

    python -m benchmarks.deterministic_cost                 # CPU or the GPU there is
    python -m benchmarks.deterministic_cost --rounds 8 --hidden 512 --layers 8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deterministic_cost")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CPU)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from engines.tiny import build_tiny_model

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = build_tiny_model(
        tempfile.mkdtemp(prefix="detcost-"),
        seed=0,
        vocab_size=1024,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=max(2, args.hidden // 64),
        num_kv_heads=max(1, args.hidden // 128),
        intermediate_size=2 * args.hidden,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (16, 256), device=device)
    prompt = torch.randint(0, 1000, (32, 100), device=device)

    def timed(fn: Any) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    def train() -> None:
        for _ in range(5):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    def generate() -> None:
        with torch.inference_mode():
            model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=64,
                min_new_tokens=64,
                do_sample=True,
                temperature=0.6,
                top_p=0.95,
            )

    timed(train), timed(generate)  # warm-up
    best: dict[bool, dict[str, float]] = {False: {}, True: {}}
    for _ in range(args.rounds):
        for deterministic in (False, True):
            torch.use_deterministic_algorithms(deterministic, warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = False
            for name, fn in (("5 training steps", train), ("generate 32 x 64", generate)):
                seconds = timed(fn)
                best[deterministic][name] = min(best[deterministic].get(name, seconds), seconds)
    print(f"{device}, best of {args.rounds} rounds (s):")
    for name in best[False]:
        off, on = best[False][name], best[True][name]
        print(f"  {name}: default {off:.3f}, deterministic {on:.3f} ({100 * (on / off - 1):+.0f}%)")


if __name__ == "__main__":
    main()
