"""Training flow: a finished trajectories run -> Cobalt bandit dataset -> GRPO with the sandbox
reward (TRL's GRPOTrainer) -> a trained policy in storage (issue 5, SPEC §1.4-§1.6;
docs/TRAINING.md); or, with `--mode offline` (issue 11, SPEC §2), the logged turns and their
rewards -> an offline objective (transformers' Trainer), no generation and no sandbox.

    python -m flows.training                            # latest trajectories, their model
    python -m flows.training --mode single_turn --max-steps 20
    python -m flows.training --mode offline --objective awr --offline awr_beta=0.5
    python -m flows.training --trajectories runs/trajectories/evaluation/<key> \\
        --model /models/Qwen3-8B --preset paper --gpus 4 --sharding fsdp
    python -m flows.training --storage s3://bucket/runs --preset paper --gpus 4 --nodes 2 \\
        --node-rank R --rdzv-endpoint 10.0.0.1:29500 ...    # the same command on each node
    python -m flows.training --storage /nfs/runs --shared-storage --nodes 2 ...  # one mount

Stages, each a cached task with a content-addressed result in storage (MANIFEST.json last):
`bandit` (<storage>/bandit/<key>/data.parquet) -> `training` (<storage>/training/<key>/: the
model, log_history.json, rewards.png; checkpoints while it runs, resumed after a crash); offline:
`offline-dataset` (<storage>/offline/<key>/data.parquet) -> `offline-training` (the same
directory layout, curves.png: loss and weighted advantage per step).
The run ends with the trained policy's name (its directory in storage, local or s3://): evaluate
it with `python -m flows.trajectories --evaluation --model <that name>`, train on from it with
`--model <that name>`; the pipeline flow (`flows/pipeline.py`) evaluates it and writes the
before/after table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from prefect import flow

from cobalt.storage import open_storage
from cobalt.training.config import DEFAULT_OBJECTIVE, MODES, OBJECTIVES
from cobalt.training.precision import PRECISIONS
from cobalt.training.sharding import SHARDINGS
from cobalt.training.stages import TrainingParams, TrainingSummary, preflight
from flows.cli import (
    add_fsdp_args,
    add_passes_args,
    add_report_to,
    add_storage_args,
    passes_values,
    read_config,
    report_to,
    run_flow_cli,
    storage_values,
)
from tasks.training import Stages, report


@flow(name="training", log_prints=True)
def training_flow(params: TrainingParams) -> TrainingSummary:
    """Trajectories -> bandit dataset -> GRPO training (offline mode: offline dataset -> offline
    training) -> trained policy, curves, stats, cost."""
    ready = preflight(params)  # storage, trajectories, policy model, GPU plan: before any work
    if ready.plan is not None:
        print(f"training plan: {ready.plan.describe()}")
    stages = Stages(params, ready)
    dataset = stages.dataset()
    policy = stages.training(dataset)
    summary = report(params, dataset, policy)
    if params.summary_uri and params.training.node_rank == 0:  # for the training-nodes flow
        open_storage(params.storage).write_atomic(
            params.summary_uri, summary.model_dump_json().encode()
        )
    return summary


EPILOG = f"""\
trajectories (--trajectories): 'latest' (the newest trajectories run in --storage) or the
directory of a finished evaluation stage, <storage>/trajectories/evaluation/<key>.
model (--model): a Hub id (org/name[@revision]), a model directory, a model directory in storage
(a trained policy), fitted or tiny; default: the model that collected the trajectories.

presets: tiny (a few CPU steps on a tiny model) and paper (SPEC §1.6 mapped to TRL's GRPOConfig:
16 samples per prompt, lr 1e-6, clip 0.2/0.4, KL 1e-4, 6144 new tokens, 2 epochs). Any other
GRPOConfig field via --set KEY=JSON, e.g. --set max_completion_length=256 --set use_vllm=true.

