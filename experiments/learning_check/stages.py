"""The learning check's stages before training, each built from the repo's own pieces: the
problems of each kind group, the SFT fit (`cobalt.reference.fit_tiny_model`), trajectories and
their per-turn evaluation (`collect_initial` + `collect_multiturn` + `evaluate`), and what an
evaluation leaves for the aggregate: every problem's correct samples per turn under both
protocols, the repair transitions, fingerprints of texts and weights. Training: `training`."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cobalt.analysis.transitions import transitions
from cobalt.data import synthetic
from cobalt.problems import Problem
from cobalt.trajectories.collect import (
    BatchConfig,
    CollectConfig,
    collect_initial,
    collect_multiturn,
)
from cobalt.trajectories.evaluation import EvalRecord, evaluate, stop_on_public_pass
from cobalt.trajectories.records import Record
from engines import EngineConfig, SamplingConfig, make_engine
from experiments.learning_check.kinds import GROUPS, KIND_GROUPS, SFT_HELD_OUT
from sandbox import SandboxConfig, SyncJudge


def labelled(problems: Sequence[Problem], label: str) -> list[Problem]:
    return [p.model_copy(update={"difficulty": label}) for p in problems]


def rl_problems(args: argparse.Namespace) -> list[Problem]:
    """The RL-kind problems of the reference trajectories (every RL kind in turn)."""
    problems = synthetic.make_problems(KIND_GROUPS["rl_kinds"], args.rl_problems, args.seed + 1000)
    return labelled(problems, "rl_kinds")


def eval_problems(args: argparse.Namespace) -> list[Problem]:
    """Fresh problems (a seed no other stage uses) of the three groups, every kind in turn."""
    seed = args.seed + 2000
    out: list[Problem] = []
    for group in GROUPS:
        count = args.eval_sft_problems if group == "sft_kinds" else args.eval_problems
        out += labelled(synthetic.make_problems(KIND_GROUPS[group], count, seed=seed), group)
    return out


def fit(args: argparse.Namespace, path: Path, device: str) -> dict[str, Any]:
    from cobalt.reference import RECIPE_FILE, fit_tiny_model

    fit_tiny_model(
        path,
        seed=args.seed,
        seconds_budget=args.sft_seconds,
        max_steps=args.sft_steps or None,
        n_examples=args.sft_examples,
        held_out=SFT_HELD_OUT,
        kinds=synthetic.ALL_KINDS,
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
        save_dtype=getattr(args, "sft_save_dtype", "float32"),
        repair_share=getattr(args, "sft_repair_share", 0.25),
        keep_share=getattr(args, "sft_keep_share", 0.25),
    )
    recipe = json.loads((path / RECIPE_FILE).read_text())
    stats = dict(recipe.get("stats", {}))
    steps_per_epoch = -(-args.sft_examples // args.sft_batch)
    stats["epochs"] = round(stats.get("steps", 0) / steps_per_epoch, 2)
    return {"recipe": {k: v for k, v in recipe.items() if k != "stats"}, "stats": stats}


def sandbox_config(args: argparse.Namespace) -> SandboxConfig:
    return SandboxConfig(backend=args.backend, concurrency=args.sandbox_concurrency)


def rollout(
    model: Path,
    problems: Sequence[Problem],
    args: argparse.Namespace,
    judge: SyncJudge,
    work: Path,
    n: int,
    seed: int,
) -> tuple[dict[str, Record], dict[str, EvalRecord], dict[str, Any]]:
    """Trajectories (turn 0 + feedback turns, METHOD §1.2 with no system prompt) and their
    per-turn evaluation on all tests; same problems and seed, same sampled stream."""
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


# --- what an evaluation leaves -------------------------------------------------------------------


def _normal(code: str | None) -> str:
    return "\n".join(line.strip() for line in (code or "").splitlines() if line.strip())


_REFERENCE = {_normal(synthetic.reference_solution(k)): k for k in synthetic.ALL_KINDS}


def program_class(kind: str, code: str | None) -> str:
    """What a program written for a problem of `kind` is, by its text: the kind's own reference
    program, another kind's (same format / same operation / neither), or none of them."""
    other = _REFERENCE.get(_normal(code))
    if other is None:
        return "not a reference program"
    if other == kind:
        return "its own reference"
    op, fmt = kind.split("/")
    if other.endswith("/" + fmt):
        return "another operation's reference, same format"
    if other.startswith(op + "/"):
        return "same operation, another format"
    return "another kind's reference"


def evaluation_result(
    problems: Sequence[Problem],
    records: dict[str, Record],
    evals: dict[str, EvalRecord],
    stats: dict[str, Any],
) -> dict[str, Any]:
    """Per problem: group, kind, samples n and correct samples per turn under METHOD §1.2 (`c`) and
    stop-on-public-pass (`c_stop`); the repair transitions; a fingerprint of every generated
    text (equal fingerprints: the same trajectories)."""
    stopped = stop_on_public_pass(evals, records)
    kinds = {p.id: synthetic.kind_of(p) for p in problems}
    out: dict[str, Any] = {}
    for p in problems:
        e = evals.get(p.id)
        if e is None or not e.results:
            continue
        turns = len(e.results[0])
        out[p.id] = {
            "group": p.difficulty,
            "kind": kinds[p.id],
            "n": len(e.results),
            "c": [sum(row[t].correct for row in e.results) for t in range(turns)],
            "c_stop": [sum(row[t].correct for row in stopped[p.id].results) for t in range(turns)],
        }
    return {
        "stats": stats,
        "problems": out,
        "transitions": transitions(
            evals, records, classify=lambda pid, code: program_class(kinds[pid], code)
        ),
        "fingerprint": texts_fingerprint(records),
    }


def texts_fingerprint(records: dict[str, Record]) -> str:
    digest = hashlib.sha256()
    for pid in sorted(records):
        for sample in records[pid].samples:
            for turn in sample.turns:
                digest.update(f"{pid}|{sample.index}|{turn.turn}|{turn.response}\n".encode())
    return digest.hexdigest()[:16]


def weights_fingerprint(model_dir: Path) -> str | None:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
