"""Does it learn? The controlled learning check of issue 5, on one GPU in under 10 minutes.

    python scripts/learning_check.py --out runs/learning_check          # GPU (H100/H200)
    python scripts/learning_check.py --smoke --out /tmp/lc               # CPU, same code path

Plain Python (no Prefect), built from the repo's own pieces:

1. SFT: `cobalt.reference.fit_tiny_model` builds a Qwen2-shaped model (default ~24M parameters:
   hidden 512, 8 layers, a 1024-token BPE vocabulary trained locally) and fits it with TRL's
   SFTTrainer to 18 of the synthetic family's 30 kinds (`cobalt.data.synthetic`: 10 list operations x 3
   input formats), conversations without a system prompt. 12 kinds are held out of SFT: the *RL
   kinds* (`synthetic.HELD_OUT`) and 6 *never-seen kinds* (`UNSEEN_KINDS`, held out of RL too).
2. The fitted model is the reference model: `cobalt.trajectories.collect.collect_initial` +
   `collect_multiturn` (n samples, 2 feedback turns, the real sandbox) on problems of the RL
   kinds, `cobalt.evaluation.evaluate` per turn, then `cobalt.bandit.selection.problem_data_from_eval` +
   `bandit_rows` make the Cobalt contexts. The same rows feed both modes: `single_turn` keeps
   their turn-0 contexts (`cobalt.training.grpo.prepare_rows`).
3. RL: `cobalt.training.grpo.train` (TRL GRPOTrainer, reward = `CobaltRewards` correctness from the
   tests only, no format term) in `single_turn` and `cobalt` mode from the same SFT model, with the
   same steps x prompts x generations, i.e. the same number of sampled completions;
   `cobalt.training.step_timing.StepTimer` splits every step into generation, reward wait, optimisation.
   `offline` (issue 11, SPEC §2): `cobalt.training.offline.train_offline` on every logged turn
   of the same reference trajectories (`cobalt.training.offline_data.offline_rows`: the Cobalt
   reward and its leave-one-out advantage), no generation and no sandbox, from the same SFT
   model, the same steps x (prompts x generations) rows per step; `--offline-objective`.
   Every mode's cost: `cobalt.training.cost.CostMeter` (wall and GPU seconds of training).
4. Evaluation: fresh problems of the RL kinds, of the 6 never-seen kinds, and
   (fewer) of the SFT kinds; per-turn Pass@1 (turns 0..2, same multi-turn protocol:
   collect + `evaluate` + `turn_table`) for the SFT model and after each mode, same problems,
   same seeds.
5. Output in --out: learning_check.json (everything), REPORT.md (tables), reward_curves.png,
   pass_at_1.png, offline_curves.png. Models and JSONL records stay in a temporary work directory
   (--work keeps them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file too
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from cobalt.bandit.selection import bandit_rows, problem_data_from_eval  # noqa: E402
from cobalt.data import synthetic  # noqa: E402
from cobalt.evaluation import EvalRecord, evaluate, turn_table  # noqa: E402
from cobalt.problems import Problem  # noqa: E402
from cobalt.trajectories.collect import (  # noqa: E402
    BatchConfig,
    CollectConfig,
    collect_initial,
    collect_multiturn,
)
from cobalt.trajectories.records import Record  # noqa: E402
from engines import EngineConfig, SamplingConfig, make_engine  # noqa: E402
from sandbox import SandboxConfig, SyncJudge  # noqa: E402

log = logging.getLogger("learning_check")

# RL kinds: synthetic.HELD_OUT (the 6 combinations the GRPO probe trained on). Never-seen
# kinds: 6 more combinations held out of SFT and RL alike (each format twice, every operation
# still seen by SFT in another format). SFT sees the other 18 kinds.
RL_KINDS: tuple[str, ...] = tuple(synthetic.HELD_OUT)
UNSEEN_KINDS: tuple[str, ...] = (
    "sum/count",
    "min/count",
    "max/comma",
    "reversed/comma",
    "product/lines",
    "second/lines",
)
SFT_HELD_OUT: tuple[str, ...] = RL_KINDS + UNSEEN_KINDS
assert not set(RL_KINDS) & set(UNSEEN_KINDS) and set(SFT_HELD_OUT) <= set(synthetic.KINDS)
GROUPS = {"rl_kinds": "RL kinds", "unseen_kinds": "never-seen kinds", "sft_kinds": "SFT kinds"}
MODES = ("single_turn", "cobalt", "offline")
GRPO_MODES = ("single_turn", "cobalt")
GOAL_REWARD_SHARE = 0.10

SMOKE = {
    "vocab": 512,
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 128,
    "sft_examples": 120,
    "sft_steps": 15,
    "sft_seconds": 8.0,
    "sft_epochs": 1,
    "sft_batch": 8,
    "rl_problems": 6,
    "n": 2,
    "max_new_tokens": 48,
    "rl_steps": 2,
    "rl_prompts": 2,
    "rl_generations": 2,
    "max_completion": 32,
    "eval_problems": 3,
    "eval_sft_problems": 3,
    "eval_n": 2,
    "gen_batch": 16,
    "chunk_size": 64,
    # the smoke model writes no program: every reward is -1 and every advantage 0; train on
    # them anyway so that the offline code path runs
    "offline_keep_zero_advantage": True,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/learning_check.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Defaults are for one GPU (H100/H200, 16 CPU cores); --smoke is a CPU check.",
    )
    arg = parser.add_argument
    arg("--out", type=Path, required=True, help="where the JSON, report and plots go")
    arg("--smoke", action="store_true", help="tiny CPU settings (overrides the sizes below)")
    arg("--work", type=Path, help="keep models and records here (default: temporary, removed)")
    arg("--seed", type=int, default=0)
    arg("--rl-bf16", action="store_true", help="GRPO under bf16 autocast (default: float32)")
    arg("--device", default="auto", help="torch device for generation and SFT (auto: cuda if any)")
    arg("--backend", default="namespace", choices=["auto", "docker", "namespace"])
    arg("--sandbox-concurrency", type=int, default=os.cpu_count() or 1)
    # SFT model and fit
    arg("--vocab", type=int, default=1024, help="BPE vocabulary trained on the corpus")
    arg("--hidden", type=int, default=512)
    arg("--layers", type=int, default=8)
    arg("--heads", type=int, default=8)
    arg("--kv-heads", type=int, default=4)
    arg("--intermediate", type=int, default=1408)
    arg("--sft-examples", type=int, default=6000, help="SFT conversations of the seen kinds")
    arg("--sft-epochs", type=int, default=8, help="SFT epochs at most (or the budget, first)")
    arg(
        "--sft-steps",
        type=int,
        default=300,
        help="SFT optimizer steps (the learning rate decays over them; 0: over --sft-seconds)",
    )
    arg(
        "--sft-seconds",
        type=float,
        default=150.0,
        help="SFT wall-time cap incl. tokenizing the data",
    )
    arg("--sft-batch", type=int, default=32)
    arg("--sft-lr", type=float, default=1e-3)
    # reference trajectories
    arg("--rl-problems", type=int, default=128, help="RL-kind problems for trajectories")
    arg("--n", type=int, default=8, help="samples per problem in the reference trajectories")
    arg("--turns", type=int, default=2, help="feedback turns (collection and evaluation)")
    arg("--max-new-tokens", type=int, default=160, help="tokens per turn (collection, eval)")
    arg("--gen-batch", type=int, default=512, help="conversations per generate call")
    arg("--chunk-size", type=int, default=512, help="problems collected together")
    # GRPO (equal budget: steps x prompts x generations completions per mode)
    arg("--rl-steps", type=int, default=40)
    arg("--rl-prompts", type=int, default=16, help="prompts per step")
    arg("--rl-generations", type=int, default=8, help="completions per prompt (group size)")
    arg("--rl-lr", type=float, default=3e-5)
    arg("--rl-temperature", type=float, default=1.0)
    arg("--max-completion", type=int, default=128, help="GRPO max_completion_length")
    arg(
        "--max-prompt",
        type=int,
        default=512,
        help="drop contexts whose templated prompt is longer (tokens); 1536 crashed seed 1 "
        "(NaN sampling probabilities in cobalt's 2nd step, docs/LEARNING.md)",
    )
    # evaluation
    arg("--eval-problems", type=int, default=96, help="per group: RL kinds, never-seen kinds")
    arg("--eval-sft-problems", type=int, default=48, help="problems of the SFT kinds")
    arg("--eval-n", type=int, default=8, help="samples per evaluation problem")
    # offline (same reference trajectories; steps x prompts x generations rows)
    arg(
        "--offline-objective",
        default="reinforce_loo",
        choices=["reinforce_loo", "awr", "clipped_ratio"],
    )
    arg("--offline-lr", type=float, help="offline learning rate (default: --rl-lr)")
    arg(
        "--offline-keep-zero-advantage",
        action="store_true",
        help="train offline on rows with advantage 0 too (no gradient for REINFORCE / PPO)",
    )
    arg("--modes", default=",".join(MODES), help="single_turn, cobalt and/or offline")
    return parser


# --- pieces ----------------------------------------------------------------------------------


def labelled(problems: Sequence[Problem], label: str) -> list[Problem]:
    return [p.model_copy(update={"difficulty": label}) for p in problems]


def eval_problems(args: argparse.Namespace) -> list[Problem]:
    """Fresh problems (seeds no other stage uses) of the three groups."""
    seed = args.seed + 2000
    return (
        labelled(synthetic.make_problems(RL_KINDS, args.eval_problems, seed=seed), "rl_kinds")
        + labelled(
            synthetic.make_problems(UNSEEN_KINDS, args.eval_problems, seed=seed), "unseen_kinds"
        )
        + labelled(
            synthetic.make_problems(
                synthetic.seen_kinds(SFT_HELD_OUT), args.eval_sft_problems, seed=seed
            ),
            "sft_kinds",
        )
    )


def fit(args: argparse.Namespace, path: Path, device: str) -> dict[str, Any]:
    from cobalt.reference import RECIPE_FILE, fit_tiny_model

    fit_tiny_model(
        path,
        seed=args.seed,
        seconds_budget=args.sft_seconds,
        max_steps=args.sft_steps or None,
        n_examples=args.sft_examples,
        held_out=SFT_HELD_OUT,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate,
        learning_rate=args.sft_lr,
        batch_size=args.sft_batch,
        max_epochs=args.sft_epochs,
        device="cpu" if device == "cpu" else "cuda",
    )
    recipe = json.loads((path / RECIPE_FILE).read_text())
    stats = dict(recipe.get("stats", {}))
    steps_per_epoch = -(-args.sft_examples // args.sft_batch)
    stats["epochs"] = round(stats.get("steps", 0) / steps_per_epoch, 2)
    return {"recipe": {k: v for k, v in recipe.items() if k != "stats"}, "stats": stats}


def rollout(
    model: Path,
    problems: Sequence[Problem],
    args: argparse.Namespace,
    judge: SyncJudge,
    work: Path,
    n: int,
    seed: int,
) -> tuple[dict[str, Record], dict[str, EvalRecord], dict[str, Any]]:
    """Trajectories (turn 0 + feedback turns) and their per-turn evaluation on all tests."""
    work.mkdir(parents=True, exist_ok=True)
    config = CollectConfig(
        sampling=SamplingConfig(
            n=n, temperature=0.6, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=seed
        ),
        turns=args.turns,
        system_prompt="",  # the SFT conversations have none
    )
    batch = BatchConfig(chunk_size=args.chunk_size, lanes=2)
    engine_config = EngineConfig(
        kind="transformers", model=str(model), device=args.device, batch_size=args.gen_batch
    )
    started = time.perf_counter()
    with make_engine(engine_config) as engine:
        initial, first = collect_initial(problems, engine, config, work / "initial.jsonl", batch)
        records, rest = collect_multiturn(
            problems, initial, engine, judge, config, work / "multiturn.jsonl", batch
        )
    evals, scored = evaluate(problems, records, judge, args.turns, work / "eval.jsonl", batch)
    stats = first.merge(rest)
    return (
        records,
        evals,
        {
            "wall_s": round(time.perf_counter() - started, 2),
            "collect_s": round(stats.wall_s, 2),
            "generate_s": round(stats.generate_s, 2),
            "sandbox_wait_s": round(stats.sandbox_s, 2),
            "evaluate_s": round(scored.wall_s, 2),
            "completions": stats.completions,
            "completion_tokens": stats.completion_tokens,
            "outcomes": stats.outcomes,
        },
    )


def tables(evals: dict[str, EvalRecord], problems: Sequence[Problem], turns: int) -> dict:
    """Per-group and per-kind turn tables (pass@1 in %)."""
    ordered = [evals[p.id] for p in problems if p.id in evals]
    kinds = {p.id: synthetic.kind_of(p) for p in problems}
    by_kind = [e.model_copy(update={"difficulty": kinds[e.problem_id]}) for e in ordered]
    return {
        "by_group": [r for r in turn_table(ordered, turns) if r["difficulty"] != "all"],
        "by_kind": [r for r in turn_table(by_kind, turns) if r["difficulty"] != "all"],
    }


def bandit_dataset(
    problems: Sequence[Problem],
    records: dict[str, Record],
    evals: dict[str, EvalRecord],
    model: Path,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    data = [problem_data_from_eval(records[p.id], evals[p.id], p.tests) for p in problems]
    rows = bandit_rows(data, mode="train", prompt_tokens=prompt_tokens, seed=seed)
    depth: dict[str, int] = {}
    for row in rows:
        d = sum(m["role"] == "assistant" for m in row["prompt"])
        depth[str(d)] = depth.get(str(d), 0) + 1
    lengths = [prompt_tokens(r["prompt"]) for r in rows]
    later = [r for r in rows if any(m["role"] == "assistant" for m in r["prompt"])]
    stats = {
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
    return rows, stats


def train_mode(
    mode: str,
    rows: list[dict[str, Any]],
    model: Path,
    args: argparse.Namespace,
    out_dir: Path,
    extra: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """GRPO in `mode` on the bandit rows; `extra`: more GRPOConfig fields, `fields`: more
    TrainingConfig fields (scripts/bf16_probe.py)."""
    from transformers import AutoTokenizer

    from cobalt.training.config import TrainingConfig
    from cobalt.training.cost import CostMeter
    from cobalt.training.grpo import prepare_rows, train
    from cobalt.training.step_timing import StepTimer

    batch = args.rl_prompts * args.rl_generations
    config = TrainingConfig(
        preset="tiny",
        mode=mode,
        max_steps=args.rl_steps,
        max_prompt_length=args.max_prompt,
        seed=args.seed,
        sandbox=SandboxConfig(backend=args.backend, concurrency=args.sandbox_concurrency),
        overrides={
            "learning_rate": args.rl_lr,
            "num_generations": args.rl_generations,
            "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": 1,
            "max_completion_length": args.max_completion,
            "temperature": args.rl_temperature,
            "logging_steps": 1,
            "save_strategy": "no",
            # float32 by default: bf16 autocast crashed a run (NaN sampling probabilities, seed 1)
            **({} if args.rl_bf16 else {"bf16": False}),
            **(extra or {}),
        },
        **(fields or {}),
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model))

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    used = prepare_rows(rows, mode, prompt_tokens, config.prompt_limit())
    started = time.perf_counter()
    with StepTimer() as timer, CostMeter() as cost:
        history = train(config, rows, model, out_dir, callbacks=[timer])
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
    curve = [{k: h[k] for k in keep if k in h} for h in steps]
    return {
        "mode": mode,
        "rows": len(used),  # after the mode and prompt-length filters (what GRPO samples)
        "rows_before_length_filter": len(prepare_rows(rows, mode)),
        "turn0_rows": sum(
            1 for r in used if not any(m["role"] == "assistant" for m in r["prompt"])
        ),
        "steps": len(steps),
        "completions_sampled": len(steps) * batch,
        "prompts_per_step": args.rl_prompts,
        "generations_per_prompt": args.rl_generations,
        "learning_rate": args.rl_lr,
        "temperature": args.rl_temperature,
        "wall_s": round(wall, 2),
        "cost": cost.summary(),
        "step_time": summary,
        "step_time_per_step": [{k: round(v, 4) for k, v in s.items()} for s in timer.steps],
        "reward_wait_goal_met": summary["reward_share"] < GOAL_REWARD_SHARE,
        "curve": curve,
        "grpo_config": config.grpo_kwargs(out_dir) | {"output_dir": "<work>"},
    }


def offline_dataset(
    problems: Sequence[Problem], records: dict[str, Record], evals: dict[str, EvalRecord]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every logged turn of the reference trajectories with its reward and LOO advantage."""
    from cobalt.training.offline_data import offline_rows, offline_stats

    data = [problem_data_from_eval(records[p.id], evals[p.id], p.tests) for p in problems]
    rows = offline_rows(data)
    return rows, offline_stats(data, rows)


