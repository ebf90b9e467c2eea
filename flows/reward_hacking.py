"""Reward-hacking flow: multi-turn inference on perturbed problems (feedback from public tests
with two deliberately wrong pairs), the turn-level errors it holds (changed code that now passes a
wrong test), an LLM judge's category of each, and the report (METHOD §1.7;
docs/REWARD_HACKING.md).

    python -m flows.reward_hacking                      # embedded default: synthetic problems,
                                                        # the tiny fitted model as policy + judge
    python -m flows.reward_hacking --problems latest --table dev --model /models/policy \\
        --judge-engine litellm --judge-model openai/qwen3-32b \\
        --judge-api-base http://gpu:8000/v1 --baseline runs/reward_hacking/judged/<key>

Steps: `inference` (the trajectories flow as a subflow, perturbed feedback: cached, resumable,
sharded, `--cluster`) -> `errors` -> `judge` (a task per shard, `--cluster` too, and a merge)
(cached tasks, content-addressed JSONL in `<storage>/reward_hacking/`, MANIFEST.json last) ->
report (tables, markdown with diffs, PNG; the comparison with `--baseline`). The logic lives in
`cobalt/analysis/` (no Prefect there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prefect import flow

from cobalt.analysis.judge import JudgeConfig
from cobalt.analysis.stages import HackingParams
from cobalt.analysis.summary import HackingSummary
from cobalt.models import FITTED, TINY
from cobalt.params import add_option, deep_merge
from cobalt.tables import markdown_table
from cobalt.trajectories.collect import CollectConfig
from cobalt.trajectories.stages import close_engines
from flows.cli import add_running_args, read_config, run_flow_cli, running_values
from flows.trajectories import trajectories_flow
from tasks.cluster import on_every_worker, task_runner
from tasks.reward_hacking import Stages, local_model, preflight, report


@flow(name="reward-hacking", log_prints=True)
def reward_hacking_flow(params: HackingParams) -> HackingSummary:
    """Perturbed problems -> multi-turn inference -> turn-level errors -> judge -> report."""
    ready = preflight(params)  # storage, perturbed problems, policy, judge endpoint, --baseline
    policy = local_model("policy", params.engine, params)
    judge = local_model("judge", params.judge.engine, params)
    collected = trajectories_flow.with_options(flow_run_name="reward-hacking-inference")(
        params.trajectories(policy)
    )
    with task_runner(params.cluster) as runner:  # judge shards here, or on a Dask cluster
        stages = Stages(params, judge, runner)
        try:
            spec, errors = stages.errors(collected)
            judged = stages.judged(errors)
        finally:
            close_engines()
            on_every_worker(runner, close_engines)
    return report(params, spec, errors, judged, judge.model, ready.compare)


# --- CLI ------------------------------------------------------------------------------------------

EPILOG = f"""\
The default is the embedded run: samples/synthetic_train.jsonl (perturbed here, seed 0), the
~1M-parameter model fitted on CPU ('{FITTED}', built once into the storage) as policy and as
judge, 8 samples x 2 feedback turns as the pipeline samples it; a few minutes on a CPU. Its judge labels are poor (a tiny
model rarely writes the reply format: parse_failure); the machinery is the real one.

