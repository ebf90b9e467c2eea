"""Does it learn? The controlled learning check: several seeds of each training mode on one GPU.

    python -m experiments.learning_check --out DIR                          # seeds 0,1,2 at once
    python -m experiments.learning_check --out DIR --seeds 3,4 --repeat 0   # more seeds, seed 0
    again python -m experiments.learning_check --aggregate DIR1 DIR2 --out DIR    # one verdict from
    both python -m experiments.learning_check --smoke --out DIR --seeds 0,1 --parallel 2   # CPU,
    same path

Per seed, one process (`seed_run`), built from the repo's own pieces:

1. SFT: `cobalt.reference.fit_tiny_model` (a ~25M-parameter Qwen2-shaped model, a BPE vocabulary
   trained locally) on 28 of the 52 kinds of `cobalt.data.synthetic.ALL_KINDS`, no system prompt.
   12 *RL kinds* and 12 *never-seen kinds* are held out of SFT (`kinds`).
2. Reference trajectories of the SFT model on RL-kind problems (`collect_initial` +
   `collect_multiturn`, the namespace sandbox), evaluated per turn; the Cobalt bandit rows
   (`cobalt.bandit.selection`) and the offline rows (`cobalt.training.method.offline_rows`) from
   them.
3. Modes, each from the same SFT model at the same data budget: GRPO `single_turn` and `cobalt`
   (TRL, reward from the tests only, float32), `offline` (the logged turns, no generation),
   `cobalt_bf16` (cobalt under bf16 autocast; a non-finite step is recorded, not fatal); cost
   per mode (`cobalt.training.reporting.cost.CostMeter`).
4. Evaluation of the SFT model and of every trained model on the same fresh problems of the
   three groups, turns 0..2, under METHOD §1.2 and stop-on-public-pass, with repair transitions.

The parent runs `--parallel` seed processes at once and then aggregates its output directory;
`--aggregate` merges several (`aggregate`: 95% intervals over seeds and problems, paired
differences with a verdict; `report`: REPORT.md, plots).
docs/LEARNING.md has the design, the budget and the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from experiments.learning_check.config import build_parser, from_json, resolve  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    if args.child:  # one seed, started by the parent below
        from experiments.learning_check.seed_run import run_seed

        child = from_json(json.loads(args.child.read_text()))
        child.seed, child.label, child.deadline_at = args.seed, args.label, args.deadline_at
        child.out = args.out
        return run_seed(child)

    from cobalt.errors import UserError
    from experiments.learning_check.report import aggregate_dirs

    try:
        if args.aggregate:
            print(aggregate_dirs(list(args.aggregate), args.out))
            return 0
        return run(resolve(args))
    except UserError as exc:  # a broken seed result: one line, the file and the field
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """The seeds of `args` as processes, then the aggregate of their output directory."""
    from experiments.learning_check.parallel import run_seeds
    from experiments.learning_check.report import aggregate_dirs

    started = time.perf_counter()
    done = run_seeds(args)
    if not any(r["status"] in ("done", "killed") for r in done.values()):
        print(f"no seed finished: {done}; logs in {args.out / 'logs'}", file=sys.stderr)
        return 1
    print(aggregate_dirs([args.out], args.out))
    print(f"learning check: {len(done)} runs, {time.perf_counter() - started:.0f} s; {args.out}")
    return 0 if all(r["status"] == "done" for r in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