offline mode: every logged turn of the trajectories with its Cobalt reward and leave-one-out
advantage; objectives {", ".join(OBJECTIVES)} (--objective; default {DEFAULT_OBJECTIVE}). Any field of
training.offline via --offline KEY=JSON (awr_beta, awr_max_weight, ratio_clip, ratio_clip_high,
learning_rate, epochs, batch_size, gradient_accumulation_steps, max_length,
drop_zero_advantage); --set KEY=JSON then sets TrainingArguments fields.
"""


def parse_params(argv: list[str] | None = None) -> TrainingParams:
    parser = argparse.ArgumentParser(
        prog="python -m flows.training",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build the Cobalt contextual-bandit dataset from a trajectories run and train "
        "the policy on it with GRPO (TRL) against the sandbox reward, or (--mode offline) train "
        "it on the logged turns and their rewards without generating.",
        epilog=EPILOG,
    )
    arg = parser.add_argument
    arg("--config", type=Path, help="JSON file with TrainingParams fields (flags override it)")
    arg("--trajectories", metavar="WHERE", help="'latest' (default) or an evaluation stage dir")
    arg("--model", metavar="NAME", help="policy to train (default: the trajectories' model)")
    arg(
        "--mode",
        choices=MODES,
        help="GRPO on the bandit contexts (cobalt) or the turn-0 prompts only (single_turn); "
        "multi_turn: online GRPO over whole repair conversations; offline: the logged turns",
    )
    arg("--reward", choices=["correctness", "dense"], help="dense: + VeRPO-style test weights")
    arg("--turns", type=int, help="multi_turn: feedback turns per conversation (2)")
    arg("--precision", choices=PRECISIONS, help="numerics (auto: mixed on GPU + paper preset)")
    add_report_to(parser)
    arg("--objective", choices=OBJECTIVES, help=f"offline objective ({DEFAULT_OBJECTIVE})")
    arg("--offline", action="append", default=[], metavar="KEY=JSON", help="offline setting")
    arg("--preset", choices=["tiny", "paper"], help="GRPOConfig preset (tiny)")
    arg("--max-steps", type=int, help="optimizer steps (overrides the preset)")
    arg("--save-steps", type=int, help="checkpoint every N steps (resume after a crash)")
    arg(
        "--gpus",
        "--num-processes",
        dest="num_processes",
        type=int,
        metavar="N",
        help="GPUs to train on, one process each (accelerate launch; 1)",
    )
    arg(
        "--sharding",
        choices=SHARDINGS,
        help="how the GPUs share the model: ddp, fsdp, zero3, hybrid (FSDP within each node, "
        "nodes replicate) (auto: fsdp for full fine-tuning on several GPUs, else ddp)",
    )
    add_fsdp_args(parser)
    add_passes_args(parser)
    arg("--accelerate-config", metavar="FILE", help="an accelerate config of your own instead")
    arg("--nodes", type=int, help="machines to train on, --gpus processes each (1)")
    arg("--node-rank", type=int, help="this machine's rank among --nodes (0 hosts the rendezvous)")
    arg("--rdzv-endpoint", metavar="HOST:PORT", help="where the nodes meet: node 0's address")
    arg("--lora", action="store_true", help="train LoRA adapters (r 16, all linear layers)")
    arg("--format-reward", action="store_true", help="add the thinking-model format reward")
    arg("--set", action="append", default=[], metavar="KEY=JSON", help="extra GRPOConfig field")
    arg("--max-prompt-tokens", type=int, help="bandit: longest partial context (10000)")
    arg("--bandit-mode", choices=["train", "validation"], help="bandit sample selection (train)")
    arg("--perturbed", metavar="DIR", help="evaluation stage of a perturbed-feedback run")
    arg("--perturbed-ratio", type=float, help="share of repair contexts taken from --perturbed")
    arg("--backend", choices=["auto", "docker", "namespace"], help="sandbox isolation (auto)")
    arg("--sandbox-concurrency", type=int, help="programs judged at once (CPU count)")
    add_storage_args(parser)
    arg("--work-dir", metavar="DIR", help="local checkpoints/models for S3 runs (~/.cache/cobalt)")
    arg("--refresh", action="store_true", help="recompute every stage")
    args = parser.parse_args(argv)

    values = read_config(args.config)
    for flag in ("trajectories", "model", "work_dir", "perturbed"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.refresh:
        values["refresh"] = True
    training = values.setdefault("training", {})
    for flag, name in (
        ("mode", "mode"),
        ("preset", "preset"),
        ("max_steps", "max_steps"),
        ("save_steps", "save_steps"),
        ("num_processes", "num_processes"),
        ("sharding", "sharding"),
        ("fsdp_gather", "fsdp_gather"),
        ("gradient_sync", "gradient_sync"),
        ("accelerate_config", "accelerate_config"),
        ("nodes", "nodes"),
        ("node_rank", "node_rank"),
        ("rdzv_endpoint", "rdzv_endpoint"),
        ("reward", "reward"),
        ("turns", "turns"),
        ("precision", "precision"),
    ):
        if getattr(args, flag) is not None:
            training[name] = getattr(args, flag)
    if report_to(args) is not None:
        training["report_to"] = report_to(args)
    if args.format_reward:
        training["use_format_reward"] = True
    passes_values(args, training)
    if args.lora:
        training["lora"] = training.get("lora") or {}
    offline = training.setdefault("offline", {})
    if args.objective is not None:
        offline["objective"] = args.objective
    for item in args.offline:
        key, sep, text = item.partition("=")
        if not sep or not key:
            parser.error(f"--offline {item!r}: use KEY=JSON, e.g. --offline awr_beta=0.5")
        try:
            offline[key] = json.loads(text)
        except json.JSONDecodeError:
            offline[key] = text
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: use KEY=JSON, e.g. --set max_completion_length=256")
        try:
            training.setdefault("overrides", {})[key] = json.loads(text)
        except json.JSONDecodeError:
            training.setdefault("overrides", {})[key] = text
    bandit = values.setdefault("bandit", {})
    if args.max_prompt_tokens is not None:
        bandit["max_prompt_tokens"] = args.max_prompt_tokens
    if args.bandit_mode is not None:
        bandit["mode"] = args.bandit_mode
    if args.perturbed_ratio is not None:
        bandit["perturbed_ratio"] = args.perturbed_ratio
    if args.backend is not None:
        values.setdefault("sandbox", {})["backend"] = args.backend
    if args.sandbox_concurrency is not None:
        values.setdefault("sandbox", {})["concurrency"] = args.sandbox_concurrency
    storage_values(args, values)
    return TrainingParams.model_validate(values)


def main(argv: list[str] | None = None) -> int:
    return run_flow_cli(
        lambda: parse_params(argv),
        preflight,
        training_flow,
        lambda s: f"\n{s.line}\n\npolicy (--model): {s.policy.uri}\ncurves: {s.policy.plot}",
    )


if __name__ == "__main__":
    sys.exit(main())