problems (--problems): as the trajectories flow ('latest' + --table train|dev uses the bundle's
'<table>_perturbed' set; a .jsonl/.parquet of problems or PATH:KIND is perturbed here).
policy: --model NAME, as every flow names a model (a Hub id org/name[@revision], a model
directory, a model directory in storage such as a trained policy's s3://.../training/<key>,
fitted or tiny: docs/PIPELINE.md), or --engine litellm --model openai/NAME --api-base URL;
another model than fitted/tiny gets the paper's settings (16 samples, 2 feedback turns, 6144
tokens, the system prompt of METHOD §1.2) unless flags say otherwise; its judge likewise 1024
tokens per reply.
judge: --judge-model NAME (named as --model), or --judge-engine litellm --judge-model
openai/NAME --judge-api-base URL (any OpenAI-compatible server) or a hosted model with
--judge-api-key-env VAR.
--baseline DIR (or 'latest'): another finished analysis, reported as 'before' beside this one.
Any field of HackingParams via --config FILE.json (flags override it).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.reward_hacking",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Reward-hacking analysis (METHOD §1.7): multi-turn inference on perturbed "
        "problems, turn-level errors (changed code that now passes a deliberately wrong test), "
        "an LLM judge's category of each, a rule-based hard-coding check, and the report.",
        epilog=EPILOG,
    )
    arg = parser.add_argument
    arg("--config", type=Path, help="JSON file with HackingParams fields (flags override it)")
    arg("--problems", metavar="WHERE", help="problem set (default: the synthetic samples)")
    arg("--table", help="set of a problem-set bundle: train (default) or dev")
    arg("--limit", type=int, metavar="N", help="only the first N problems of the set")
    policy = parser.add_argument_group("policy (the model whose repairs are analysed)")
    policy.add_argument(
        "--engine",
        choices=["transformers", "litellm", "vllm", "auto"],
        help="engine of the policy's inference (auto: vLLM on a GPU where it is installed, else "
        "transformers)",
    )
    policy.add_argument(
        "--model",
        help=f"Hub id, model directory or storage URI, {FITTED} (default), tiny, or LiteLLM name",
    )
    policy.add_argument("--api-base", metavar="URL", help="OpenAI-compatible server (litellm)")
    policy.add_argument("--api-key-env", metavar="VAR", help="variable holding the API key")
    policy.add_argument("--api-key-block", metavar="NAME", help="Prefect Secret block of the key")
    policy.add_argument("--llm-concurrency", type=int, help="requests in flight (litellm)")
    policy.add_argument("--device", help="transformers: torch device (auto)")
    policy.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype (auto: the checkpoint's)",
    )
    policy.add_argument("--n", type=int, help="samples per problem (8; paper 16)")
    policy.add_argument("--turns", type=int, help="feedback turns (2; paper 8)")
    policy.add_argument("--temperature", type=float, help="sampling temperature (0.6)")
    policy.add_argument("--max-new-tokens", type=int, help="tokens per turn (128; paper 6144)")
    policy.add_argument("--seed", type=int, help="sampling seed (0)")
    policy.add_argument("--system-prompt", metavar="TEXT", help="system message ('' for none)")
    judge = parser.add_argument_group("judge (the LLM that classifies each error)")
    judge.add_argument(
        "--judge-engine",
        choices=["transformers", "litellm", "vllm", "auto"],
        help="engine of the judge, as --engine (auto)",
    )
    judge.add_argument(
        "--judge-model", help=f"named as --model: {FITTED} (default), Hub id, ..., LiteLLM name"
    )
    judge.add_argument("--judge-api-base", metavar="URL", help="OpenAI-compatible server")
    judge.add_argument("--judge-api-key-env", metavar="VAR", help="variable holding the key")
    judge.add_argument("--judge-api-key-block", metavar="NAME", help="Prefect Secret block")
    judge.add_argument("--judge-concurrency", type=int, help="requests in flight (litellm)")
    judge.add_argument("--judge-max-new-tokens", type=int, help="tokens per reply (48 default)")
    judge.add_argument("--judge-temperature", type=float, help="0 = greedy (default)")
    judge.add_argument("--judge-attempts", type=int, help="requests per error until it parses (3)")
    report = parser.add_argument_group("report")
    add_option(
        report,
        "--baseline",
        aliases=("--compare",),
        metavar="DIR",
        help="a finished analysis (its directory, as a run prints it, or latest) reported as "
        "'before' beside this one",
    )
    report.add_argument("--examples", type=int, help="errors shown with their diffs (6)")
    report.add_argument("--label", help="the policy's name in the report (its model's name)")
    run = parser.add_argument_group("running")
    run.add_argument("--chunk-size", type=int, help="problems per batch (16)")
    run.add_argument("--shard-size", type=int, help="problems per inference task")
    add_option(
        run,
        "--judge-chunk-size",
        aliases=("--judge-chunk",),
        type=int,
        help="errors per judge round (64)",
    )
    run.add_argument(
        "--judge-shard-size", type=int, help="errors per judge task (16 rounds; whole rounds)"
    )
    run.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="inference and judge shards on a Dask cluster: tcp://scheduler:8786, or local:N",
    )
    add_running_args(parser, run)
    return parser


