"""What one training stage's GRPO steps cost on a multi-GPU machine, read from the
stage's own outputs: per step the time split (generation, rewards, weight sync into vLLM,
optimisation), tokens and their mean prompt and response lengths, tokens/s/GPU counted as verl
counts it ((prompt + response tokens) / (step time x GPUs)), the training phase's model FLOPs
utilisation, and each GPU's peak memory (an nvidia-smi trace of every card). With --anchor it
prints the ratio to a published figure in the same unit.

    python -m benchmarks.grpo_step_report RUN/training/KEY --trace mem.csv --gpus 4 \\
        --anchor 1544 --anchor-name "verl GRPO Qwen2-7B, 8x H100" --json out.json

MFU: model FLOPs of the optimisation phase / (its seconds x training GPUs x --peak-tflops; a
vLLM server's GPUs (--vllm-server-gpus) count in tokens/s/GPU, not here): per token the
policy's forward and backward (6 x parameters; LoRA: 4 x, no weight gradients), the reference
model's forward (2 x parameters, when the KL term is on and training is full), and causal
attention (4 x layers x hidden x mean length / 2 per pass, 3 passes for the policy, 1 for the
reference); gradient checkpointing's recomputation is not model work and is not counted.
Step 1 pays one-time costs (vLLM's first wake-up, lazy allocations): the medians are over the
steps after it when there are more than one; for a one-step-off run (`--async`) not over its
last step either, which trains with no batch sampled beside it. A stage trained under torch's flight
recorder (`TORCH_FR_BUFFER_SIZE=20000`, `cobalt.training.machinery.collectives`) also gives the GB
each process put through collectives a step, in total and by collective.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from cobalt.training.reporting.phases import split_balance

H100_BF16_TFLOPS = 989.0  # dense bf16 peak of an H100 / H200 SXM


def parameters(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(parameters, layers, hidden, vocab) of a decoder config.json."""
    h, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    head = int(config.get("head_dim") or h // heads)
    inter = int(config.get("intermediate_size") or 4 * h)
    vocab = int(config["vocab_size"])
    tied = bool(config.get("tie_word_embeddings", False))
    per_layer = h * head * (heads + 2 * kv) + heads * head * h + 3 * h * inter + 2 * h
    return layers * per_layer + vocab * h * (1 if tied else 2) + h, layers, h, vocab


def step_flops(
    config: dict[str, Any], tokens: int, sequences: int, *, lora: bool, reference: bool
) -> float:
    """Model FLOPs of one step's optimisation phase (module docstring)."""
    n, layers, h, _ = parameters(config)
    length = tokens / max(1, sequences)
    attention = 4 * layers * h * length / 2
    policy = (4 if lora else 6) * n + 3 * attention
    ref = 2 * n + attention if reference else 0
    return (policy + ref) * tokens


def gpu_peaks(trace: Path) -> dict[str, float]:
    """Peak used memory (GiB) of each GPU in an nvidia-smi CSV (index, timestamp, MiB)."""
    peaks: dict[str, float] = defaultdict(float)
    with trace.open() as f:
        for row in csv.reader(f):
            if len(row) < 3:
                continue
            try:
                index, used = row[0].strip(), float(row[-1])
            except ValueError:
                continue
            peaks[index] = max(peaks[index], used / 1024)
    return {k: round(v, 1) for k, v in sorted(peaks.items())}


def report(stage: Path, gpus: int, peak_tflops: float, trace: Path | None) -> dict[str, Any]:
    manifest = json.loads((stage / "MANIFEST.json").read_text())
    stats, spec = manifest["stats"], manifest["spec"]
    config = spec["config"]
    history = json.loads((stage / "log_history.json").read_text())
    steps = [h for h in history if "loss" in h]
    timing = stats["timing"]
    model = json.loads((stage / "config.json").read_text())
    overrides = config.get("overrides") or {}
    generations = int(overrides.get("num_generations", 16 if config["preset"] == "paper" else 2))
    completions = int(overrides.get("generation_batch_size") or 0) or None
    lora = config.get("lora") is not None
    reference = not lora and float(overrides.get("beta", 1e-4)) != 0
    cumulative = [int(h["num_tokens"]) for h in steps]
    tokens = [b - a for a, b in zip([0, *cumulative[:-1]], cumulative, strict=True)]
    # the GPUs that train, on every node (the plan's processes; the stage's own `processes`
    # are its node's): all of them, unless a vLLM server of the run's had some of them
    world = (stats.get("plan") or {}).get("processes") or stats.get("processes") or gpus
    trainers = min(gpus, int(world))
    rows = []
    for i, h in enumerate(steps):
        total = timing["step_s"][i]
        n = completions or 1
        response = float(h.get("completions/mean_length") or 0)
        prompt = tokens[i] / n - response if completions else None
        optimisation = timing["optimisation_step_s"][i]
        flops = step_flops(model, tokens[i], n, lora=lora, reference=reference)
        rows.append(
            {
                "step": h["step"],
                "loss": h["loss"],  # the same rows on another layout: the same loss
                "reward": h.get("reward"),
                "step_s": round(total, 1),
                "generation_s": round(timing["generation_step_s"][i], 1),
                "reward_s": round(timing["reward_step_s"][i], 1),
                "weight_sync_s": round(timing["weight_sync_step_s"][i], 1),
                "optimisation_s": round(optimisation, 1),
                "tokens": tokens[i],
                "completions": completions,
                "prompt_mean_tokens": round(prompt, 1) if prompt is not None else None,
                "response_mean_tokens": round(response, 1),
                "tokens_per_s_per_gpu": round(tokens[i] / (total * gpus), 1),
                "mfu_training_phase": round(
                    flops / (optimisation * trainers * peak_tflops * 1e12), 3
                )
                if optimisation
                else None,
                "collective_gb_per_process": (timing.get("collective_gb_step") or [None] * (i + 1))[
                    i
                ],
            }
        )
    settled = rows[1:] if len(rows) > 1 else rows
    if stats.get("overlap") and len(settled) > 1:
        settled = settled[:-1]  # one step off: the run's last step trains with nothing beside it

    def median(key: str) -> float | None:
        values = [r[key] for r in settled if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "stage": str(stage),
        "gpus": gpus,
        "mode": config["mode"],
        "preset": config["preset"],
        "sharding": config.get("sharding"),
        "lora": lora,
        "num_generations": generations,
        "model_parameters": parameters(model)[0],
        "steps": rows,
        "median_after_step_1": {
            k: median(k)
            for k in (
                "step_s",
                "generation_s",
                "reward_s",
                "weight_sync_s",
                "optimisation_s",
                "tokens_per_s_per_gpu",
                "mfu_training_phase",
                "prompt_mean_tokens",
                "response_mean_tokens",
                "collective_gb_per_process",
            )
        },
        "collective_gb_per_process_by_op": {
            op: round(statistics.median(gb[1:] if len(gb) > 1 else gb), 3)
            for op, gb in (timing.get("collective_gb_step_by_op") or {}).items()
        }
        or None,
        "gpu_peak_used_gib": gpu_peaks(trace) if trace else None,
        "trainer_peaks_by_process_gib": stats.get("gpu_peaks_by_process_gib"),
        "memory_plan": stats.get("memory_plan"),
        "numerics": stats.get("numerics"),
        "overlap": stats.get("overlap"),  # --async: batches served from the background
        # a synchronous run on every GPU: the split of its GPUs that balances its phases
        "split_balance": None
        if stats.get("overlap") or trainers < gpus
        else split_balance(median("generation_s") or 0, median("optimisation_s") or 0, gpus),
        "cost": stats.get("cost"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.grpo_step_report",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arg = parser.add_argument
    arg("stage", type=Path, help="a finished training stage: <storage>/training/<key>")
    arg("--gpus", type=int, required=True)
    arg("--trace", type=Path, help="nvidia-smi --query-gpu=index,timestamp,memory.used CSV")
    arg("--peak-tflops", type=float, default=H100_BF16_TFLOPS)
    arg("--anchor", type=float, help="a published tokens/s/GPU to compare with")
    arg("--anchor-name", default="", help="what the anchor is")
    arg("--json", type=Path)
    args = parser.parse_args(argv)
    found = report(args.stage, args.gpus, args.peak_tflops, args.trace)
    if args.anchor:
        ours = found["median_after_step_1"]["tokens_per_s_per_gpu"]
        found["anchor"] = {
            "name": args.anchor_name,
            "tokens_per_s_per_gpu": args.anchor,
            "ratio": round(ours / args.anchor, 3) if ours else None,
        }
    text = json.dumps(found, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    m = found["median_after_step_1"]
    line = (
        f"{m['step_s']} s a step: generation {m['generation_s']}, rewards {m['reward_s']}, weight "
        f"sync {m['weight_sync_s']}, optimisation {m['optimisation_s']}; "
        f"{m['tokens_per_s_per_gpu']} tokens/s/GPU (prompt {m['prompt_mean_tokens']}, response "
        f"{m['response_mean_tokens']} tokens); MFU of the training phase {m['mfu_training_phase']}"
    )
    if args.anchor:
        line += f"; {found['anchor']['ratio']}x {args.anchor_name} ({args.anchor})"
    if m["collective_gb_per_process"] is not None:
        line += f"; collectives {m['collective_gb_per_process']} GB a process a step"
    if found["split_balance"]:
        b = found["split_balance"]
        line += (
            f"; balanced split at these rates: --gpus {b['training_gpus']} --vllm-server-gpus "
            f"{b['vllm_server_gpus']} --async (generation ~{b['generation_s']} s beside "
            f"optimisation ~{b['optimisation_s']} s)"
        )
    print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
