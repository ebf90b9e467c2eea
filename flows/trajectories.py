"""Trajectories flow: a reference LLM's multi-turn repair trajectories on a problem set, and their
per-turn Pass@1 (METHOD §1.2, §1.3; docs/TRAJECTORIES.md).

    python -m flows.trajectories                        # latest problem sets, tiny local model
    python -m flows.trajectories --problems samples/apps_sample.jsonl:taco --n 4 --turns 2
    python -m flows.trajectories --engine litellm --model openai/qwen3-8b \\
        --api-base http://gpu:8000/v1 --llm-concurrency 64 --table test --turns 8
    python -m flows.trajectories --evaluation --model s3://bucket/cobalt/training/<key>
    python -m flows.trajectories --compare runs/trajectories/evaluation/<key> latest

Stages, each a cached task writing a content-addressed JSONL under
`<storage>/trajectories/<stage>/<key>/` (records.jsonl, MANIFEST.json written last):
`initial` (turn 0, n samples per problem) -> `multiturn` (feedback turns) -> `evaluation`
(all tests, every turn) -> report (table artifact, PNG plot in storage, markdown + image artifacts).
`--evaluation` runs it with the pipeline's evaluation protocol (an evaluation of any model or
trained policy, comparable with the pipeline's before/after); `--compare A B` puts two finished
evaluations' per-turn tables side by side, without running anything. The logic lives in
`cobalt/trajectories/` and `cobalt/trajectories/evaluation.py` (no Prefect there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefect import flow
from pydantic import ValidationError

from cobalt.models import TINY
from cobalt.params import deep_merge
from cobalt.storage import StorageConfig
from cobalt.tables import markdown_table
from cobalt.trajectories.runs import Comparison, TrajectorySummary, compare_evaluations
from cobalt.trajectories.stages import TrajectoryParams, close_engines
from flows.cli import (
    USER_ERRORS,
    add_running_args,
    fail,
    read_config,
    run_flow_cli,
    running_values,
    storage_values,
    validation_line,
)
from tasks.cluster import on_every_worker, task_runner
from tasks.trajectories import Stages, preflight, report


@flow(name="trajectories", log_prints=True)
def trajectories_flow(params: TrajectoryParams) -> TrajectorySummary:
    """Problems -> first programs (n per problem) -> feedback turns -> all-test evaluation ->
    per-turn Pass@1 table and plot."""
    ready = preflight(params)  # storage, problems, engine (model, API key): before any work
    with task_runner(params.cluster) as runner:  # shards here, or on a Dask cluster
        stages = Stages(params, ready, runner)
        try:
            initial = stages.initial()
            multiturn = stages.multiturn(initial)
            evaluation = stages.evaluation(multiturn)
        finally:
            close_engines()
            on_every_worker(runner, close_engines)  # a served engine keeps a node's GPUs
    return report(params, ready, initial, multiturn, evaluation)


# --- CLI ------------------------------------------------------------------------------------------

EPILOG = """\
problems (--problems): 'latest' (the data stage's newest problem sets in --storage; pick the set
with --table train|dev|test), a problem-set directory, a .parquet/.jsonl of problem records, or
a raw source file PATH:KIND (taco, cobalt, lcb, codecontests), e.g. samples/apps_sample.jsonl:taco.

models (--model): a Hub id (org/name, or org/name@revision: a branch, tag or commit), a model
directory, a model directory in storage (a trained policy: <storage>/training/<key>, as the
training and pipeline summaries print it), fitted or tiny (default: the tiny built-in model);
resolved once to a local directory (Hub models through its cache, HF_HUB_OFFLINE respected).
--engine litellm --model openai/NAME --api-base http://host:8000/v1 for an OpenAI-compatible
server (vllm serve, transformers serve); hosted APIs with --api-key-env VAR (the variable's
name, never the key).
vLLM (--engine vllm, or auto on a GPU with vLLM) generates on every visible GPU, one engine each
(a local `vllm serve --data-parallel-size N` beyond one); --gpus N takes fewer.
Paper settings: --n 16 --temperature 0.6 --top-p 0.95 --max-new-tokens 6144; --turns 2 for
training data, 8 for evaluation.

