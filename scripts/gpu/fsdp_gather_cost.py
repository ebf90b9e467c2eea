"""What gathering the float32 master weights costs FSDP2 under bf16 autocast, against gathering
them in bf16 (accelerate's own policy for `--mixed_precision bf16`), on the GPUs of this machine
(`cobalt.training.machinery.precision.set_distributed_numerics` gathers float32 so that N GPUs
compute what one computes).

Each policy trains the same micro-batches of a Qwen3-shaped model built from a config (random
weights, float32 master copy, one `fully_shard` per decoder layer and one at the root, gradient
checkpointing as the paper preset has) and reports the forward + backward time a micro-batch,
the peak memory a GPU above what was allocated before the model was built (over the run, and
over the first forward), and the loss and gradient norm of the first micro-batch. Three policies:

- `bf16-gather`: param_dtype bf16 (the whole forward in bf16 weights: not what one GPU computes);
- `fp32-gather`: no param dtype, the autocast's weight cache on (what the trainers run);
- `fp32-gather-nocache`: the same with torch.autocast(cache_enabled=False): if the autocast cache
  kept every gathered layer's bf16 copy alive until the forward ends, its peak would be lower by
  about the model's size in bf16;
- `as-one-process`: `cobalt.training.machinery.precision.shard_as_one_process` (what `--fsdp-gather
  bf16-linear` runs): each linear layer but the head its own unit, cast to bf16 before the
  gather, the embeddings, norms and head gathered in float32 with the layers and the root, the
  cache off; the same loss and gradient as `fp32-gather-nocache`, bit for bit.

    torchrun --nproc_per_node 2 scripts/gpu/fsdp_gather_cost.py --json out.json
    torchrun --nproc_per_node 2 scripts/gpu/fsdp_gather_cost.py --hidden 256 --layers 2 \
        --vocab 1024 --tokens 64   # CPU processes (gloo): the code runs; no memory figures
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

POLICIES = ("bf16-gather", "fp32-gather", "fp32-gather-nocache", "as-one-process")


def build(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 4),
        head_dim=args.hidden // args.heads, intermediate_size=args.hidden * 3,
        max_position_embeddings=args.tokens, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with device:  # drawn where it runs: an 8B shape's random init on the CPU takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.config.use_cache = False
    return model.train()  # checkpointing applies in training mode only


def shard(model: torch.nn.Module, policy: str) -> None:
    from types import SimpleNamespace

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    gather = torch.bfloat16 if policy == "bf16-gather" else None
    mp = MixedPrecisionPolicy(param_dtype=gather, reduce_dtype=torch.float32)
    if policy == "as-one-process":  # the module alone: a bare torch image lacks cobalt's needs
        import importlib.util

        path = Path(__file__).resolve().parents[2] / "cobalt" / "training" / "precision.py"
        spec = importlib.util.spec_from_file_location("precision", path)
        precision = importlib.util.module_from_spec(spec)
        sys.modules["precision"] = precision  # its dataclasses look their module up
        spec.loader.exec_module(precision)
        shard_as_one_process = precision.shard_as_one_process

        plugin = SimpleNamespace(
            cpu_ram_efficient_loading=False, reshard_after_forward=True, mixed_precision_policy=mp
        )
        accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
        assert shard_as_one_process(model, accelerator, torch.float32) > 0
        mp = plugin.mixed_precision_policy
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def measure(args: argparse.Namespace, policy: str, device: torch.device) -> dict:
    gc.collect()  # FSDP's hooks hold the previous policy's model in reference cycles
    if device.type == "cuda":
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else None
    model = build(args, device)
    shard(model, policy)
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1 + rank)
    batches = [
        torch.randint(0, args.vocab, (args.micro_batch, args.tokens), generator=g).to(device)
        for _ in range(args.steps + args.warmup)
    ]
    cache = policy in ("bf16-gather", "fp32-gather")
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, first = [], None
    for i, ids in enumerate(batches):
        began = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache):
            loss = model(input_ids=ids, labels=ids).loss
        if gpu and i == 0:
            forward_peak = torch.cuda.max_memory_allocated() / 2**30
        loss.backward()
        if gpu:
            torch.cuda.synchronize()
        if i == 0:
            norm = torch.sqrt(
                sum((p.grad.full_tensor().float() ** 2).sum() for p in model.parameters())
            )
            first = {"loss": float(loss.detach()), "grad_norm": float(norm)}
        model.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - began)
    peak = round(torch.cuda.max_memory_allocated() / 2**30 - before, 2) if gpu else None
    forward = round(forward_peak - before, 2) if gpu else None
    del model, batches
    if gpu:
        torch.cuda.empty_cache()
    return {"policy": policy, "step_s": sorted(times)[len(times) // 2], "peak_gib": peak,
            "forward_peak_gib": forward, "left_before_gib": before and round(before, 2),
            **first}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens a sequence")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--policies", nargs="+", choices=POLICIES, default=list(POLICIES),
        help="the first is the baseline of time_vs_bf16_gather",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    local = int(os.environ["LOCAL_RANK"])
    if gpu:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    rows = [measure(args, policy, device) for policy in args.policies]
    if dist.get_rank() == 0:
        base = rows[0]["step_s"]
        for row in rows:
            row["time_vs_bf16_gather"] = round(row["step_s"] / base, 3)
            row["step_s"] = round(row["step_s"], 4)
        name = torch.cuda.get_device_name() if gpu else "cpu"
        result = {"processes": dist.get_world_size(), "device": name,
                  "shape": vars(args) | {"json": None, "policies": None}, "rows": rows}  # fmt: skip
        print(json.dumps(result, indent=1))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
