"""What one micro-batch of the policy's training pass allocates on a GPU, against the memory
plan's estimate of it (`cobalt.training.machinery.activations.sequence_bytes` and the fixed terms it
counts per row), at verl's and at the paper's lengths.

A Qwen3-shaped model of the 8B width built from a config with few decoder layers (random
weights, float32 master copy under bf16 autocast, gradient checkpointing, TRL's fused head: the
paper preset's full fine-tuning numerics; autocast's weight cache off, as the trainers run it:
`--autocast-cache` on), every row at full length. For each case: one pass to
allocate the gradients, then, with them kept (as between the micro-batches of a step), the peak
allocated above the resting weights and gradients during one more forward and backward. Two
micro-batch sizes of one length give the cost of a row (the slope) and of the pass (the rest);
two depths separate what a layer adds. `--shared`: every row of a micro-batch samples one prompt
and the pass is `--share-prompts`' (`cobalt.training.machinery.packing`, PyTorch's varlen
attention), against
`cobalt.training.machinery.activations.micro_batch_bytes` with the rows of one prompt counted
together.

    python scripts/gpu/memory_calibrate.py --json out.json            # GPU 0, ~2 minutes
    python scripts/gpu/memory_calibrate.py --shared --cases 9897:6144:1,2,4,8 --json shared.json
    python scripts/gpu/memory_calibrate.py --hidden 64 --heads 4 --vocab 512 --layers 2 \\
        --cases 8:16:1,2   # CPU: the code runs (no memory figures)
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
from cobalt.training.machinery.activations import micro_batch_bytes, sequence_bytes  # noqa: E402
from cobalt.training.machinery.memory import GIB  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from packing_cost import build, padded_forward  # noqa: E402


def one_pass(
    model: Any,
    rows: int,
    prompt: int,
    completion: int,
    device: torch.device,
    cache: bool,
    shared: bool = False,
) -> None:
    """The loss's forward and backward over `rows` full-length rows (TRL's fused head), under
    bf16 autocast with its weight cache on or (as the trainers run) off; `shared`: the rows
    sample one prompt, computed once (the packed layout of --share-prompts)."""
    ids = torch.randint(5, model.config.vocab_size, (rows, prompt + completion), device=device)
    mask = torch.ones_like(ids)
    with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache):
        if shared:
            ids[:, :prompt] = ids[0, :prompt].clone()
            out, _ = packing.packed_logps(model, ids, mask, completion, share_prompts=True)
        else:
            out, _, _ = padded_forward(model, ids, mask, completion)
    (-out.sum() / out.numel()).backward()


def measure(model: Any, device: torch.device, *case: Any) -> dict:
    """`one_pass(model, *case)` twice: the peak of the second above what rests between them."""
    pass_ = (model, *case)
    one_pass(*pass_)  # the gradients exist from here on
    model.zero_grad(set_to_none=False)
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    resting = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    one_pass(*pass_)
    torch.cuda.synchronize()
    return {
        "resting_gib": round(resting / GIB, 3),
        "pass_gib": round((torch.cuda.max_memory_allocated() - resting) / GIB, 3),
        "seconds": round(time.perf_counter() - began, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arg = parser.add_argument
    arg("--hidden", type=int, default=4096)
    arg("--heads", type=int, default=32)
    arg("--vocab", type=int, default=151936)
    arg("--layers", type=int, nargs="+", default=[4, 12], help="decoder layers of each model")
    arg(
        "--cases", nargs="+", default=["163:1024:1,4,16", "9897:6144:1,2"],
        help="PROMPT:COMPLETION:ROWS,ROWS,... (verl's longest row; the paper's)",
    )  # fmt: skip
    arg(
        "--autocast-cache", action="store_true",
        help="keep autocast's weight cache on (torch's default; the trainers turn it off)",
    )  # fmt: skip
    arg(
        "--shared", action="store_true",
        help="the rows of a micro-batch share one prompt, computed once (--share-prompts)",
    )  # fmt: skip
    arg("--json", type=Path)
    args = parser.parse_args(argv)
    cases = []
    for case in args.cases:
        prompt, completion, rows = case.split(":")
        cases.append((int(prompt), int(completion), [int(r) for r in rows.split(",")]))
    longest = max(p + c for p, c, _ in cases)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results: list[dict[str, Any]] = []
    for layers in args.layers:
        model = build(args, device, layers=layers, positions=max(4096, longest))
        if args.shared:
            packing.use_packed_attention(model)
        parameters = sum(p.numel() for p in model.parameters())
        for prompt, completion, sizes in cases:
            planned = sequence_bytes(
                model.config, prompt + completion, completion,
                compute_dtype="bfloat16", residual_dtype="float32",
            )  # fmt: skip
            for rows in sizes:
                if args.shared:  # the rows of one prompt together: group and step of `rows`
                    planned_rows = micro_batch_bytes(
                        model.config, rows, prompt, completion, compute_dtype="bfloat16",
                        residual_dtype="float32", group=max(2, rows), rows_per_step=max(2, rows),
                    )  # fmt: skip
                else:
                    planned_rows = rows * planned
                row = {
                    "layers": layers, "parameters": parameters, "prompt": prompt,
                    "completion": completion, "rows": rows, "shared": args.shared,
                    "planned_rows_gib": round(planned_rows / GIB, 3),
                    "planned_rows_bytes": planned_rows,
                    "planned_logsoftmax_gib": round(completion * args.vocab * 8 / GIB, 3),
                    **measure(
                        model, device, rows, prompt, completion, device, args.autocast_cache,
                        args.shared,
                    ),
                }  # fmt: skip
                results.append(row)
                print(json.dumps(row), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "settings": vars(args) | {"json": str(args.json)},
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
