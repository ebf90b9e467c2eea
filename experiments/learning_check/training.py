"""The learning check's training: the bandit rows (`cobalt.bandit.selection`) and the offline
rows (`cobalt.training.method.offline_rows`) of the reference trajectories, and one mode's run from
the SFT model: GRPO (`cobalt.training.grpo.train`), offline
(`cobalt.training.offline.train_offline`)
or the offline mode followed by a short GRPO phase, each with its cost, step times and curve."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cobalt.bandit.selection import bandit_rows, problem_data_from_eval
from cobalt.problems import Problem
from cobalt.training.settings import OfflineSettings, TrainingConfig
from cobalt.trajectories.evaluation import EvalRecord
from cobalt.trajectories.records import Record
from experiments.learning_check.config import GOAL_REWARD_SHARE
from experiments.learning_check.stages import sandbox_config, weights_fingerprint


def _prompt_counter(model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return prompt_tokens


def bandit_dataset(
    problems: Sequence[Problem],
    records: dict[str, Record],
    evals: dict[str, EvalRecord],
    model: Path,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    prompt_tokens = _prompt_counter(model)
    data = [problem_data_from_eval(records[p.id], evals[p.id], p.tests) for p in problems]
    rows = bandit_rows(data, mode="train", prompt_tokens=prompt_tokens, seed=seed)
    depth: dict[str, int] = {}
    for row in rows:
        d = sum(m["role"] == "assistant" for m in row["prompt"])
        depth[str(d)] = depth.get(str(d), 0) + 1
    lengths = [prompt_tokens(r["prompt"]) for r in rows]
    later = [r for r in rows if any(m["role"] == "assistant" for m in r["prompt"])]
    return rows, {
        "problems": len(problems),
        "problems_kept": len({r["example_id"] for r in rows}),
        "rows": len(rows),
        "rows_by_turn_depth": dict(sorted(depth.items())),
        "turn0_rows": depth.get("0", 0),
        "max_prompt_tokens": max(lengths, default=0),
        "mean_prev_best_pass_rate_later_turns": round(
            sum(r["prev_best_pass_rate"] for r in later) / len(later), 4
        )
        if later
        else None,
    }


def offline_dataset(
    problems: Sequence[Problem], records: dict[str, Record], evals: dict[str, EvalRecord]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every logged turn of the reference trajectories with its reward and LOO advantage."""
    from cobalt.training.method.offline_rows import offline_rows, offline_stats

    data = [problem_data_from_eval(records[p.id], evals[p.id], p.tests) for p in problems]
    rows = offline_rows(data)
    return rows, offline_stats(data, rows)


def micro_batch(args: argparse.Namespace, prompts: int | None = None) -> int:
    """Completions per forward/backward (a divisor of prompts x generations; bf16_probe's
    arguments may predate it: one micro-batch then)."""
    batch = (prompts or args.rl_prompts) * args.rl_generations
    micro = min(getattr(args, "rl_micro_batch", batch) or batch, batch)
    return math.gcd(micro, batch)


def prompts_per_step(args: argparse.Namespace, mode: str) -> int:
    """--rl-prompts, divided by the conversation's turns for multi_turn (each conversation
    samples turns + 1 completions): every mode samples about as many completions per step."""
    if mode != "multi_turn":
        return args.rl_prompts
    return max(1, round(args.rl_prompts / (args.turns + 1)))


def grpo_config(
    mode: str,
    args: argparse.Namespace,
    settings: dict[str, Any] | None = None,
    steps: int | None = None,
) -> TrainingConfig:
    """The TrainingConfig of one GRPO run in `mode`: `settings` holds TrainingConfig fields (the
    mode's reward or precision: cobalt_bf16's `mixed` over --precision) and GRPOConfig fields
    (overrides); `steps`: other than --rl-steps."""
    prompts = prompts_per_step(args, mode)
    batch = prompts * args.rl_generations
    micro = micro_batch(args, prompts)
    known = TrainingConfig.model_fields
    fields = {k: v for k, v in (settings or {}).items() if k in known}
    # float32 unless asked (bf16 autocast once crashed these runs: docs/TRAINING.md)
    fields.setdefault("precision", getattr(args, "precision", "fp32"))
    return TrainingConfig(
        preset="tiny",
        mode=mode,
        max_steps=steps or args.rl_steps,
        max_prompt_length=args.max_prompt,
        seed=args.seed,
        sandbox=sandbox_config(args),
        generation=getattr(args, "generation", "transformers"),
        turns=args.turns,
        report_to=[],
        overrides={
            "learning_rate": args.rl_lr,
            "num_generations": args.rl_generations,
            # one optimizer step = prompts x generations completions, in micro-batches
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": batch // micro,
            "max_completion_length": args.max_completion,
            "temperature": args.rl_temperature,
            "logging_steps": 1,
            "save_strategy": "no",
            **{k: v for k, v in (settings or {}).items() if k not in known},
        },
        **fields,
    )