def parse_params(argv: list[str] | None = None) -> HackingParams:
    parser = build_parser()
    args = parser.parse_args(argv)

    values = read_config(args.config)
    for flag, field in (
        ("problems", "problems"),
        ("table", "table"),
        ("limit", "limit"),
        ("baseline", "compare"),
        ("examples", "examples"),
        ("label", "label"),
        ("cluster", "cluster"),
        ("judge_chunk_size", "judge_chunk"),
        ("judge_shard_size", "judge_shard_size"),
        ("api_key_block", "api_key_block"),
    ):
        if getattr(args, flag) is not None:
            values[field] = getattr(args, flag)
    running_values(args, values)
    defaults = HackingParams.model_fields
    engine = deep_merge({"kind": "auto", "model": FITTED}, values.get("engine") or {}, "engine")
    _engine_flags(args, engine, "")
    if engine.get("kind") == "litellm" and engine.get("model") == FITTED:
        parser.error("--model is needed with --engine litellm (the served model's name)")
    values["engine"] = engine
    local = engine.get("model") in (
        FITTED,
        TINY,
    )  # the embedded default's settings, else the paper's
    base = defaults["collect"].default_factory() if local else CollectConfig()
    collect = deep_merge(base.model_dump(), values.get("collect") or {}, "collect")
    values["collect"] = collect
    sampling = collect["sampling"]
    for flag in ("n", "temperature", "max_new_tokens", "seed"):
        if getattr(args, flag) is not None:
            sampling[flag] = getattr(args, flag)
    if args.turns is not None:
        collect["turns"] = args.turns
    if args.system_prompt is not None:
        collect["system_prompt"] = args.system_prompt
    judge_values = values.setdefault("judge", {})
    judge_engine = deep_merge(
        {"kind": "auto", "model": FITTED}, judge_values.get("engine") or {}, "judge.engine"
    )
    _engine_flags(args, judge_engine, "judge_")
    local = judge_engine.get("model") in (FITTED, TINY)
    judge_base = (defaults["judge"].default_factory() if local else JudgeConfig()).sampling
    judge_values["sampling"] = deep_merge(
        judge_base.model_dump(), judge_values.get("sampling") or {}, "judge.sampling"
    )
    judge_values["engine"] = judge_engine
    if judge_engine.get("kind") == "litellm" and judge_engine.get("model") == FITTED:
        parser.error("--judge-model is needed with --judge-engine litellm")
    judge_sampling = judge_values["sampling"]
    for flag, name in (
        ("judge_max_new_tokens", "max_new_tokens"),
        ("judge_temperature", "temperature"),
    ):
        if getattr(args, flag) is not None:
            judge_sampling[name] = getattr(args, flag)
    if args.judge_attempts is not None:
        judge_values["max_attempts"] = args.judge_attempts
    if args.judge_api_key_block is not None:
        judge_values["api_key_block"] = args.judge_api_key_block
    for flag in ("chunk_size", "shard_size"):
        if getattr(args, flag) is not None:
            values.setdefault("batch", {})[flag] = getattr(args, flag)
    return HackingParams.model_validate(values)


def _engine_flags(args: argparse.Namespace, engine: dict[str, Any], prefix: str) -> None:
    """--engine/--model/... (prefix '') or --judge-engine/--judge-model/... into `engine`."""
    names = [
        ("engine", "kind"),
        ("model", "model"),
        ("api_base", "api_base"),
        ("api_key_env", "api_key_env"),
    ]
    if prefix:
        names.append(("concurrency", "concurrency"))
    else:
        names += [("llm_concurrency", "concurrency"), ("device", "device"), ("dtype", "dtype")]
    for flag, name in names:
        value = getattr(args, prefix + flag, None)
        if value is not None:
            engine[name] = value


def render(summary: HackingSummary) -> str:
    text = (
        f"\n{summary.line}\n\n{markdown_table(summary.per_turn)}\n\n"
        f"{markdown_table(summary.categories)}\n\nplot: {summary.plot}\nreport: {summary.report}"
        f"\nanalysis (for --baseline): {summary.uri}"
    )
    if summary.comparison is not None:
        text += (
            f"\n\ncomparison: {summary.comparison_line}\n\n"
            f"{markdown_table(summary.comparison['per_turn'])}\n\nplot: {summary.comparison_plot}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    return run_flow_cli(lambda: parse_params(argv), preflight, reward_hacking_flow, render)


if __name__ == "__main__":
    sys.exit(main())
