"""The pipeline: data -> trajectories -> evaluation -> bandit dataset -> training -> evaluation,
each step a cached task of the flow it belongs to (docs/PIPELINE.md).

    python -m flows.pipeline                     # embedded default: synthetic problems, the tiny
                                                 # model fitted on CPU, ./runs, ephemeral Prefect
    python -m flows.pipeline --mode single_turn --max-steps 20 --storage s3://bucket/cobalt
    python -m flows.pipeline --mode offline       # the logged turns, no generation in training
    python -m flows.pipeline --model Qwen/Qwen3-8B --lora   # a Hub model, the paper's settings

Rerunning after a crash or a parameter change redoes only what changed: every stage is keyed by
its content. The run ends with a table of what each stage produced and a before/after table of
Pass@1 per turn; a stage that produces nothing fails the run and says why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prefect import flow

from cobalt.data import stages as data_stage
from cobalt.models import EMBEDDED, resolve_model
from cobalt.params import check_objects, deep_merge
from cobalt.pipeline import PipelineParams, PipelineSummary, check_sets, settings_text
from cobalt.pipeline.gpu_plan import RunPlan, plan_generation, plan_run
from cobalt.storage import open_storage
from cobalt.tables import markdown_table
from cobalt.training.stages import check_shared_storage, check_training, on_this_machine
from engines.machine import detect
from flows.cli import (
    add_refresh,
    add_sandbox_args,
    add_storage_args,
    add_work_dir,
    read_config,
    run_flow_cli,
    sandbox_values,
    storage_values,
)
from flows.data import data_flow
from flows.reward_hacking import reward_hacking_flow
from flows.training import training_flow
from flows.training_nodes import NODE_DEPLOYMENT, check_node_deployment, training_nodes_flow
from flows.training_options import add_training_args, training_values
from flows.trajectories import trajectories_flow
from tasks.pipeline import reference_model, report


def preflight(params: PipelineParams) -> tuple[str | None, RunPlan]:
    """Storage usable, every source present, the reference model resolved and the run's GPU plan
    decided (`cobalt.pipeline.gpu_plan`: every stage's GPUs, the clients they need, whether
    training fits), before any work: the model's local directory (a Hub model downloaded into
    the Hub cache once, a storage directory into work_dir; None for 'fitted' and 'tiny', built
    by the flow's task) and the plan."""
    open_storage(params.storage).check()
    plan_generation(params, None, detect())  # GPUs and clients first: the likeliest mistakes
    check_training(params.training)
    if params.training.nodes > 1:  # the nodes' jobs are placed through a Prefect deployment
        check_shared_storage(params.training, params.storage)
        check_node_deployment(NODE_DEPLOYMENT)
    data_stage.preflight(params.data())
    model = None
    if params.reference not in EMBEDDED:
        model = resolve_model(params.reference, params.storage, params.work_dir)
    return model, plan_run(params, model)


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams) -> PipelineSummary:
    """Problems -> reference trajectories -> bandit dataset -> GRPO (offline mode: offline
    dataset -> offline training) -> before/after Pass@1."""
    resolved, plan = preflight(params)  # the model named once: every stage loads its directory
    print(settings_text(params, plan.lines()))
    model = reference_model(params, resolved)
    data = data_flow.with_options(flow_run_name="data")(params.data())
    sets = check_sets(data, params)
    named = trajectories_flow.with_options
    collected = named(flow_run_name="trajectories")(
        params.trajectories(sets, params.train_table, model, "train")
    )
    before = named(flow_run_name="evaluation-before")(
        params.trajectories(sets, params.eval_table, model, "eval")
    )
    perturbed = None
    if params.bandit.perturbed_ratio > 0:  # METHOD §1.7: trajectories with wrong public tests
        perturbed = named(flow_run_name="trajectories-perturbed")(
            params.trajectories(sets, params.train_table, model, "train", perturbed=True)
        ).evaluation.uri
    training = params.training_params(collected.evaluation.uri, model, perturbed)
    if params.training.nodes > 1:  # one job a node (training-nodes); the policy comes back here
        placed = training_nodes_flow.with_options(flow_run_name="training")(training)
        trained = on_this_machine(placed.summary, params.storage, params.work_dir)
    else:
        trained = training_flow.with_options(flow_run_name="training")(training)
    after = named(flow_run_name="evaluation-after")(
        params.trajectories(sets, params.eval_table, trained.model, "eval")
    )
    hacking = None
    if params.reward_hacking:  # METHOD §1.7: the same analysis of both policies, then compared
        analyse = reward_hacking_flow.with_options
        reference = analyse(flow_run_name="reward-hacking-reference")(
            params.hacking(sets, model, model, label="reference")
        )
        hacking = (
            reference,
            analyse(flow_run_name="reward-hacking-trained")(
                params.hacking(sets, trained.model, model, compare=reference.uri, label="trained")
            ),
        )
    return report(params, data, collected, before, trained, after, hacking)


