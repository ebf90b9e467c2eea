"""What the policy's training passes cost padded, trimmed and packed, on one device.

A Qwen3-shaped model built from a config (random weights, float32 master copy under bf16
autocast as the paper preset trains, gradient checkpointing, TRL's fused head) runs the loss's
forward and backward over the same generation batch of verl's shape (prompts of 100-200 tokens,
responses geometric with a mean of ~200 tokens, capped at 1,024) three ways, each through the
code the trainer runs:

- `padded`: TRL 1.16's layout, the whole generation batch padded to its longest prompt and
  completion, cut into micro-batches in order;
- `trimmed`: `cobalt.training.machinery.padding` (rows of one optimizer step sorted by length, each
  micro-batch cut to its own longest: `training.trim_padding`, on in the paper preset);
- `packed`: `cobalt.training.machinery.packing` (each micro-batch's sequences end to end in one row:
  `training.packing`), PyTorch's varlen attention; `packed-sdpa`: the same, attention by SDPA one
  sequence at a time; `shared`: packed with each prompt computed once for its samples
  (`training.share_prompts`; `--samples` rows share a prompt, 5 as in verl's run).

`--profile`: one more pass of each path under torch.profiler, its top operators by device time
printed and kept in the JSON (where the packed path's time goes).

Reports per path the forward + backward time of the batch, the real tokens a second, the peak
memory, and against `padded`: the largest log-probability difference and the relative gradient
difference of a few weight matrices (bf16 kernels differ in their summation order: a few 1e-3 is
rounding, a logic error is O(1)).

    python scripts/gpu/packing_cost.py --json out.json                    # 8B shape on GPU 0
    python scripts/gpu/packing_cost.py --hidden 64 --layers 2 --heads 4 --vocab 512 --rows 8 \\
        --micro-batch 4 --response-cap 48 --prompt-max 24  # CPU: the code runs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cobalt.training.machinery import packing  # noqa: E402
from cobalt.training.machinery.packing import (  # noqa: E402
    pack_shared,
    packed_logps,
    use_packed_attention,
)
from cobalt.training.machinery.padding import optimizer_windows, trimmed_logps  # noqa: E402

PATHS = ("padded", "trimmed", "packed", "packed-sdpa", "shared")


def build(
    args: argparse.Namespace, device: torch.device, layers: int | None = None, positions: int = 4096
) -> Any:
    """The Qwen3-shaped model of `args` (`layers` over args.layers), float32, gradient
    checkpointing, TRL's fused head."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    from trl.trainer.utils import add_fused_lm_head

    config = Qwen3Config(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=layers or args.layers,
        num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 4),
        head_dim=args.hidden // args.heads, intermediate_size=args.hidden * 3,
        max_position_embeddings=positions, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="sdpa"
        )
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.config.use_cache = False
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    return model.train()


def batch(args: argparse.Namespace, device: torch.device) -> dict[str, torch.Tensor]:
    """TRL's generation batch: left-padded prompts, right-padded completions, at full width."""
    generator = torch.Generator().manual_seed(1)
    groups = args.rows // args.samples  # TRL's buffer: a prompt's samples in a row
    prompts = torch.randint(args.prompt_min, args.prompt_max + 1, (groups,), generator=generator)
    prompts = prompts.repeat_interleave(args.samples)
    # a constant chance of ending at each token: geometric lengths (the calibrated model's)
    uniform = torch.rand(args.rows, generator=generator)
    responses = 1 + torch.floor(
        torch.log(uniform) / torch.log(torch.tensor(1 - 1 / args.response_mean))
    )
    responses = responses.clamp(1, args.response_cap).long()
    width_p, width_c = int(prompts.max()), int(responses.max())
    ids = torch.randint(5, args.vocab, (args.rows, width_p + width_c), generator=generator)
    ids[:, :width_p] = ids[:: args.samples, :width_p].repeat_interleave(args.samples, 0)
    mask = torch.zeros_like(ids)
    for r in range(args.rows):
        mask[r, width_p - int(prompts[r]) : width_p + int(responses[r])] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "completion_mask": mask[:, width_p:].to(device),
        "row": torch.arange(args.rows, device=device),
        "prompt_ids": ids[:, :width_p].to(device),
        "prompt_mask": mask[:, :width_p].to(device),
        "keep": torch.tensor(width_c),
    }


def padded_forward(
    model: Any, ids: Any, mask: Any, keep: int, batch_size=None, compute_entropy=False
):
    """TRL 1.16's `_get_per_token_logps_and_entropies` for one chunk (text only)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    entropy = out.entropy[:, -keep:] if compute_entropy else None
    return out.log_probs[:, -keep:], entropy, None


def computed_tokens(path: str, micro: list[dict[str, Any]], keep: int) -> int:
    """The token positions the path's forwards compute (padding included)."""
    total = 0
    for part in micro:
        mask = part["attention_mask"]
        if path.startswith("packed"):
            total += int(mask.sum())
        elif path == "shared":
            total += pack_shared(part["input_ids"], mask, keep)["ids"].size(1)
        elif path == "padded":
            total += mask.numel()
        else:  # trimmed: each chunk cut to its own longest prompt and completion
            positions = torch.arange(1, keep + 1, device=mask.device)
            longest = int((mask[:, -keep:] * positions).max())
            padding = int((mask[:, :-keep].cumsum(1) == 0).sum(1).min())
            total += mask.size(0) * (mask.size(1) - keep - padding + longest)
    return total


