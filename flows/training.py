"""Training flow: a finished trajectories run -> Cobalt bandit dataset -> GRPO with the sandbox
reward (TRL's GRPOTrainer) -> a trained policy in storage (METHOD §1.4-§1.6;
docs/TRAINING.md); or, with `--mode offline` (METHOD §2), the logged turns and their
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
import sys
from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import ValidationError

from cobalt.pipeline.params import preset_for
from cobalt.pipeline.settings_text import training_settings_text
from cobalt.storage import StorageConfig, open_storage
from cobalt.training.settings import DEFAULT_OBJECTIVE, OBJECTIVES
from cobalt.training.stages import Ready, TrainingParams, TrainingSummary, preflight
from cobalt.trajectories.runs import find_trajectories
from flows.cli import (
    USER_ERRORS,
    add_refresh,
    add_sandbox_args,
    add_storage_args,
    add_work_dir,
    read_config,
    run_flow_cli,
    sandbox_values,
    storage_values,
)
from flows.training_options import add_training_args, training_values
from tasks.training import Stages, report


@flow(name="training", log_prints=True)
def training_flow(params: TrainingParams) -> TrainingSummary:
    """Trajectories -> bandit dataset -> GRPO training (offline mode: offline dataset -> offline
    training) -> trained policy, curves, stats, cost."""
    ready = preflight(params)  # storage, trajectories, policy model, GPU plan: before any work
    print(settings(params, ready))
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

presets: tiny (a few CPU steps on a tiny model) and paper (METHOD §1.6 mapped to TRL's GRPOConfig:
16 samples per prompt, lr 1e-6, clip 0.2/0.4, KL 1e-4, 6144 new tokens, 2 epochs). Unless
--preset names one, the policy decides, as in flows.pipeline: tiny for fitted, tiny or a
directory the tiny fit made, paper for any other model. The run prints the settings it uses
before it starts. Any other GRPOConfig field via --set KEY=JSON, e.g. --set
max_completion_length=256 --set use_vllm=true.

offline mode: every logged turn of the trajectories with its Cobalt reward and leave-one-out
advantage; objectives {", ".join(OBJECTIVES)} (--objective; default {DEFAULT_OBJECTIVE}). Any field
of training.offline via --offline KEY=JSON (awr_beta, awr_max_weight, ratio_clip, ratio_clip_high,
learning_rate, epochs, batch_size, gradient_accumulation_steps, max_length,
drop_zero_advantage); --set KEY=JSON then sets TrainingArguments fields.
"""


def build_parser(prog: str = "python -m flows.training") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build the Cobalt contextual-bandit dataset from a trajectories run and train "
        "the policy on it with GRPO (TRL) against the sandbox reward, or (--mode offline) train "
        "it on the logged turns and their rewards without generating.",
        epilog=EPILOG,
    )
    parser.add_argument(
        "--config", type=Path, help="JSON file with TrainingParams fields (flags override it)"
    )
    add_training_args(parser, "training")
    add_sandbox_args(parser)
    add_storage_args(parser)
    add_work_dir(parser)
    add_refresh(parser)
    return parser


def parse_params(argv: list[str] | None = None, *, find_model: bool = False) -> TrainingParams:
    """The training flow's parameters from its command line (flags over a --config file's);
    `find_model`: see `choose_preset`."""
    parser = build_parser()
    return params_from(parser.parse_args(argv), parser, find_model=find_model)


def params_from(
    args: argparse.Namespace, parser: argparse.ArgumentParser, *, find_model: bool = False
) -> TrainingParams:
    values = read_config(args.config)
    training_values(args, values, "training", parser.error)
    if args.refresh:
        values["refresh"] = True
    if args.work_dir is not None:
        values["work_dir"] = args.work_dir
    sandbox_values(args, values)
    storage_values(args, values)
    choose_preset(values, find_model)
    return TrainingParams.model_validate(values)


def choose_preset(values: dict[str, Any], find_model: bool) -> None:
    """training.preset, where neither a flag nor the --config file names one: the preset the
    pipeline picks for the policy (`preset_for`: tiny for the embedded models, paper for any
    other), the policy being --model, else (`find_model`, the command's own run: a read of the
    storage) the model that collected the trajectories. Trajectories not found leave it unset:
    the preflight then says what is wrong, after the settings' own mistakes."""
    training = values.setdefault("training", {})
    if not isinstance(training, dict) or training.get("preset") is not None:
        return  # given, or a mistake that the validation names
    model = values.get("model")
    where = values.get("trajectories") or "latest"
    if model is None and find_model and isinstance(where, str):
        try:
            storage = StorageConfig.model_validate(values.get("storage") or {})
            found = find_trajectories(where, storage)
        except (ValidationError, *USER_ERRORS):
            return
        model = found.engine.get("model")
    if isinstance(model, str) and model:
        training["preset"] = preset_for(model)


def settings(params: TrainingParams, ready: Ready) -> str:
    """What the run will use: its settings and, when it has one, its GPU plan."""
    plan = [f"training plan: {ready.plan.describe()}"] if ready.plan is not None else None
    found = ready.trajectories.evaluation.uri
    return training_settings_text(params, ready.model, plan, found)


def main(argv: list[str] | None = None) -> int:
    return run_flow_cli(
        lambda: parse_params(argv, find_model=True),
        preflight,
        training_flow,
        lambda s: f"\n{s.line}\n\npolicy (--model): {s.policy.uri}\ncurves: {s.policy.plot}",
    )


if __name__ == "__main__":
    sys.exit(main())
