"""The pipeline: data -> trajectories -> evaluation -> bandit dataset -> training -> evaluation,
each step a cached task of the flow it belongs to (issue 5; docs/PIPELINE.md).

    python -m flows.pipeline                     # embedded default: synthetic problems, the tiny
                                                 # model fitted on CPU, ./runs, ephemeral Prefect
    python -m flows.pipeline --mode single_turn --max-steps 20 --storage s3://bucket/cobalt
    python -m flows.pipeline --mode offline       # the logged turns, no generation in training

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
from cobalt.pipeline import PipelineParams, PipelineSummary, check_sets, tiny_training
from cobalt.reference import FITTED, check_reference
from cobalt.storage import open_storage
from cobalt.tables import markdown_table
from cobalt.training.config import DEFAULT_OBJECTIVE, OBJECTIVES
from cobalt.training.stages import check_training
from flows.cli import add_storage_args, run_flow_cli, storage_values
from flows.data import data_flow
from flows.reward_hacking import reward_hacking_flow
from flows.training import training_flow
from flows.trajectories import trajectories_flow
from tasks.pipeline import reference_model, report


def preflight(params: PipelineParams) -> None:
    """Storage usable and every source present, before any work."""
    open_storage(params.storage).check()
    check_reference(params.reference)
    check_training(params.training)
    data_stage.preflight(params.data())


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams) -> PipelineSummary:
    """Problems -> reference trajectories -> bandit dataset -> GRPO (offline mode: offline
    dataset -> offline training) -> before/after Pass@1."""
    preflight(params)
    model = reference_model(params)
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
    trained = training_flow.with_options(flow_run_name="training")(
        params.training_params(collected.evaluation.uri, model, perturbed)
    )
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
The default is the embedded run: samples/synthetic_{train,test}.jsonl (generated list problems,
scripts/make_synthetic_samples.py), a ~1M-parameter model fitted on CPU for --fit-steps to
24 of the 30 problem kinds, 4 samples x 2 feedback turns, 8 GRPO steps (--mode offline: one
epoch over the logged turns, objective --objective, batch 16). Other sources as in the
data flow (--source URI[:KIND][?key=value]); another reference model with --reference DIR.
Any field of PipelineParams via --config FILE.json (flags override it).
"""


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
    arg("--source", action="append", metavar="URI[:KIND]", help="data source (repeatable)")
    arg("--reference", metavar="DIR", help=f"reference model: {FITTED} (default), tiny, or a dir")
    arg("--fit-steps", type=int, help="optimizer steps of the tiny model's fit (240)")
    arg("--train-limit", type=int, help="only the first N training problems")
    arg("--eval-limit", type=int, help="only the first N evaluation problems")
    arg("--n", type=int, help="samples per problem (4)")
    arg("--turns", type=int, help="feedback turns of the training trajectories (2)")
    arg("--eval-turns", type=int, help="feedback turns when evaluating (2)")
    arg("--max-new-tokens", type=int, help="tokens per turn (128)")
    arg("--mode", choices=["cobalt", "single_turn", "offline"], help="training mode (cobalt)")
    arg("--objective", choices=OBJECTIVES, help=f"offline objective ({DEFAULT_OBJECTIVE})")
    arg("--max-steps", type=int, help="optimizer steps (GRPO: 8; offline: one epoch)")
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

    values: dict[str, Any] = json.loads(args.config.read_text()) if args.config else {}
    if args.source:
        values["sources"] = args.source
    for flag in ("reference", "fit_steps", "train_limit", "eval_limit", "eval_turns"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    for flag in ("work_dir", "cluster"):
        if getattr(args, flag):
            values[flag] = getattr(args, flag)
    if args.refresh:
        values["refresh"] = True
    if args.reward_hacking:
        values["reward_hacking"] = True
    for flag in ("hacking_table", "hacking_limit"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    defaults = PipelineParams.model_fields
    collect = values.setdefault("collect", defaults["collect"].default_factory().model_dump())
    if args.n is not None:
        collect["sampling"]["n"] = args.n
    if args.max_new_tokens is not None:
        collect["sampling"]["max_new_tokens"] = args.max_new_tokens
    if args.turns is not None:
        collect["turns"] = args.turns
    training = values.setdefault("training", tiny_training(args.mode or "cobalt").model_dump())
    if args.mode:
        training["mode"] = args.mode
    if args.objective:
        training.setdefault("offline", {})["objective"] = args.objective
    if args.max_steps is not None:
        training["max_steps"] = args.max_steps
    if args.perturbed_ratio is not None:
        values.setdefault("bandit", {"max_prompt_tokens": 1024})["perturbed_ratio"] = (
            args.perturbed_ratio
        )
    if args.device:
        values.setdefault("engine", {"kind": "transformers", "model": FITTED})["device"] = (
            args.device
        )
    if args.backend is not None:
        values.setdefault("sandbox", {})["backend"] = args.backend
    if args.sandbox_concurrency is not None:
        values.setdefault("sandbox", {})["concurrency"] = args.sandbox_concurrency
    storage_values(args, values)
    return PipelineParams.model_validate(values)


def render(summary: PipelineSummary) -> str:
    text = (
        f"\n{summary.line}\n\n{markdown_table(summary.stages)}\n\n"
        f"{markdown_table(summary.before_after)}\n\nplot: {summary.plot}"
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
