"""The pipeline: data -> trajectories -> evaluation -> bandit dataset -> training -> evaluation,
each step a cached task of the flow it belongs to (issue 5; docs/PIPELINE.md).

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
import json
import sys
from pathlib import Path
from typing import Any

from prefect import flow

from cobalt.data import stages as data_stage
from cobalt.models import EMBEDDED, FITTED, resolve_model
from cobalt.params import check_objects, deep_merge
from cobalt.pipeline import PipelineParams, PipelineSummary, check_sets, settings_text
from cobalt.pipeline.gpu_plan import RunPlan, plan_generation, plan_run
from cobalt.storage import open_storage
from cobalt.tables import markdown_table
from cobalt.training.config import DEFAULT_OBJECTIVE, MODES, OBJECTIVES
from cobalt.training.precision import PRECISIONS
from cobalt.training.sharding import SHARDINGS
from cobalt.training.stages import check_shared_storage, check_training, on_this_machine
from engines.machine import detect
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
from flows.data import data_flow
from flows.reward_hacking import reward_hacking_flow
from flows.training import training_flow
from flows.training_nodes import NODE_DEPLOYMENT, check_node_deployment, training_nodes_flow
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
    if params.bandit.perturbed_ratio > 0:  # SPEC §1.7: trajectories with wrong public tests
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
    if params.reward_hacking:  # SPEC §1.7: the same analysis of both policies, then compared
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
  paper  SPEC §1.2-§1.6 (default for any other model): 16 samples x 2 feedback turns of
         up to 6144 tokens with the SPEC's system prompt, 8 evaluation turns, contexts up to
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


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_params(argv: list[str] | None = None) -> PipelineParams:
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the whole Cobalt pipeline: problem sets, reference trajectories, "
        "evaluation, bandit dataset, GRPO training (or offline training on the logged turns), "
        "evaluation of the trained policy.",
        epilog=EPILOG,
    )
    arg = parser.add_argument
    arg("--config", type=Path, help="JSON file with PipelineParams fields")
    arg(
        "--preset",
        choices=["tiny", "paper"],
        help="settings preset (tiny for the embedded models, paper for any other model)",
    )
    arg(
        "--model",
        "--reference",
        dest="reference",
        metavar="NAME",
        help=f"the reference model, and the policy trained from it: {FITTED} (default), tiny, "
        "a Hub id (org/name[@revision]), a model directory or a storage URI (below)",
    )
    arg(
        "--engine",
        choices=["auto", "transformers", "vllm", "litellm"],
        help="engine of every generating stage (auto)",
    )
    arg("--api-base", metavar="URL", help="litellm: an OpenAI-compatible server")
    arg("--source", action="append", metavar="URI[:KIND]", help="data source (repeatable)")
    arg("--fit-steps", type=int, help="optimizer steps of the tiny model's fit (240)")
    arg("--train-limit", type=int, help="only the first N training problems")
    arg("--eval-limit", type=int, help="only the first N evaluation problems")
    arg("--n", type=int, help="samples per problem (tiny 8, paper 16)")
    arg("--turns", type=int, help="feedback turns of the training trajectories (2)")
    arg("--eval-turns", type=int, help="feedback turns when evaluating (tiny 2, paper 8)")
    arg("--eval-samples", type=int, help="samples per problem when evaluating (default: --n)")
    arg("--max-new-tokens", type=int, help="tokens per turn (tiny 128, paper 6144)")
    arg("--mode", choices=MODES, help="training mode (cobalt)")
    arg("--objective", choices=OBJECTIVES, help=f"offline objective ({DEFAULT_OBJECTIVE})")
    arg("--reward", choices=["correctness", "dense"], help="GRPO reward (correctness)")
    arg("--max-steps", type=int, help="optimizer steps (tiny GRPO: 32; offline: one epoch)")
    arg("--lora", action="store_true", help="train LoRA adapters (r 16, all linear layers)")
    arg(
        "--gpus",
        type=int,
        metavar="N",
        help="GPUs of the run: vLLM's generating stages on N (one engine each; default every "
        "visible GPU) and training on N processes (default 1)",
    )
    arg(
        "--sharding",
        choices=SHARDINGS,
        help="how the training GPUs share the model: ddp, fsdp, zero3, hybrid (FSDP within "
        "each node, nodes replicate) (auto: fsdp for full fine-tuning on several GPUs, else ddp)",
    )
    add_fsdp_args(parser)
    add_passes_args(parser)
    arg("--precision", choices=PRECISIONS, help="training numerics (auto)")
    arg(
        "--nodes",
        type=int,
        help="machines to train on, --gpus processes each (1): one job a node, placed through "
        "the training-node deployment on the GPU pool's queues node-0, node-1, ... (shared "
        "storage: --storage s3://...)",
    )
    arg("--rdzv-endpoint", metavar="HOST:PORT", help="where the nodes meet: node 0's address")
    add_report_to(parser)
    arg(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a GRPOConfig field (offline: TrainingArguments), e.g. --set learning_rate=2e-6",
    )
    arg("--perturbed-ratio", type=float, help="share of repair contexts from perturbed feedback")
    arg(
        "--reward-hacking",
        action="store_true",
        help="after training: reward-hacking analysis of the reference and the trained policy",
    )
    arg("--hacking-table", help="perturbed set analysed: train (default) or dev")
    arg("--hacking-limit", type=int, help="only the first N problems of the analysis")
    arg("--device", help="transformers: torch device (auto)")
    arg("--backend", choices=["auto", "docker", "namespace"], help="sandbox isolation (auto)")
    arg("--sandbox-concurrency", type=int, help="programs judged at once (CPU count)")
    add_storage_args(parser)
    arg("--work-dir", metavar="DIR", help="local models/spools for S3 runs (~/.cache/cobalt)")
    arg("--cluster", metavar="ADDRESS", help="trajectory shards on a Dask cluster (or local:N)")
    arg("--refresh", action="store_true", help="recompute every stage")
    args = parser.parse_args(argv)

    config = read_config(args.config)
    values: dict[str, Any] = {}  # the flags, merged over the --config file's at the end
    for flag in (
        "preset",
        "reference",
        "fit_steps",
        "train_limit",
        "eval_limit",
        "eval_turns",
        "eval_samples",
    ):
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
    collect = values.setdefault("collect", {})
    if args.n is not None:
        collect.setdefault("sampling", {})["n"] = args.n
    if args.max_new_tokens is not None:
        collect.setdefault("sampling", {})["max_new_tokens"] = args.max_new_tokens
    if args.turns is not None:
        collect["turns"] = args.turns
    training = values.setdefault("training", {})
    for flag in ("mode", "max_steps", "reward", "precision", "sharding", "fsdp_gather",
                 "gradient_sync", "nodes", "rdzv_endpoint"):  # fmt: skip
        if getattr(args, flag) is not None:
            training[flag] = getattr(args, flag)
    if args.gpus is not None:
        training["num_processes"] = args.gpus
        if engine.get("kind") not in ("transformers", "litellm"):  # vLLM's engines only
            engine["data_parallel_size"] = args.gpus
    if args.objective:
        training.setdefault("offline", {})["objective"] = args.objective
    if args.lora:
        training["lora"] = {}
    passes_values(args, training)
    if report_to(args) is not None:
        training["report_to"] = report_to(args)
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: use KEY=JSON, e.g. --set max_completion_length=256")
        training.setdefault("overrides", {})[key] = _json_value(text)
    if args.perturbed_ratio is not None:
        values.setdefault("bandit", {})["perturbed_ratio"] = args.perturbed_ratio
    if args.backend is not None:
        values.setdefault("sandbox", {})["backend"] = args.backend
    if args.sandbox_concurrency is not None:
        values.setdefault("sandbox", {})["concurrency"] = args.sandbox_concurrency
    storage_values(args, values)
    for field in ("engine", "collect", "training", "storage"):  # nothing given: the preset's
        if not values[field]:
            del values[field]
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
