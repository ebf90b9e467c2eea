"""What keyed sampling costs: a decoding step of the transformers engine's padded path with
`engines.keyed_sampling` (Gumbel noise hashed from each row's key, greedy `generate` over it)
against transformers' own sampler (`do_sample=True`, one torch stream), same model, same prompts,
same number of steps (end of turn suppressed), alternating rounds, best round of each.

    python -m benchmarks.keyed_sampling                      # the embedded model's shape (CPU)
    python -m benchmarks.keyed_sampling --vocab 151936 --hidden 1024 --layers 8   # Qwen's vocab

The model is a Qwen2-shaped one with random weights built from its config (no tokenizer: the
prompts are random token ids). Imports torch, transformers and engines/keyed_sampling.py alone,
loaded by its path, so it runs on the GPU machine's bare image.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _keyed_sampling():
    """engines/keyed_sampling.py without the engines package (whose __init__ needs pydantic)."""
    spec = importlib.util.spec_from_file_location(
        "keyed_sampling", ROOT / "engines" / "keyed_sampling.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.keyed_sampling", description=__doc__
    )
    arg = parser.add_argument
    arg("--rows", type=int, default=64, help="rows per generate call (conversations x n)")
    arg("--prompt", type=int, default=320, help="prompt tokens")
    arg("--steps", type=int, default=64, help="new tokens per row")
    arg("--vocab", type=int, default=1024)
    arg("--hidden", type=int, default=128)
    arg("--layers", type=int, default=4)
    arg("--rounds", type=int, default=5)
    arg("--threads", type=int, default=2, help="torch threads (CPU)")
    arg("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessorList, Qwen2Config

    keyed_sampling = _keyed_sampling()
    KeyedSampler, row_keys = keyed_sampling.KeyedSampler, keyed_sampling.row_keys

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(2, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128),
        intermediate_size=2 * args.hidden,
        max_position_embeddings=4096,
    )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    vocab = model.config.vocab_size
    prompt = torch.randint(0, min(vocab, 1000), (args.rows, args.prompt), device=device)
    common = {
        "input_ids": prompt,
        "attention_mask": torch.ones_like(prompt),
        "max_new_tokens": args.steps,
        "min_new_tokens": args.steps,  # the same number of steps for both
        "pad_token_id": 0,
    }
    keys = [k for row in row_keys(0, [[i] for i in range(args.rows)], 1) for k in row]

    def torch_sampler() -> None:
        model.generate(**common, do_sample=True, temperature=0.6, top_p=0.95, top_k=None)

    def keyed() -> None:
        sampler = KeyedSampler(keys, args.prompt, 0.6, 0.95)
        model.generate(
            **common,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            logits_processor=LogitsProcessorList([sampler]),
        )

    def timed(fn) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    timed(torch_sampler), timed(keyed)  # warm-up
    best = {"torch": float("inf"), "keyed": float("inf")}
    for _ in range(args.rounds):
        best["torch"] = min(best["torch"], timed(torch_sampler))
        best["keyed"] = min(best["keyed"], timed(keyed))
    ms = {k: round(1000 * v / args.steps, 3) for k, v in best.items()}
    figures = {
        "date": date.today().isoformat(),
        "machine": torch.cuda.get_device_name()
        if device == "cuda"
        else platform.processor() or platform.machine(),
        "device": device,
        "threads": args.threads,
        "shape": {k: getattr(args, k) for k in ("rows", "prompt", "steps", "hidden", "layers")}
        | {"vocab": vocab},
        "ms_per_step": ms,
        "keyed_over_torch": round(best["keyed"] / best["torch"], 3),
    }
    print(
        f"{device}, {args.rows} rows x {args.prompt}-token prompts, vocab {vocab}: a decoding step "
        f"{ms['torch']} ms with transformers' sampler, {ms['keyed']} ms keyed "
        f"(keyed / torch = {figures['keyed_over_torch']})"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