# --- CLI ------------------------------------------------------------------------------------------

EPILOG = """\
Two presets decide the settings that flags and --config leave unset:
  tiny   the embedded run (default for --model fitted|tiny, or a directory the tiny fit made):
         samples/synthetic_{train,test}.jsonl, a ~1M-parameter model fitted on CPU for
         --fit-steps to 24 of the 30 synthetic kinds,
         8 samples x 2 feedback turns of 128 tokens, 2 evaluation turns, 32 GRPO steps of 32
         completions (--mode offline: one epoch over the logged turns, objective --objective,
         batch 16).
  paper  METHOD §1.2-§1.6 (default for any other model): 16 samples x 2 feedback turns of
         up to 6144 tokens with the paper's system prompt, 8 evaluation turns, contexts up to
         10,000 tokens, the paper GRPO preset (lr 1e-6, 16 samples per prompt, fp32 master
         weights with bf16 compute, k2 KL 1e-4, 2 epochs; --lora on one GPU).
The engine of every generating stage is --engine (auto: vLLM on a GPU where it is installed,
else transformers); vLLM generates on every visible GPU. --gpus N puts generation on N GPUs and
training on N processes (--sharding: how they share the model); training runs after generation,
in processes of its own. The run prints the settings it uses before it starts.

--model names the reference model: a Hub id (org/name[@revision]; downloaded once into the Hub
cache, or found there under HF_HUB_OFFLINE=1), a model directory, a model directory in storage
(a trained policy, s3://bucket/prefix/training/<key>, as a run's summary prints it), fitted or
tiny. The run ends with the trained policy's name, which --model of a later run takes.

A real run on one GPU (TACO-verified for training, LiveCodeBench v6 for evaluation):
  python -m flows.pipeline --model Qwen/Qwen3-8B --lora \\
      --source hf:likaixin/TACO-verified --source 'hf:livecodebench/code_generation_lite?version_tag=v6'
The paper's own run, full fine-tuning on a 4-GPU node (FSDP, vLLM colocated on every GPU):
  python -m flows.pipeline --model /models/Qwen3-8B --gpus 4 --sharding fsdp --source ...
Training on 2 such nodes (a Prefect server, a gpu-pool worker on each node's queue node-<rank>,
`prefect deploy -n training-node`; docs/DEPLOYMENT.md 7d), the rest on this machine:
  python -m flows.pipeline --model /models/Qwen3-8B --gpus 4 --nodes 2 \\
      --rdzv-endpoint 10.0.0.1:29500 --storage s3://bucket/runs --source ...
Other sources as in the data flow (--source URI[:KIND][?key=value]). Any field of PipelineParams
via --config FILE.json (nested objects merge over the preset's; flags override the file).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the whole Cobalt pipeline: problem sets, reference trajectories, "
        "evaluation, bandit dataset, GRPO training (or offline training on the logged turns), "
        "evaluation of the trained policy.",
        epilog=EPILOG,
    )
    arg = parser.add_argument
    arg("--config", type=Path, help="JSON file with PipelineParams fields (flags override it)")
    arg(
        "--engine",
        choices=["auto", "transformers", "vllm", "litellm"],
        help="engine of every generating stage (auto)",
    )
    arg("--api-base", metavar="URL", help="litellm: an OpenAI-compatible server")
    arg("--source", action="append", metavar="URI[:KIND]", help="data source (repeatable)")
    arg("--fit-steps", type=int, help="optimizer steps of the tiny model's fit (240)")
    arg(
        "--train-limit",
        type=int,
        metavar="N",
        help="only the first N training problems (flows.trajectories' --limit)",
    )
    arg(
        "--eval-limit",
        type=int,
        metavar="N",
        help="only the first N evaluation problems (flows.trajectories' --limit)",
    )
    arg("--n", type=int, help="samples per problem (tiny 8, paper 16)")
    arg("--eval-turns", type=int, help="feedback turns when evaluating (tiny 2, paper 8)")
    arg("--eval-samples", type=int, help="samples per problem when evaluating (default: --n)")
    arg("--max-new-tokens", type=int, help="tokens per turn (tiny 128, paper 6144)")
    add_training_args(parser, "pipeline")
    arg(
        "--reward-hacking",
        action="store_true",
        help="after training: reward-hacking analysis of the reference and the trained policy",
    )
    arg(
        "--hacking-table",
        help="perturbed set analysed: train (default) or dev (flows.reward_hacking's --table)",
    )
    arg(
        "--hacking-limit",
        type=int,
        metavar="N",
        help="only the first N problems of the analysis (flows.reward_hacking's --limit)",
    )
    arg("--device", help="transformers: torch device (auto)")
    add_sandbox_args(parser)
    add_storage_args(parser)
    add_work_dir(parser)
    arg("--cluster", metavar="ADDRESS", help="trajectory shards on a Dask cluster (or local:N)")
    add_refresh(parser)
    return parser


def parse_params(argv: list[str] | None = None) -> PipelineParams:
    parser = build_parser()
    args = parser.parse_args(argv)

    config = read_config(args.config)
    values: dict[str, Any] = {}  # the flags, merged over the --config file's at the end
    training_values(args, values, "pipeline", parser.error)
    for flag in ("fit_steps", "train_limit", "eval_limit", "eval_turns", "eval_samples"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.source:
        values["sources"] = args.source
    for flag in ("work_dir", "cluster", "hacking_table", "hacking_limit"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.refresh:
        values["refresh"] = True
    if args.reward_hacking:
        values["reward_hacking"] = True
    engine = values.setdefault("engine", {})
    for flag, field in (
        ("engine", "kind"),
        ("api_base", "api_base"),
        ("device", "device"),
    ):
        if getattr(args, flag) is not None:
            engine[field] = getattr(args, flag)
    if args.gpus is not None and engine.get("kind") not in ("transformers", "litellm"):
        engine["data_parallel_size"] = args.gpus  # vLLM's engines only
    collect = values.setdefault("collect", {})
    if args.n is not None:
        collect.setdefault("sampling", {})["n"] = args.n
    if args.max_new_tokens is not None:
        collect.setdefault("sampling", {})["max_new_tokens"] = args.max_new_tokens
    sandbox_values(args, values)
    storage_values(args, values)
    for field in ("engine", "collect", "training", "storage"):  # nothing given: the preset's
        if not values.get(field):
            values.pop(field, None)
    check_objects(config, values)
    return PipelineParams.model_validate(deep_merge(config, values))


def render(summary: PipelineSummary) -> str:
    text = (
        f"\n{summary.line}\n\n{markdown_table(summary.stages)}\n\n"
        f"{markdown_table(summary.before_after)}\n\nplot: {summary.plot}\n"
        f"trained policy (a name --model takes): {summary.policy}"
    )
    if summary.reward_hacking:
        text += (
            f"\n\nreward hacking, reference vs trained:\n\n"
            f"{markdown_table(summary.reward_hacking)}\n\nplot: {summary.reward_hacking_plot}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    return run_flow_cli(
        lambda: parse_params(argv),
        preflight,
        pipeline_flow,
        render,
    )


if __name__ == "__main__":
    sys.exit(main())