def train_offline_mode(
    rows: list[dict[str, Any]], model: Path, args: argparse.Namespace, out_dir: Path
) -> dict[str, Any]:
    """The offline mode from the same SFT model: rl_steps steps of rl_prompts x rl_generations
    logged rows (as many completions per step as GRPO samples)."""
    from cobalt.training.config import OfflineSettings, TrainingConfig
    from cobalt.training.cost import CostMeter
    from cobalt.training.offline import train_offline
    from cobalt.training.step_timing import StepTimer

    batch = args.rl_prompts * args.rl_generations
    config = TrainingConfig(
        preset="tiny",
        mode="offline",
        max_steps=args.rl_steps,
        seed=args.seed,
        offline=OfflineSettings(
            objective=args.offline_objective,
            batch_size=batch,
            learning_rate=args.offline_lr or args.rl_lr,
            # the GRPO modes' prompt limit plus the longest logged completion (and its end token)
            max_length=args.max_prompt + args.max_new_tokens + 1,
            drop_zero_advantage=not args.offline_keep_zero_advantage,
        ),
        overrides={
            "logging_steps": 1,
            "save_strategy": "no",
            **({} if args.rl_bf16 else {"bf16": False}),  # float32 as the GRPO runs
        },
    )
    started = time.perf_counter()
    with StepTimer() as timer, CostMeter() as cost:
        run = train_offline(config, rows, model, out_dir, callbacks=[timer])
    wall = time.perf_counter() - started
    steps = [h for h in run.history if "loss" in h]
    keep = (
        "step",
        "loss",
        "grad_norm",
        "advantage",
        "weight",
        "weighted_advantage",
        "logprob",
        "logprob_positive",
        "logprob_negative",
        "reward",
        "ratio",
        "clip_fraction",
    )
    return {
        "mode": "offline",
        "objective": args.offline_objective,
        "rows": run.rows,  # after the zero-advantage and length filters (what it trains on)
        "rows_total": len(rows),
        "dropped_zero_advantage": run.dropped_zero_advantage,
        "dropped_too_long": run.dropped_too_long,
        "reference_logprobs_s": run.reference_logprobs_s,
        "steps": len(steps),
        "completions_sampled": 0,
        "completions_trained": len(steps) * batch,
        "rows_per_step": batch,
        "learning_rate": config.offline_kwargs(out_dir)["learning_rate"],
        "wall_s": round(wall, 2),
        "cost": cost.summary(),
        "step_time": timer.summary(),
        "curve": [{k: h[k] for k in keep if k in h} for h in steps],
        "training_arguments": config.offline_kwargs(out_dir) | {"output_dir": "<work>"},
    }


