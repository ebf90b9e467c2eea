"""Training on 2, 4 and 8 nodes, projected from one node's measured step: an estimate,
not a measurement.

    python -m benchmarks.nodes_projection benchmarks/results/verl_shape_after_gpu_plan_4xh200_2026-11-27.json

From a step report of `benchmarks/grpo_step_report.py` (one node: its GPUs, the median step's
split, the micro-batch plan, the model's parameters) and the bytes FSDP moves, for each node
count and link (400 Gb/s InfiniBand, 100 Gb/s Ethernet, one link a node at `--efficiency` of its
rate), the step time and tokens/s/GPU of:

- `full`: FSDP full shard over every GPU of every node. Per micro-batch a process gathers the
  bf16 weights twice (forward; backward, as the weights are freed after the forward); the fp32
  gradients are reduce-scattered once a step (accelerate holds FSDP2's gradient sync back on the
  micro-batches before the last of an optimizer step: `Accelerator.no_sync`), or once every
  micro-batch where the memory plan reduced every micro-batch (`reduce_every_micro_batch`:
  whole gradients did not fit, training.gradient_sync); of each collective
  a node receives and sends (n-1)/n of its size across its link. Counted without overlap with
  compute (an upper bound on the step). The reference model's and the weight sync's gathers are
  not in this model of the bytes (`--measured` has them).
- `hybrid`: shard within a node, replicate across nodes (HSDP): only the fp32 gradients cross
  the links, one all-reduce a step, 2 (n-1)/n of their size a node.

`--measured` takes `full`'s bytes from the report instead: what each process put through
collectives a step (a stage run with torch's flight recorder on, `TORCH_FR_BUFFER_SIZE`), of
which (n-1)/n crosses a node's link: every gather, reduce and the weight sync's gathers as they
ran, where the formula above is a model of them.

Two ways to use the nodes: `strong` keeps the measured step's prompts (each GPU's share of the
optimisation shrinks by n; generation does not: its time is set by the longest response, the
measured split's generation is already near that floor, and the weight sync stays); `weak` gives
every node the measured node's prompts (n times the step's prompts; the same work a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LINKS = {"400 Gb/s InfiniBand": 400e9 / 8, "100 Gb/s Ethernet": 100e9 / 8}


def formula_bytes(report: dict) -> float:
    """`full`'s modelled collective bytes a process a step (see the module docstring)."""
    params = report["model_parameters"]
    plan = report["memory_plan"]
    micro_batches = plan["gradient_accumulation_steps"]
    reduces = micro_batches if plan.get("reduce_every_micro_batch") else 1
    return micro_batches * 2 * params * 2 + reduces * params * 4  # two bf16 gathers each


def measured_bytes(report: dict) -> float:
    """The collective bytes a process a step the report measured; ValueError without them."""
    gb = report["median_after_step_1"].get("collective_gb_per_process")
    if gb is None:
        raise ValueError(
            f"{report.get('stage', 'the report')} has no measured collectives: train the stage "
            "with TORCH_FR_BUFFER_SIZE=20000 set (torch's flight recorder), or leave out --measured"
        )
    return gb * 1e9


def project(
    report: dict, nodes: int, link_bytes_s: float, sharding: str, scaling: str,
    measured: bool = False,
) -> dict:  # fmt: skip
    """The projected step (seconds, its communication part) and tokens/s/GPU on `nodes` nodes
    like the measured one; `measured`: full sharding's bytes as the report measured them."""
    step = report["median_after_step_1"]
    gpus = report["gpus"]
    params = report["model_parameters"]
    tokens = step["prompt_mean_tokens"] + step["response_mean_tokens"]
    completions = report["steps"][-1]["completions"]
    share = (nodes - 1) / nodes
    if sharding == "full":
        crossing = (measured_bytes(report) if measured else formula_bytes(report)) * share
    else:
        crossing = 2 * params * 4 * share  # one fp32 all-reduce of the gradients
    comm_s = crossing / link_bytes_s
    shrink = nodes if scaling == "strong" else 1
    step_s = (
        step["generation_s"]
        + step["reward_s"] / shrink
        + step["weight_sync_s"]
        + step["optimisation_s"] / shrink
        + comm_s
    )
    step_completions = completions * (1 if scaling == "strong" else nodes)
    return {
        "step_s": step_s,
        "comm_s": comm_s,
        "tokens_per_s_per_gpu": step_completions * tokens / (step_s * gpus * nodes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.nodes_projection",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("report", type=Path, help="a grpo_step_report JSON of one node")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--efficiency", type=float, default=0.8, help="of a link's rate")
    parser.add_argument(
        "--measured", action="store_true",
        help="full sharding's bytes as the report measured them (torch's flight recorder)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    if args.measured:
        try:
            measured = measured_bytes(report)
        except ValueError as exc:
            parser.error(str(exc))
        print(f"full sharding a process a step: {measured / 1e9:.1f} GB measured, "
              f"{formula_bytes(report) / 1e9:.1f} GB modelled")  # fmt: skip
    rows = []
    for scaling in ("strong", "weak"):
        for sharding in ("full", "hybrid"):
            for link, rate in LINKS.items():
                for n in args.nodes:
                    p = project(report, n, rate * args.efficiency, sharding, scaling, args.measured)
                    rows.append({"scaling": scaling, "sharding": sharding, "link": link,
                                 "nodes": n, **{k: round(v, 1) for k, v in p.items()}})  # fmt: skip
    from cobalt.tables import markdown_table

    print(markdown_table(rows))
    if args.json:
        found = {"report": str(args.report), "measured": args.measured, "rows": rows}
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
