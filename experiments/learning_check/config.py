"""The learning check's command line, modes and CPU smoke sizes (docs/LEARNING.md has the design
and the budget arithmetic behind the defaults; the kind groups: `kinds`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cobalt.params import add_option
from cobalt.training.settings import DEFAULT_OBJECTIVE, OBJECTIVES

# mode -> (trainer, TRL mode, settings). Run in this order, each from the same SFT model, each
# followed by its evaluation: the main comparison first, the bf16 variant last (a CUDA error there
# cannot cost the float32 modes). Settings: GRPOConfig fields (grpo); the objective and a
# learning-rate factor (offline). `offline` is the offline mode with --objective (default:
# the project's, DEFAULT_OBJECTIVE); offline_<objective> run the objectives side by side;
# offline_grpo is the offline mode followed by --offline-grpo-steps steps of cobalt GRPO from
# the offline weights (its cost: both phases).
MODES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "single_turn": ("grpo", "single_turn", {}),
    "cobalt": ("grpo", "cobalt", {}),
    "offline": ("offline", "offline", {}),
    "offline_rloo": ("offline", "offline", {"objective": "reinforce_loo"}),
    "offline_awr": ("offline", "offline", {"objective": "awr"}),
    "offline_clipped": ("offline", "offline", {"objective": "clipped_ratio"}),
    # REINFORCE-LOO at a tenth of the learning rate: is the step size what broke it?
    "offline_rloo_low_lr": ("offline", "offline", {"objective": "reinforce_loo", "lr_scale": 0.1}),
    "offline_grpo": ("offline_grpo", "cobalt", {}),
    # the paper's multi-turn online baselines (whole repair conversations, --turns
    # feedback turns; prompts per step divided by turns + 1: equal sampled completions), and the
    # VeRPO-style dense reward (cobalt.training.method.dense_reward)
    "multi_turn": ("grpo", "multi_turn", {}),
    "multi_turn_dense": ("grpo", "multi_turn", {"reward": "dense"}),
    "cobalt_dense": ("grpo", "cobalt", {"reward": "dense"}),
    # cobalt with each generation batch sampled while the one before trains (--async)
    "cobalt_async": ("grpo", "cobalt", {"async_generation": True}),
    # the bf16 variant: fp32 master weights with bf16 compute (once pure bf16)
    "cobalt_bf16": ("grpo", "cobalt", {"precision": "mixed"}),
}
DEFAULT_MODES = ("single_turn", "cobalt", "offline", "cobalt_bf16")
GOAL_REWARD_SHARE = 0.10

SMOKE: dict[str, Any] = {
    "vocab": 512,
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 128,
    "sft_examples": 120,
    "sft_steps": 15,
    "sft_seconds": 120.0,  # a cap only: the steps decide (a time-cut fit is not deterministic)
    "sft_epochs": 1,
    "sft_batch": 8,
    "rl_problems": 6,
    "n": 2,
    "max_new_tokens": 32,
    "rl_steps": 2,
    "offline_grpo_steps": 1,
    "rl_prompts": 2,
    "rl_generations": 2,
    "rl_micro_batch": 2,  # two micro-batches per step: the accumulation path runs too
    "max_completion": 24,
    "eval_problems": 4,
    "eval_sft_problems": 2,
    "eval_n": 2,
    "gen_batch": 16,
    "chunk_size": 64,
    # the smoke model writes no program: every reward is -1 and every advantage 0; train on
    # them anyway so that the offline code path runs
    "offline_keep_zero_advantage": True,
}


def build_parser(description: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.learning_check",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Defaults are for one GPU (H100/H200, 16 CPU cores); --smoke is a CPU check.",
    )
    arg = parser.add_argument
    arg("--out", type=Path, required=True, help="where results, report and plots go")
    arg("--smoke", action="store_true", help="tiny CPU settings (overrides the sizes below)")
    arg("--work", type=Path, help="keep models and records here (default: temporary, removed)")
    # seeds and processes
    run = parser.add_argument_group("seeds and processes")
    run.add_argument("--seeds", default="0,1,2", help="one process per seed, e.g. 0,1,2")
    run.add_argument("--parallel", type=int, default=3, help="seed processes at once")
    run.add_argument(
        "--repeat", default="", help="seeds to run once more (same-seed spread), e.g. 0"
    )
    run.add_argument(
        "--deadline-s",
        type=float,
        default=0.0,
        help="wall-time limit of the whole command (0: none): a seed skips a mode that would not "
        "finish before it, and seeds still running at the deadline are stopped (their results "
        "so far are kept)",
    )
    run.add_argument(
        "--aggregate",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="only merge the seed results of these output directories into --out",
    )
    run.add_argument("--no-deterministic", action="store_true", help="skip deterministic kernels")
    run.add_argument(
        "--strict-determinism",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="use_deterministic_algorithms without warn_only: SDPA attention's backward then "
        "takes its deterministic variant, and an op with none raises, naming itself. Default: "
        "on for a GPU run (seed 0 twice on an H100 gave identical cells and fingerprints), off "
        "on CPU (identical without it); --no-strict-determinism: warn_only (docs/LEARNING.md)",
    )
    arg("--seed", type=int, default=0, help=argparse.SUPPRESS)  # a child's seed
    arg("--label", default="", help=argparse.SUPPRESS)  # a child's run name
    arg("--child", type=Path, help=argparse.SUPPRESS)  # a child: the parent's settings.json
    arg("--deadline-at", type=float, default=0.0, help=argparse.SUPPRESS)  # epoch seconds
    arg(
        "--rl-bf16",
        action="store_true",
        help="every mode in mixed precision (fp32 master weights, bf16 compute): --precision mixed",
    )
    arg(
        "--precision",
        default="fp32",
        choices=["auto", "mixed", "fp32", "bf16"],
        help="training numerics of every mode (cobalt.training.machinery.precision; default fp32)",
    )
    arg(
        "--generation",
        default="transformers",
        choices=["transformers", "vllm_colocate"],
        help="how GRPO samples (default transformers: deterministic under strict determinism; "
        "vllm_colocate compiles graphs that strict determinism refuses, so it turns strict off)",
    )
    arg("--device", default="auto", help="torch device for generation and SFT (auto: cuda if any)")
    arg(
        "--backend",
        default="namespace",
        choices=["auto", "docker", "namespace"],
        help="sandbox isolation of the rewards and evaluations (default namespace)",
    )
    arg(
        "--sandbox-concurrency",
        type=int,
        default=0,
        metavar="N",
        help="sandbox workers per seed process (0: the CPUs divided among --parallel)",
    )
    # SFT model and fit
    sft = parser.add_argument_group("SFT")
    sft.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary of the corpus")
    sft.add_argument("--hidden", type=int, default=512, help="the SFT model's hidden size (512)")
    sft.add_argument("--layers", type=int, default=8, help="its decoder layers (8)")
    sft.add_argument("--heads", type=int, default=8, help="its attention heads (8)")
    sft.add_argument("--kv-heads", type=int, default=4, help="its key/value heads (4)")
    sft.add_argument(
        "--intermediate", type=int, default=1408, help="its MLP's intermediate size (1408)"
    )
    sft.add_argument("--sft-examples", type=int, default=9600, help="conversations, SFT kinds")
    sft.add_argument("--sft-epochs", type=int, default=8, help="at most (steps stop it first)")
    sft.add_argument("--sft-steps", type=int, default=300, help="optimizer steps (lr decays)")
    sft.add_argument(
        "--sft-seconds",
        type=float,
        default=240.0,
        help="wall-time cap (a fit cut by it is not deterministic; the steps should decide)",
    )
    sft.add_argument("--sft-batch", type=int, default=32, help="conversations per SFT step (32)")
    sft.add_argument("--sft-lr", type=float, default=1e-3, help="SFT learning rate (1e-3)")
    sft.add_argument(
        "--sft-save-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="dtype the SFT model is saved in (bfloat16: the paper's case, a bf16 checkpoint; "
        "training still keeps fp32 trainable weights)",
    )
    sft.add_argument(
        "--sft-repair-share",
        type=float,
        default=0.25,
        help="share of SFT conversations that start with a wrong program of another operation "
        "and the sandbox's failure feedback before the right program (the family's repair)",
    )
    sft.add_argument(
        "--sft-keep-share",
        type=float,
        default=0.25,
        help="share of SFT conversations where the right program gets the all-passed feedback "
        "and is given again (keeping a program told it passes)",
    )
    # trajectories (reference and evaluation)
    traj = parser.add_argument_group("trajectories")
    traj.add_argument("--rl-problems", type=int, default=144, help="RL-kind problems, reference")
    traj.add_argument("--n", type=int, default=8, help="samples per problem, reference")
    traj.add_argument("--turns", type=int, default=2, help="feedback turns (collect, evaluate)")
    traj.add_argument("--max-new-tokens", type=int, default=128, help="tokens per turn")
    traj.add_argument("--gen-batch", type=int, default=768, help="conversations per generate")
    traj.add_argument("--chunk-size", type=int, default=512, help="problems collected together")
    # GRPO (equal budget: steps x prompts x generations completions per mode)
    grpo = parser.add_argument_group("GRPO")
    grpo.add_argument(
        "--rl-steps", type=int, default=30, help="optimizer steps of each GRPO mode (30)"
    )
    grpo.add_argument("--rl-prompts", type=int, default=16, help="prompts per step")
    grpo.add_argument("--rl-generations", type=int, default=8, help="completions per prompt")
    grpo.add_argument(
        "--rl-micro-batch",
        type=int,
        default=32,
        help="completions (offline: rows) per forward/backward; a step accumulates "
        "prompts x generations of them (memory: several seeds share one GPU)",
    )
    grpo.add_argument(
        "--rl-lr", type=float, default=3e-5, help="learning rate of every mode (3e-5)"
    )
    grpo.add_argument(
        "--rl-temperature", type=float, default=1.0, help="GRPO's sampling temperature (1.0)"
    )
    grpo.add_argument("--max-completion", type=int, default=128, help="max_completion_length")
    grpo.add_argument(
        "--max-prompt",
        type=int,
        default=512,
        help="drop contexts whose templated prompt is longer (tokens); 1536 ran out of memory "
        "with several processes on one GPU (docs/RESULTS.md, related runs of the check)",
    )
    # evaluation
    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--eval-problems", type=int, default=144, help="per held-out group")
    ev.add_argument("--eval-sft-problems", type=int, default=56, help="of the SFT kinds")
    add_option(
        ev,
        "--eval-samples",
        aliases=("--eval-n",),
        dest="eval_n",
        type=int,
        default=4,
        metavar="N",
        help="samples per evaluation problem (4)",
    )
    # offline (same reference trajectories; steps x prompts x generations rows)
    off = parser.add_argument_group("offline")
    add_option(
        off,
        "--objective",
        aliases=("--offline-objective",),
        dest="offline_objective",
        default=DEFAULT_OBJECTIVE,
        choices=OBJECTIVES,
        help="the objective of the modes offline and offline_grpo (default: the project's, "
        "cobalt.training.settings.DEFAULT_OBJECTIVE)",
    )
    off.add_argument("--offline-lr", type=float, help="offline learning rate (default: --rl-lr)")
    off.add_argument(
        "--offline-grpo-steps",
        type=int,
        default=10,
        help="offline_grpo: cobalt GRPO steps after the offline phase (prompts and completions "
        "per step as the GRPO modes)",
    )
    off.add_argument(
        "--offline-keep-zero-advantage",
        action="store_true",
        help="train offline on rows with advantage 0 too (no gradient for REINFORCE / PPO)",
    )
    arg(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"any of {', '.join(MODES)}; run in this order",
    )
    return parser


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """The smoke sizes, the mode list, the per-process CPU share."""
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    args.modes = ",".join(m for m in MODES if m in modes)  # always in the table's order
    if args.parallel < 1:
        raise SystemExit("--parallel must be at least 1")
    for flag in ("sft_repair_share", "sft_keep_share"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            raise SystemExit(f"--{flag.replace('_', '-')}: a share between 0 and 1")
    batch = args.rl_prompts * args.rl_generations
    args.rl_micro_batch = min(args.rl_micro_batch, batch)
    if batch % args.rl_micro_batch:
        raise SystemExit(f"--rl-micro-batch must divide prompts x generations ({batch})")
    if not args.sandbox_concurrency:
        args.sandbox_concurrency = max(1, cpus() // args.parallel)
    if args.rl_bf16:
        args.precision = "mixed"
    if args.generation.startswith("vllm") and args.strict_determinism:
        raise SystemExit(
            "--generation vllm_colocate with --strict-determinism: vLLM's compiled graphs have "
            "no deterministic variant; leave --strict-determinism out (it turns off)"
        )
    return args


def cpus() -> int:
    """The CPUs this process may run on (`taskset` splits a machine between two checks)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def seeds_of(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"seeds: a comma-separated list of integers, got {text!r}") from None