--evaluation: the pipeline's evaluation of --model (its 'evaluation before/after' stages): the
'test' set of the latest problem sets, the preset's engine and sampling, its evaluation turns
and seed; --preset paper (the paper's: 16 samples x 8 feedback turns of up to 6144 tokens, the paper's
system prompt) or tiny (the embedded run's 8 x 2 of 128 tokens); default by the model, as the
pipeline decides. Flags and --config still override any of it.
--compare A B: the per-turn Pass@1 of two finished evaluations ('latest' or
<storage>/trajectories/evaluation/<key>, as each run prints it) side by side, A as before, B as
after, and the settings in which their protocols differ; runs nothing.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.trajectories",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Collect multi-turn code-repair trajectories with a reference LLM (public-test "
        "feedback from the sandbox) and report per-turn Pass@1 on all tests.",
        epilog=EPILOG,
    )
    arg = parser.add_argument
    arg("--config", type=Path, help="JSON file with TrajectoryParams fields (flags override it)")
    arg("--problems", metavar="WHERE", help="problem set (default: latest); see below")
    arg("--table", help="set of a problem-set bundle: train (default), dev, test")
    arg("--perturbed", action="store_true", help="feedback from perturbed public tests")
    arg("--limit", type=int, metavar="N", help="only the first N problems of the set")
    arg("--engine", choices=["transformers", "litellm", "vllm", "auto"], help="engine kind")
    arg(
        "--model",
        metavar="NAME",
        help="Hub id, model directory, storage URI, fitted or tiny (default: tiny, the random "
        "built-in model); or a LiteLLM name",
    )
    arg("--evaluation", action="store_true", help="the pipeline's evaluation protocol (below)")
    arg("--preset", choices=["tiny", "paper"], help="--evaluation's settings (default: by model)")
    arg("--compare", nargs=2, metavar=("A", "B"), help="two evaluations side by side (below)")
    arg("--api-base", metavar="URL", help="OpenAI-compatible server (litellm)")
    arg("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    arg("--api-key-block", metavar="NAME", help="Prefect Secret block holding the API key")
    arg("--llm-concurrency", type=int, help="LLM requests in flight (litellm; default 16)")
    arg(
        "--gpus",
        type=int,
        metavar="N",
        help="vLLM: generate on N GPUs, one engine each (engine.data_parallel_size; default: "
        "every visible GPU)",
    )
    arg("--batch-size", type=int, help="conversations per generate call (transformers)")
    arg("--continuous-batching", action="store_true", help="transformers: generate_batch")
    arg("--device", help="transformers: torch device (auto)")
    arg("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights dtype")
    arg("--n", type=int, help="samples per problem (16)")
    arg("--turns", type=int, help="feedback turns (2; 8 for evaluation)")
    arg("--temperature", type=float, help="sampling temperature (0.6)")
    arg("--top-p", type=float, help="nucleus mass (0.95)")
    arg("--max-new-tokens", type=int, help="tokens per turn (6144)")
    arg("--seed", type=int, help="sampling seed (0)")
    thinking = parser.add_mutually_exclusive_group()
    thinking.add_argument(
        "--thinking",
        dest="thinking",
        action="store_true",
        default=None,
        help="chat template's enable_thinking=True",
    )
    thinking.add_argument(
        "--no-thinking",
        dest="thinking",
        action="store_false",
        help="chat template's enable_thinking=False",
    )
    arg("--max-prompt-tokens", type=int, help="end a sample whose conversation is longer")
    arg("--system-prompt", metavar="TEXT", help="system message ('' for none; the paper's default)")
    arg("--chunk-size", type=int, help="problems per batch; records land per chunk (16)")
    arg("--lanes", type=int, help="lanes per chunk: one is judged while another generates (2)")
    arg("--shard-size", type=int, help="problems per task (16 chunks; a multiple of --chunk-size)")
    arg(
        "--cluster",
        metavar="ADDRESS",
        help="run the shards on a Dask cluster: tcp://scheduler:8786, or local:N workers",
    )
    add_running_args(parser)
    return parser


def parse_params(argv: list[str] | None = None) -> TrajectoryParams:
    parser = build_parser()
    return params_from(parser.parse_args(argv), parser)


def params_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> TrajectoryParams:
    values = read_config(args.config)
    if args.evaluation:  # the pipeline's evaluation, under the file's values and the flags
        from cobalt.pipeline import evaluation_protocol

        model = args.model or (values.get("engine") or {}).get("model") or TINY
        values = deep_merge(evaluation_protocol(model, args.preset), values)
    elif args.preset:
        parser.error("--preset goes with --evaluation (the pipeline's evaluation protocol)")
    for flag in (
        "problems",
        "table",
        "limit",
        "api_key_block",
    ):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.perturbed:
        values["perturbed"] = True
    running_values(args, values)
    engine = deep_merge({"kind": "auto", "model": TINY}, values.get("engine") or {}, "engine")
    for flag, name in (
        ("engine", "kind"),
        ("model", "model"),
        ("api_base", "api_base"),
        ("api_key_env", "api_key_env"),
        ("llm_concurrency", "concurrency"),
        ("gpus", "data_parallel_size"),
        ("batch_size", "batch_size"),
        ("device", "device"),
        ("dtype", "dtype"),
    ):
        if getattr(args, flag) is not None:
            engine[name] = getattr(args, flag)
    if args.continuous_batching:
        engine["continuous_batching"] = True
    if engine.get("kind") == "litellm" and engine.get("model") == TINY:
        parser.error("--model is needed with --engine litellm (the served model's name)")
    values["engine"] = engine
    defaults = {"sampling": {"n": 16, "seed": 0}}
    collect = values["collect"] = deep_merge(defaults, values.get("collect") or {}, "collect")
    sampling = collect["sampling"]
    for flag, name in (
        ("n", "n"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("max_new_tokens", "max_new_tokens"),
        ("seed", "seed"),
        ("thinking", "thinking"),
    ):
        if getattr(args, flag) is not None:
            sampling[name] = getattr(args, flag)
    for flag in ("turns", "max_prompt_tokens", "system_prompt"):
        if getattr(args, flag) is not None:
            collect[flag] = getattr(args, flag)
    if args.cluster is not None:
        values["cluster"] = args.cluster
    for flag in ("chunk_size", "lanes", "shard_size"):
        if getattr(args, flag) is not None:
            values.setdefault("batch", {})[flag] = getattr(args, flag)
    return TrajectoryParams.model_validate(values)


def render(summary: TrajectorySummary) -> str:
    return (
        f"\n{summary.line}\n\n{markdown_table(summary.table)}\n\nplot: {summary.plot}\n"
        f"evaluation (for --compare, --trajectories): {summary.evaluation.uri}"
    )


def compare(args: argparse.Namespace) -> int:
    """`--compare A B`: two finished evaluations side by side, printed; runs no flow."""
    values: dict = {}
    storage_values(args, values)
    try:
        storage = StorageConfig.model_validate(values["storage"])
        comparison = compare_evaluations(*args.compare, storage)
    except ValidationError as exc:
        print("error: " + validation_line(exc), file=sys.stderr)
        return 2
    except USER_ERRORS as exc:
        return fail(exc)
    print(render_comparison(comparison))
    return 0


def render_comparison(c: Comparison) -> str:
    return (
        f"\n{c.line}\n\nbefore: {c.before} ({c.models[0]})\nafter:  {c.after} ({c.models[1]})"
        f"\n\n{markdown_table(c.table)}\n\nplot: {c.plot}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args)
    return run_flow_cli(lambda: params_from(args, parser), preflight, trajectories_flow, render)


if __name__ == "__main__":
    sys.exit(main())