def run(path: str, model: Any, micro: list[dict[str, Any]], keep: int, device: torch.device):
    """Forward and backward of every micro-batch; the time, the log-probs, a few gradients."""
    total = sum(int(m["completion_mask"].sum()) for m in micro)
    model.zero_grad(set_to_none=True)
    logps: list[tuple[torch.Tensor, torch.Tensor]] = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    for part in micro:
        ids, mask = part["input_ids"], part["attention_mask"]
        real = part["completion_mask"].bool()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            if path == "padded":
                out, _, _ = padded_forward(model, ids, mask, keep)
            elif path == "trimmed":
                out, _ = trimmed_logps(
                    lambda i, m, k, **more: padded_forward(model, i, m, k, **more), ids, mask, keep
                )
            else:  # packed: PyTorch's varlen kernel; packed-sdpa: SDPA a sequence at a time
                packing.KERNEL = "sdpa" if path == "packed-sdpa" else "varlen"
                use_packed_attention(model)
                out, _ = packed_logps(model, ids, mask, keep, share_prompts=path == "shared")
        # normalised over the whole batch (dapo's way): the gradient does not depend on which
        # rows share a micro-batch, so every path's is comparable
        (-(out * real).sum() / total).backward()
        logps.append((part["row"], out.detach().float() * real))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    named = dict(model.named_parameters())
    watched = [
        n for n in named if n.endswith(("layers.0.self_attn.q_proj.weight", "mlp.down_proj.weight"))
    ]
    watched = watched[:1] + watched[-1:] + ["lm_head.weight"]
    grads = {n: named[n].grad.detach().float().clone() for n in watched}
    rows = torch.cat([r for r, _ in logps])
    by_row = torch.empty_like(torch.cat([x for _, x in logps]))
    by_row[rows] = torch.cat([x for _, x in logps])
    return seconds, peak, by_row, grads


def profile(
    path: str, model: Any, micro: list[dict[str, Any]], keep: int, device: torch.device
) -> str:
    """One more pass of `path` under torch.profiler: its top operators by device time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profiler(activities=activities) as prof:
        run(path, model, micro, keep, device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=15)
    print(f"[{path}]\n{table}", flush=True)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arg = parser.add_argument
    arg("--hidden", type=int, default=4096)
    arg("--layers", type=int, default=36)
    arg("--heads", type=int, default=32)
    arg("--vocab", type=int, default=151936)
    arg("--rows", type=int, default=80, help="the process's generation batch (rows)")
    arg("--samples", type=int, default=5, help="samples of one prompt (rows in a row share it)")
    arg("--micro-batch", type=int, default=16)
    arg("--windows", type=int, default=1, help="optimizer steps of the generation batch")
    arg("--prompt-min", type=int, default=100)
    arg("--prompt-max", type=int, default=200)
    arg("--response-mean", type=float, default=200.0)
    arg("--response-cap", type=int, default=1024)
    arg("--repeats", type=int, default=2, help="timed passes per path (after one warm-up)")
    arg("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    arg("--profile", action="store_true", help="+ each path's top GPU kernels (torch.profiler)")
    arg("--json", type=Path)
    args = parser.parse_args(argv)
    if args.rows % args.samples or args.rows % args.micro_batch:
        parser.error("--rows must be a multiple of --samples and of --micro-batch")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(args, device)
    full = batch(args, device)
    keep = int(full.pop("keep"))
    micro_batches = args.rows // args.micro_batch
    tokens = int(full["attention_mask"].sum())
    results: list[dict[str, Any]] = []
    reference: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None
    profiles: dict[str, str] = {}
    for path in args.paths:
        micro = optimizer_windows(
            full, micro_batches=micro_batches, windows=args.windows, offset=0,
            by_length=path != "padded", by_prompt=path == "shared",
        )  # fmt: skip
        if device.type == "cuda":  # each path from an empty cache: no order effect
            torch.cuda.empty_cache()
            retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        times = []
        for _ in range(args.repeats + 1):
            seconds, peak, logps, grads = run(path, model, micro, keep, device)
            times.append(seconds)
        if device.type == "cuda":  # cudaMalloc retries: the allocator freed its cache to fit
            retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
        if args.profile:
            profiles[path] = profile(path, model, micro, keep, device)
        row: dict[str, Any] = {
            "path": path, "seconds": round(min(times[1:]), 4),
            "tokens_per_s": round(tokens / min(times[1:])), "peak_gib": peak and round(peak, 2),
                "computed_tokens": computed_tokens(path, micro, keep),
            "seconds_each": [round(t, 4) for t in times],
            "alloc_retries": retries if device.type == "cuda" else None,
        }  # fmt: skip
        if reference is None:
            reference = (logps, grads)
        else:
            ref_logps, ref_grads = reference
            row["logp_max_abs_diff"] = float((logps - ref_logps).abs().max())
            row["logp_mean_abs_diff"] = float(
                (logps - ref_logps).abs().sum() / full["completion_mask"].sum()
            )
            row["grad_rel_diff"] = {
                n: round(float((g - ref_grads[n]).norm() / ref_grads[n].norm()), 6)
                for n, g in grads.items()
            }
        results.append(row)
        print(json.dumps(row), flush=True)
    packing.KERNEL = "varlen"  # the module's default again
    base = results[0]["seconds"]
    for row in results:
        row["speedup_vs_" + results[0]["path"]] = round(base / row["seconds"], 3)
    report = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "settings": vars(args) | {"json": str(args.json)},
        "real_tokens": tokens,
        "results": results,
        "profiles": profiles,
    }
    print(json.dumps({r["path"]: r["speedup_vs_" + results[0]["path"]] for r in results}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
