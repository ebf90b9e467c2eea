"""Why GRPO under bf16 crashed (NaN/inf sampling probabilities; docs/RESULTS.md), and which
setting fixes it: the learning check's recipe (SFT model, reference trajectories, bandit rows)
per seed, then GRPO in several precision variants, each in its own process (a CUDA device-side
assert ends a process), all on one GPU at once.

    python -m experiments.learning_check.bf16_probe --out DIR            # GPU: 4 seeds x 4 variants
    python -m experiments.learning_check.bf16_probe --out DIR --smoke    # CPU: the code path

Each run trains with `cobalt.training.reporting.guards.NonFiniteGuard` (always on in `train`), so a
step with non-finite gradients is reported (step, parameters, last metrics) instead of corrupting
the weights; a run that still dies reports its exit status and the end of its output. Results:
DIR/bf16_probe.json and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (mode, GRPOConfig fields, TrainingConfig fields); bf16 = bf16 autocast over float32
    # weights, what TRL's bf16 flag did to these float32 models: precision `mixed`
    "float32": ("cobalt", {}, {"precision": "fp32"}),
    "bf16": ("cobalt", {}, {"precision": "mixed"}),
    "bf16_single_turn": ("single_turn", {}, {"precision": "mixed"}),
    "bf16_fp32_head": ("cobalt", {"cast_lm_head_to_fp32": True}, {"precision": "mixed"}),
    "bf16_no_cudnn": ("cobalt", {}, {"precision": "mixed", "cudnn_attention": False}),
    "bf16_single_turn_no_cudnn": (
        "single_turn",
        {},
        {"precision": "mixed", "cudnn_attention": False},
    ),
    "bf16_eager": ("cobalt", {}, {"precision": "mixed", "attn_implementation": "eager"}),
}


def check_args(seed: int, work: Path, smoke: bool, max_prompt: int) -> Any:
    from experiments.learning_check.config import SMOKE, build_parser

    argv = ["--out", str(work), "--seed", str(seed), "--max-prompt", str(max_prompt)]
    argv += ["--rl-steps", os.environ.get("BF16_PROBE_RL_STEPS", "40")]
    args = build_parser().parse_args(argv)
    if smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    args.device = "cuda" if _cuda() else "cpu"
    args.sandbox_concurrency = max(1, (os.cpu_count() or 2) // 4)
    return args


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def prepare(seed: int, work: Path, smoke: bool, max_prompt: int) -> dict[str, Any]:
    """SFT model, reference trajectories and bandit rows of one seed (rows.json)."""
    from cobalt.bandit.rows import prepare_rows
    from experiments.learning_check import stages, training
    from sandbox import SyncJudge

    args = check_args(seed, work, smoke, max_prompt)
    started = time.perf_counter()
    sft = work / "sft"
    stages.fit(args, sft, args.device)
    problems = stages.rl_problems(args)
    with SyncJudge(stages.sandbox_config(args)) as j:
        records, evals, _ = stages.rollout(sft, problems, args, j, work / "ref", args.n, seed)
    rows, stats = training.bandit_dataset(problems, records, evals, sft, seed)
    (work / "rows.json").write_text(json.dumps(prepare_rows(rows, "cobalt")))  # tests as JSON
    return {"seed": seed, "prepare_s": round(time.perf_counter() - started, 1), "bandit": stats}


def train_variant(seed: int, variant: str, work: Path, smoke: bool, max_prompt: int) -> dict:
    """One GRPO run (this process: the runner below starts it in its own)."""
    from cobalt.training.reporting.guards import NonFiniteError
    from experiments.learning_check import training

    args = check_args(seed, work, smoke, max_prompt)
    mode, extra, fields = VARIANTS[variant]
    rows = json.loads((work / "rows.json").read_text())
    started = time.perf_counter()
    try:
        result = training.train_mode(mode, rows, work / "sft", args, work / variant, extra, fields)
    except NonFiniteError as exc:
        return {"outcome": "non_finite", "error": str(exc), "wall_s": _since(started)}
    steps = [s["total"] for s in result["step_time_per_step"][2:]] or [0.0]
    curve = result["curve"]
    return {
        "outcome": "completed",
        "steps": result["steps"],
        "wall_s": _since(started),
        "step_s_median": round(statistics.median(steps), 4),
        "reward_first5": _mean([c.get("reward") for c in curve[:5]]),
        "reward_last5": _mean([c.get("reward") for c in curve[-5:]]),
    }


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 1)


def _mean(xs: list[Any]) -> float | None:
    xs = [x for x in xs if isinstance(x, int | float)]
    return round(sum(xs) / len(xs), 4) if xs else None


def run_child(command: str, seed: int, work: Path, args: argparse.Namespace, *extra: str) -> dict:
    """This script in a subprocess; its JSON result, or how it died."""
    result_file = work / f"{command}-{'-'.join(extra) or 'seed'}.json"
    cmd = [
        sys.executable,
        "-m",
        "experiments.learning_check.bf16_probe",
        "--child",
        command,
        "--seed",
        str(seed),
    ]
    cmd += ["--work", str(work), "--max-prompt", str(args.max_prompt), *extra]
    cmd += ["--result", str(result_file)] + (["--smoke"] if args.smoke else [])
    log = work / f"{command}-{'-'.join(extra) or 'seed'}.log"
    with log.open("wb") as sink:
        code = subprocess.call(cmd, stdout=sink, stderr=subprocess.STDOUT)
    if code == 0 and result_file.exists():
        return json.loads(result_file.read_text())
    tail = log.read_text(errors="replace")[-1500:]
    assertion = "device-side assert" in tail or "probability tensor contains" in tail
    return {"outcome": "crashed", "exit": code, "device_assert": assertion, "tail": tail}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.learning_check.bf16_probe", description=__doc__
    )
    arg = parser.add_argument
    arg("--out", type=Path, help="where bf16_probe.json goes")
    arg("--seeds", default="0,1,2,3")
    arg("--variants", default=",".join(VARIANTS))
    arg("--max-prompt", type=int, default=1536, help="the setting that crashed (docs/RESULTS.md)")
    arg("--parallel", type=int, default=4, help="runs at once on the GPU")
    arg("--rl-steps", type=int, default=40, help="GRPO steps per run")
    arg("--smoke", action="store_true")
    arg("--work", type=Path, help="(child) the seed's work directory")
    arg("--seed", type=int, help="(child)")
    arg("--child", choices=["prepare", "train"], help=argparse.SUPPRESS)
    arg("--variant", help=argparse.SUPPRESS)
    arg("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "prepare":
        args.result.write_text(
            json.dumps(prepare(args.seed, args.work, args.smoke, args.max_prompt))
        )
        return 0
    if args.child == "train":
        out = train_variant(args.seed, args.variant, args.work, args.smoke, args.max_prompt)
        args.result.write_text(json.dumps(out))
        return 0
    if args.out is None:
        parser.error("--out is required")
    os.environ["BF16_PROBE_RL_STEPS"] = str(args.rl_steps)  # the children read it
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    started = time.perf_counter()
    works = {s: args.out / f"seed{s}" for s in seeds}
    for work in works.values():
        work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "seeds": {},
        "runs": {},
        "settings": vars(args) | {"out": str(args.out)},
    }
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        prepared = dict(
            zip(
                seeds,
                pool.map(lambda s: run_child("prepare", s, works[s], args), seeds),
                strict=True,
            )
        )
        report["seeds"] = prepared
        jobs = [(s, v) for s in seeds for v in variants if prepared[s].get("bandit")]
        results = pool.map(
            lambda sv: run_child("train", sv[0], works[sv[0]], args, "--variant", sv[1]), jobs
        )
        for (s, v), r in zip(jobs, results, strict=True):
            report["runs"][f"seed{s}/{v}"] = r
    report["wall_s"] = _since(started)
    (args.out / "bf16_probe.json").write_text(json.dumps(report, indent=1, default=str))
    print(render(report, seeds, variants))
    return 0


def render(report: dict[str, Any], seeds: list[int], variants: list[str]) -> str:
    lines = [
        f"bf16 probe: {len(seeds)} seeds x {len(variants)} variants, {report['wall_s']} s",
        "",
        "| run | outcome | steps | step s (median) | reward first 5 -> last 5 | detail |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in report["runs"].items():
        detail = r.get("error") or (
            r.get("tail", "")[-160:].replace("\n", " ") if r["outcome"] == "crashed" else ""
        )
        lines.append(
            f"| {key} | {r['outcome']} | {r.get('steps', '')} | {r.get('step_s_median', '')} | "
            f"{r.get('reward_first5')} -> {r.get('reward_last5')} | {detail[:300]} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