SHORT = {"reinforce_loo": "rloo", "awr": "awr", "clipped_ratio": "clipped"}


def offline_twins(objective: str) -> list[str]:
    """The offline modes that train exactly offline_grpo's offline phase (its objective, the
    full learning rate): offline_<objective> first, then `offline` (--objective)."""
    return [f"offline_{SHORT.get(objective, objective)}", "offline"]


def mode_list(args: argparse.Namespace) -> list[str]:
    """--modes in its order, except that offline_grpo runs after the offline mode whose weights
    it reuses (offline_<--objective>, else `offline`) when that mode is listed later."""
    modes = [m for m in args.modes.split(",") if m]
    if "offline_grpo" in modes:
        twins = offline_twins(getattr(args, "offline_objective", None) or DEFAULT_OBJECTIVE)
        last = max((modes.index(t) for t in twins if t in modes), default=-1)
        if last > modes.index("offline_grpo"):
            modes.remove("offline_grpo")
            modes.insert(last, "offline_grpo")  # right after it (the list is one shorter now)
    return modes


def as_json(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def from_json(settings: dict[str, Any]) -> argparse.Namespace:
    args = argparse.Namespace(**settings)
    for name in ("out", "work", "child"):
        value = getattr(args, name, None)
        setattr(args, name, Path(value) if value else None)
    return args