def train_mode(
    mode: str,
    rows: list[dict[str, Any]],
    model: Path,
    args: argparse.Namespace,
    out_dir: Path,
    extra: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    steps: int | None = None,
    problems: list[Problem] | None = None,
) -> dict[str, Any]:
    """GRPO in `mode` (single_turn, cobalt or multi_turn) on the bandit rows; `extra`: the mode's
    settings (TrainingConfig fields such as reward or precision, else GRPOConfig fields),
    `fields`: more settings (`bf16_probe`'s variants), `steps`: other than --rl-steps
    (offline_grpo's GRPO phase), `problems`: the RL problems (multi_turn: their public tests
    give the feedback)."""
    from cobalt.bandit.rows import prepare_rows
    from cobalt.training.grpo import train
    from cobalt.training.reporting.cost import CostMeter
    from cobalt.training.reporting.step_timing import StepTimer

    prompts = prompts_per_step(args, mode)
    batch = prompts * args.rl_generations
    micro = micro_batch(args, prompts)
    config = grpo_config(mode, args, {**(extra or {}), **(fields or {})}, steps)
    used = prepare_rows(rows, mode, _prompt_counter(model), config.prompt_limit())
    started = time.perf_counter()
    with StepTimer() as timer, CostMeter() as cost:
        run = train(config, rows, model, out_dir, callbacks=[timer], problems=problems)
        history = run.history
    wall = time.perf_counter() - started
    steps = [h for h in history if "loss" in h]
    summary = timer.summary()
    keep = (
        "step",
        "reward",
        "reward_std",
        "rewards/correctness/mean",
        "rewards/correctness/std",
        "loss",
        "kl",
        "entropy",
        "completions/mean_length",
        "completions/clipped_ratio",
        "frac_reward_zero_std",
        "num_tokens",
    )
    return {
        "mode": mode,
        "bf16": run.numerics["compute"] != "float32",
        "numerics": run.numerics,
        "generation": config.generation,
        "reward": config.reward,
        "rows": len(used),  # after the mode and prompt-length filters (what GRPO samples)
        "rows_before_length_filter": len(prepare_rows(rows, mode)),
        "turn0_rows": sum(
            1 for r in used if not any(m["role"] == "assistant" for m in r["prompt"])
        ),
        "steps": len(steps),
        # multi_turn: every conversation samples turns + 1 completions
        "completions_sampled": len(steps) * batch * (args.turns + 1 if mode == "multi_turn" else 1),
        "completions_trained": len(steps) * batch * (args.turns + 1 if mode == "multi_turn" else 1),
        "prompts_per_step": prompts,
        "micro_batch": micro,
        "generations_per_prompt": args.rl_generations,
        "learning_rate": args.rl_lr,
        "temperature": args.rl_temperature,
        "wall_s": round(wall, 2),
        "cost": cost.summary(),
        "step_time": summary,
        "step_time_per_step": [{k: round(v, 4) for k, v in s.items()} for s in timer.steps],
        "overlap": run.overlap,  # --async: batches sampled in the background / in place
        "reward_wait_goal_met": summary["reward_share"] < GOAL_REWARD_SHARE,
        "curve": [{k: h[k] for k in keep if k in h} for h in steps],
        "grpo_config": config.grpo_kwargs(out_dir) | {"output_dir": "<work>"},
    }