# --- output ----------------------------------------------------------------------------------


def _cell(table: dict | None, group: str, turn: int) -> float | None:
    if table is None:
        return None
    for r in table["by_group"]:
        if r["difficulty"] == group and r["turn"] == turn:
            return r["pass@1"]
    return None


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def _delta(after: float | None, before: float | None) -> str:
    if after is None or before is None:
        return "–"
    return f"{after - before:+.1f}"


def pass_table(report: dict[str, Any]) -> list[str]:
    ev = report["evaluation"]
    before = ev["sft"]
    modes = [m for m in MODES if m in ev]
    head = (
        "| kinds | turn | SFT (before) | " + " | ".join(f"after {m} | Δ {m}" for m in modes) + " |"
    )
    lines = [head, "|" + "---|" * (3 + 2 * len(modes))]
    for group, name in GROUPS.items():
        for t in range(report["settings"]["turns"] + 1):
            b = _cell(before["tables"], group, t)
            cells = [f"{name}", str(t), _fmt(b)]
            for m in modes:
                a = _cell(ev[m]["tables"], group, t)
                cells += [_fmt(a), _delta(a, b)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def kind_table(report: dict[str, Any]) -> list[str]:
    ev = report["evaluation"]
    modes = [m for m in MODES if m in ev]
    names = ["SFT", *modes]
    tables_ = [ev["sft"]["tables"], *(ev[m]["tables"] for m in modes)]
    lines = [
        "| kind | group | " + " | ".join(f"{n} t0 / t2" for n in names) + " |",
        "|" + "---|" * (2 + len(names)),
    ]
    last = report["settings"]["turns"]
    for kind in [*RL_KINDS, *UNSEEN_KINDS]:
        group = "RL" if kind in RL_KINDS else "never seen"
        cells = [kind, group]
        for tab in tables_:
            rows = {r["turn"]: r["pass@1"] for r in tab["by_kind"] if r["difficulty"] == kind}
            cells.append(f"{_fmt(rows.get(0))} / {_fmt(rows.get(last))}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(report: dict[str, Any]) -> str:
    s, m, sft = report["settings"], report["machine"], report["sft"]
    lines = [
        "# Learning check",
        "",
        f"{report['date']} on {m['device']} ({m['cpus']} CPUs), torch {m['torch']}, "
        f"transformers {m['transformers']}, trl {m['trl']}; sandbox backend "
        f"{report['sandbox_backend']}; total wall {report['wall_s']} s.",
        "",
        f"SFT: {sft['stats'].get('parameters', 0) / 1e6:.1f}M parameters (hidden {s['hidden']}, "
        f"{s['layers']} layers, vocab {s['vocab']}), {s['sft_examples']} conversations of "
        f"{len(synthetic.seen_kinds(SFT_HELD_OUT))} seen kinds, {sft['stats'].get('steps')} steps "
        f"({sft['stats'].get('epochs')} epochs, batch {s['sft_batch']}) in "
        f"{sft['stats'].get('fit_seconds')} s, final loss {sft['stats'].get('train_loss')}.",
        "",
        f"Reference trajectories: {s['rl_problems']} problems of the RL kinds "
        f"({', '.join(RL_KINDS)}) x {s['n']} samples, {s['turns']} feedback turns; bandit "
        f"dataset {report['bandit']['rows']} rows ({report['bandit']['turn0_rows']} turn-0) from "
        f"{report['bandit']['problems_kept']} problems; by depth "
        f"{report['bandit']['rows_by_turn_depth']}.",
        "",
        f"Evaluation: {s['eval_problems']} fresh problems per held-out group and "
        f"{s['eval_sft_problems']} of the SFT kinds, {s['eval_n']} samples each at temperature "
        "0.6 / top-p 0.95, Pass@1 (%) on all tests per turn (turn t = after t feedback turns).",
        "",
        *pass_table(report),
        "",
        "Per kind (Pass@1 % at turn 0 / last turn):",
        "",
        *kind_table(report),
        "",
        "## RL runs (equal generation budget)",
        "",
        "| mode | rows | steps | completions | wall s | generation | reward wait | optimisation "
        "| reward wait < 10% | mean reward first 5 → last 5 steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in GRPO_MODES:
        if mode not in report["training"]:
            continue
        r = report["training"][mode]
        st = r["step_time"]
        rewards = [c.get("rewards/correctness/mean", c.get("reward")) for c in r["curve"]]
        rewards = [x for x in rewards if x is not None]
        k = min(5, len(rewards))
        first = sum(rewards[:k]) / k if k else float("nan")
        last = sum(rewards[-k:]) / k if k else float("nan")
        lines.append(
            f"| {mode} | {r['rows']} | {r['steps']} | {r['completions_sampled']} | {r['wall_s']} | "
            f"{st['generation_s']} s ({100 * st['generation_share']:.1f}%) | "
            f"{st['reward_s']} s ({100 * st['reward_share']:.1f}%) | "
            f"{st['optimisation_s']} s ({100 * st['optimisation_share']:.1f}%) | "
            f"{'yes' if r['reward_wait_goal_met'] else 'NO'} | {first:.3f} → {last:.3f} |"
        )
    lines += [
        "",
        f"GRPO: {s['rl_prompts']} prompts x {s['rl_generations']} completions per step, "
        f"lr {s['rl_lr']}, temperature {s['rl_temperature']}, max completion "
        f"{s['max_completion']} tokens, KL 1e-4, clip 0.2/0.4, reward = correctness from the "
        "tests only (SPEC §1.5 without the format term).",
        "",
        "![reward curves](reward_curves.png)",
        "",
        *offline_lines(report),
        *cost_lines(report),
        "![pass@1](pass_at_1.png)",
        "",
        "Phase wall times (s): " + ", ".join(f"{k} {v}" for k, v in report["phases_s"].items()),
        "",
    ]
    return "\n".join(lines)


def offline_lines(report: dict[str, Any]) -> list[str]:
    r = report["training"].get("offline")
    if r is None:
        return []
    o = report.get("offline", {})
    curve = r["curve"]
    k = min(5, len(curve))

    def mean(key: str, part: list[dict[str, Any]]) -> str:
        xs = [c[key] for c in part if key in c]
        return f"{sum(xs) / len(xs):.3f}" if xs else "–"

    return [
        "## Offline run (the logged turns, no generation)",
        "",
        f"Offline dataset: {o.get('rows')} logged turns of {o.get('problems')} problems (by turn "
        f"{o.get('rows_by_turn')}), {o.get('nonzero_advantage_rows')} with a nonzero "
        f"leave-one-out advantage (baseline groups {o.get('baseline_groups')}); mean reward by "
        f"turn {o.get('reward_mean_by_turn')}.",
        "",
        "| objective | rows trained | steps | completions trained | lr | wall s "
        "| loss | weighted advantage | log-prob, A > 0 rows | log-prob, A < 0 rows |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['objective']} | {r['rows']} | {r['steps']} | {r['completions_trained']} | "
        f"{r['learning_rate']} | {r['wall_s']} | "
        + " | ".join(
            f"{mean(key, curve[:k])} → {mean(key, curve[-k:])}"
            for key in ("loss", "weighted_advantage", "logprob_positive", "logprob_negative")
        )
        + " |",
        "",
        "(mean of the first 5 → last 5 steps; log-prob: mean completion token log-probability of "
        "the step's rows with a positive / negative advantage, before its update)",
        "",
        "![offline curves](offline_curves.png)",
        "",
    ]


def cost_lines(report: dict[str, Any]) -> list[str]:
    runs = report["training"]
    lines = [
        "## Cost of training (same SFT model, same reference trajectories)",
        "",
        "| mode | wall s | GPU s (wall x GPUs) | GPU busy s (NVML) | peak GPU memory GiB |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        if mode in runs:
            c = runs[mode].get("cost", {})
            lines.append(
                f"| {mode} | {c.get('wall_s')} | {_fmt_none(c.get('gpu_s'))} | "
                f"{_fmt_none(c.get('gpu_busy_s'))} | {_fmt_none(c.get('gpu_peak_memory_gib'))} |"
            )
    return [*lines, ""]


def _fmt_none(x: Any) -> str:
    return "–" if x is None else str(x)


def plot_offline_curves(report: dict[str, Any], path: Path) -> None:
    from cobalt.training.offline import plot_offline

    r = report["training"].get("offline")
    if r is not None:
        path.write_bytes(plot_offline(r["curve"], f"Offline ({r['objective']}) per step"))


def plot_rewards(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.0), dpi=100)
    try:
        for mode in GRPO_MODES:
            if mode not in report["training"]:
                continue
            curve = report["training"][mode]["curve"]
            xs = [c["step"] for c in curve]
            ys = [c.get("rewards/correctness/mean", c.get("reward", 0.0)) for c in curve]
            (line,) = ax.plot(xs, ys, alpha=0.35, linewidth=1)
            w = max(1, len(ys) // 10)
            smooth = [
                sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1])
                for i in range(len(ys))
            ]
            ax.plot(xs, smooth, color=line.get_color(), linewidth=2.2, label=f"{mode}")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("mean correctness reward")
        ax.set_title("Reward per step (thin: raw, thick: moving mean)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.savefig(path, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)


def plot_pass(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = report["evaluation"]
    names = ["sft", *(m for m in MODES if m in ev)]
    turns = report["settings"]["turns"]
    fig, axes = plt.subplots(1, len(GROUPS), figsize=(4.0 * len(GROUPS), 3.6), dpi=100, sharey=True)
    try:
        for ax, (group, title) in zip(axes, GROUPS.items(), strict=True):
            for name in names:
                ys = [_cell(ev[name]["tables"], group, t) or 0.0 for t in range(turns + 1)]
                ax.plot(
                    range(turns + 1),
                    ys,
                    marker="o",
                    label="SFT (before)" if name == "sft" else f"after {name}",
                )
            ax.set_title(title)
            ax.set_xlabel("turn")
            ax.set_xticks(range(turns + 1))
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("Pass@1 (%)")
        axes[0].legend(fontsize=8)
        fig.savefig(path, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= set(MODES):
        raise SystemExit(f"--modes: single_turn, cobalt and/or offline, got {args.modes!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "sandbox", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import torch
    import transformers
    import trl

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="learning-check-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    phases: dict[str, float] = {}

    def phase(name: str, t0: float) -> None:
        phases[name] = round(time.perf_counter() - t0, 2)
        log.info(
            "%s done in %.1f s (total %.1f s)", name, phases[name], time.perf_counter() - started
        )
        report["phases_s"] = phases  # what is done so far survives a kill
        (args.out / "learning_check.json").write_text(json.dumps(report, indent=1) + "\n")

    report: dict[str, Any] = {
        "check": "learning_check",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python scripts/learning_check.py", *(argv or sys.argv[1:])]),
        "machine": {
            "device": device_name,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "kinds": {
            "sft": synthetic.seen_kinds(SFT_HELD_OUT),
            "rl": list(RL_KINDS),
            "unseen": list(UNSEEN_KINDS),
        },
        "evaluation": {},
        "training": {},
    }
    try:
        t0 = time.perf_counter()
        sft_path = work / "sft"
        report["sft"] = fit(args, sft_path, args.device)
        phase("sft", t0)

        rl_problems = labelled(
            synthetic.make_problems(RL_KINDS, args.rl_problems, seed=args.seed + 1000),
            "rl_kinds",
        )
        evaluation = eval_problems(args)
        sandbox = SandboxConfig(backend=args.backend, concurrency=args.sandbox_concurrency)
        with SyncJudge(sandbox) as judge:
            report["sandbox_backend"] = judge.backend_name
            t0 = time.perf_counter()
            records, evals, stats = rollout(
                sft_path, rl_problems, args, judge, work / "reference", args.n, args.seed
            )
            report["reference"] = {
                "stats": stats,
                "tables": tables(evals, rl_problems, args.turns),
            }
            rows, report["bandit"] = bandit_dataset(
                rl_problems, records, evals, sft_path, args.seed
            )
            offline_rows, report["offline"] = offline_dataset(rl_problems, records, evals)
            if not rows:
                (args.out / "learning_check.json").write_text(json.dumps(report, indent=1) + "\n")
                raise SystemExit(
                    "learning check: the bandit dataset is empty (every reference sample of "
                    "every RL problem passed at turn 0): nothing to train on"
                )
            phase("reference_trajectories", t0)

            t0 = time.perf_counter()
            _, evals, stats = rollout(
                sft_path, evaluation, args, judge, work / "eval-sft", args.eval_n, args.seed + 7
            )
            report["evaluation"]["sft"] = {
                "stats": stats,
                "tables": tables(evals, evaluation, args.turns),
            }
            phase("evaluate_sft", t0)

            for mode in modes:
                t0 = time.perf_counter()
                out_dir = work / f"rl-{mode}"
                if mode == "offline":
                    report["training"][mode] = train_offline_mode(
                        offline_rows, sft_path, args, out_dir
                    )
                else:
                    report["training"][mode] = train_mode(mode, rows, sft_path, args, out_dir)
                phase(f"train_{mode}", t0)
                t0 = time.perf_counter()
                _, evals, stats = rollout(
                    out_dir,
                    evaluation,
                    args,
                    judge,
                    work / f"eval-{mode}",
                    args.eval_n,
                    args.seed + 7,
                )
                report["evaluation"][mode] = {
                    "stats": stats,
                    "tables": tables(evals, evaluation, args.turns),
                }
                phase(f"evaluate_{mode}", t0)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report["phases_s"] = phases
    report["wall_s"] = round(time.perf_counter() - started, 1)
    budgets = {report["training"][m]["completions_sampled"] for m in modes if m in GRPO_MODES}
    report["budget_equal"] = len(budgets) <= 1
    if "offline" in modes:  # as many logged completions trained on as GRPO samples
        trained = report["training"]["offline"]["completions_trained"]
        report["offline_budget_equal"] = budgets <= {trained}
    (args.out / "learning_check.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_rewards(report, args.out / "reward_curves.png")
    plot_pass(report, args.out / "pass_at_1.png")
    plot_offline_curves(report, args.out / "offline_curves.png")
    text = render(report)
    (args.out / "REPORT.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