def train_offline_mode(
    rows: list[dict[str, Any]],
    model: Path,
    args: argparse.Namespace,
    out_dir: Path,
    objective: str | None = None,
    lr_scale: float = 1.0,
) -> dict[str, Any]:
    """The offline mode from the same SFT model: rl_steps steps of rl_prompts x rl_generations
    logged rows (as many completions per step as GRPO samples), with `objective` (default
    --objective) at `lr_scale` x the learning rate; the diagnostics on (docs/LEARNING.md,
    offline objectives: what each logged figure tests)."""
    from cobalt.training.offline import train_offline
    from cobalt.training.reporting.cost import CostMeter
    from cobalt.training.reporting.step_timing import StepTimer

    objective = objective or args.offline_objective
    batch = args.rl_prompts * args.rl_generations
    config = TrainingConfig(
        preset="tiny",
        mode="offline",
        max_steps=args.rl_steps,
        seed=args.seed,
        offline=OfflineSettings(
            objective=objective,
            batch_size=micro_batch(args),
            gradient_accumulation_steps=batch // micro_batch(args),
            learning_rate=(args.offline_lr or args.rl_lr) * lr_scale,
            # the GRPO modes' prompt limit plus the longest logged completion (and its end token)
            max_length=args.max_prompt + args.max_new_tokens + 1,
            drop_zero_advantage=not args.offline_keep_zero_advantage,
            diagnostics=True,
        ),
        overrides={
            "logging_steps": 1,
            "save_strategy": "no",
        },
        precision=getattr(args, "precision", "fp32"),  # as the GRPO runs
        report_to=[],
    )
    started = time.perf_counter()
    with StepTimer() as timer, CostMeter() as cost:
        run = train_offline(config, rows, model, out_dir, callbacks=[timer])
    wall = time.perf_counter() - started
    steps = [h for h in run.history if "loss" in h]
    return {
        "mode": "offline",
        "objective": objective,
        "rows": run.rows,  # after the zero-advantage and length filters (what it trains on)
        "rows_total": len(rows),
        "dropped_zero_advantage": run.dropped_zero_advantage,
        "dropped_zero_advantage_share": round(run.dropped_zero_advantage / len(rows), 4)
        if rows
        else None,
        "dropped_too_long": run.dropped_too_long,
        # row visits per row: > 1 means the same logged turns again, with no importance weight
        "passes_over_rows": round(len(steps) * batch / run.rows, 2) if run.rows else None,
        "reference_logprobs_s": run.reference_logprobs_s,
        "steps": len(steps),
        "completions_sampled": 0,
        "completions_trained": len(steps) * batch,
        "rows_per_step": batch,
        "micro_batch": micro_batch(args),
        "learning_rate": config.offline_kwargs(out_dir)["learning_rate"],
        "wall_s": round(wall, 2),
        "cost": cost.summary(),
        "step_time": timer.summary(),
        "curve": [{k: h[k] for k in OFFLINE_CURVE if k in h} for h in steps],
        "training_arguments": config.offline_kwargs(out_dir) | {"output_dir": "<work>"},
    }


OFFLINE_CURVE = (
    "step",
    "loss",
    "grad_norm",
    "advantage",
    "advantage_std",
    "negative_share",
    "negative_weight_share",
    "weight",
    "weight_std",
    "weight_max",
    "weight_capped",
    "weighted_advantage",
    "logprob",
    "logprob_positive",
    "logprob_negative",
    "reward",
    "ratio",
    "clip_fraction",
    "kl_ref",
    "logprob_drift",
    "entropy",
)


def train_offline_then_grpo(
    offline_rows: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    model: Path,
    args: argparse.Namespace,
    out_dir: Path,
    reuse: tuple[str, Path, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """offline_grpo: the offline mode (--offline-objective) into `out_dir/offline`, then
    --offline-grpo-steps steps of cobalt GRPO from those weights into `out_dir`. `reuse`: (mode,
    weights directory, training record) of that offline mode already trained in this seed run
    (seed_run.reusable): its weights are the offline phase and its recorded cost the phase's
    cost. Its cost is the sum of both phases; its completions: the logged ones trained on plus
    the sampled ones."""
    if reuse:
        source, offline_dir, first = reuse
        phase = f"reused from {source}"
    else:
        offline_dir = out_dir / "offline"
        first = train_offline_mode(offline_rows, model, args, offline_dir)
        phase = "trained"
    offline_weights = weights_fingerprint(offline_dir)  # the GRPO phase's starting weights
    second = train_mode("cobalt", rows, offline_dir, args, out_dir, steps=args.offline_grpo_steps)
    cost: dict[str, Any] = {}
    for key in ("wall_s", "gpu_s", "gpu_busy_s"):
        parts = [first["cost"].get(key), second["cost"].get(key)]
        cost[key] = None if None in parts else round(sum(parts), 3)
    peaks = [
        x
        for x in (
            first["cost"].get("gpu_peak_memory_gib"),
            second["cost"].get("gpu_peak_memory_gib"),
        )
        if x is not None
    ]
    cost["gpus"] = second["cost"].get("gpus")
    cost["gpu_peak_memory_gib"] = max(peaks) if peaks else None
    return {
        "mode": "offline_grpo",
        "objective": first["objective"],
        "rows": first["rows"],
        "steps": first["steps"] + second["steps"],
        "completions_sampled": second["completions_sampled"],
        "completions_trained": first["completions_trained"] + second["completions_trained"],
        "wall_s": round(first["wall_s"] + second["wall_s"], 2),
        "cost": cost,
        "step_time": second["step_time"],
        "step_time_per_step": second["step_time_per_step"],
        "curve": second["curve"],  # the GRPO phase's reward per step
        "offline_phase": phase,  # "trained" or "reused from offline_<objective>"
        "offline_phase_result": first,
        "offline_phase_weights": offline_weights,
        "grpo_phase": second,
    }
