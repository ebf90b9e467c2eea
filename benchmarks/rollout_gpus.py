"""Rollouts on every GPU: the trajectory stage's collection on 1 GPU and on N GPUs, the same
work, and how much faster N GPUs are (goal: 3.5x on 4 GPUs; results in docs/RESULTS.md).

    python -m benchmarks.rollout_gpus                        # GPU: 1 GPU, then every visible GPU
    python -m benchmarks.rollout_gpus --gpus 1,2,4 --problems 256 --n 16 --max-new-tokens 128
    python -m benchmarks.rollout_gpus --gpus all --baseline first.json   # 1 GPU from an earlier run
    python -m benchmarks.rollout_gpus --smoke                # CPU: the code path (transformers serve)

Workload, the same for every run: --problems problems (the APPS and CodeContests samples, cycled
with a case number in front when more are asked for), --n samples each at turn 0 (then --turns
feedback turns, judged in the sandbox), --max-new-tokens tokens a turn, temperature 0.6, top-p
0.95, seed 0, through the stage's own procedure (`collect_initial`, `collect_multiturn`, with the
stage's `per_call` batches: --chunk-size problems per GPU and generate call).

Model: the Qwen3-8B shape (hidden 4096, 36 layers, 32 heads / 8 KV heads, MLP 12288) with the
tiny model's tokenizer: --model-dir (e.g. the weights `scripts/gpu/worker.sh model-8b` built in
/root/model-8b), or a config-only directory built here that vLLM fills with random weights
(`load_format=dummy`). Random weights rarely end a turn: nearly every completion is
--max-new-tokens long, so every run does the same number of tokens.

Engines, as the stage makes them from `EngineConfig(kind="vllm", data_parallel_size=G)`: G = 1 is
vLLM in the process (`LLM.chat`, the stage's one-GPU path; `--serve-one`: a `vllm serve` of one
engine instead); G > 1 is a local `vllm serve --data-parallel-size G` behind the LiteLLM engine,
each request sent to the engine with the fewest samples in flight.
Each run is a child process of its own (a fresh set of GPUs, a result even if another run dies).
Reported per run: engine start-up (load, compile, CUDA graphs; the server's start), generation
seconds (inside `generate`, start-up excluded), collection wall seconds, completion tokens and
tokens/s; then each run's speed-up over 1 GPU (generation seconds), and the share of completions
with the same text as the 1-GPU run's (the same seeds: numerics of other batches can still move
a token). --smoke runs the same code on CPU: the tiny model in the process for G = 1, and a
`transformers serve` of it behind the same served engine for G = 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 3.5  # x on 4 GPUs: 87.5% of a GPU's throughput each
SHAPE_8B = {
    "hidden_size": 4096,
    "num_layers": 36,
    "num_heads": 32,
    "num_kv_heads": 8,
    "intermediate_size": 12288,
    "max_position_embeddings": 32768,
}


# --- one run (a child process) ------------------------------------------------------------------


def problems(count: int, max_chars: int) -> list[Any]:
    """`count` problems: the benchmark samples, cycled with a case number in front."""
    from benchmarks.trajectory_throughput import load_problems

    base = load_problems(count, max_chars)
    out = list(base)
    while len(out) < count:
        p = base[len(out) % len(base)]
        case = len(out) // len(base)
        out.append(
            dataclasses.replace(p, id=f"{p.id}#{case}", instruction=f"Case {case}. {p.instruction}")
        )
    return out


def make_run_engine(gpus: int, model: Path, args: argparse.Namespace):
    """The engine the trajectory stage makes for `gpus` GPUs (smoke: the tiny model in the
    process, or a `transformers serve` behind the served engine)."""
    from engines import EngineConfig, make_engine

    if args.smoke:
        if gpus == 1:
            return make_engine(EngineConfig(kind="transformers", model=str(model), device="cpu"))
        from engines.served_engine import Launch, ServedEngine

        config = EngineConfig(kind="transformers", model=str(model))
        env = {"OMP_NUM_THREADS": "1"}
        return ServedEngine(config, Launch("transformers", env=env, concurrency=64, replicas=gpus))
    extra: dict[str, Any] = {"seed": args.seed}
    if not any(model.glob("*.safetensors")):
        extra["load_format"] = "dummy"
    config = EngineConfig(
        kind="vllm",
        model=str(model),
        data_parallel_size=gpus,
        gpu_memory_utilization=args.gpu_memory_utilization,
        extra=extra,
    )
    if gpus == 1 and args.serve_one:
        from engines.served_engine import ServedEngine
        from engines.vllm_engine import vllm_launch

        return ServedEngine(config, vllm_launch(config, 1))
    return make_engine(config)


def run(gpus: int, model: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from cobalt.trajectories.batching import per_call
    from cobalt.trajectories.collect import (
        BatchConfig,
        CollectConfig,
        collect_initial,
        collect_multiturn,
    )
    from engines import SamplingConfig

    todo = problems(args.problems, args.max_statement_chars)
    sampling = SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, seed=args.seed)
    collect = CollectConfig(sampling=sampling, turns=args.turns)
    out = work / f"gpus{gpus}"
    shutil.rmtree(out, ignore_errors=True)  # the stage skips problems already in its file
    out.mkdir(parents=True)
    started = time.perf_counter()
    engine = make_run_engine(gpus, model, args)
    start_s = time.perf_counter() - started
    batch = per_call(BatchConfig(chunk_size=args.chunk_size, lanes=args.lanes), engine)
    try:
        records, stats = collect_initial(todo, engine, collect, out / "initial.jsonl", batch)
        if args.turns:
            from sandbox import SandboxConfig, SyncJudge

            with SyncJudge(SandboxConfig(backend=args.backend)) as judge:
                _, more = collect_multiturn(
                    todo, records, engine, judge, collect, out / "multiturn.jsonl", batch
                )
            stats.merge(more)
        log = getattr(getattr(engine, "server", None), "log", None)
        if log is not None:  # the engine removes it when it stops
            shutil.copy(log, out / "server.log")
    finally:
        stopping = time.perf_counter()
        engine.close()
        stop_s = time.perf_counter() - stopping
    errors = stats.outcomes.get("engine_error", 0)
    return {
        "gpus": gpus,
        "engine": type(engine).__name__,
        "replicas": engine.replicas,
        "conversations_per_call_turn0": batch.chunk_size * args.n,
        "start_s": round(start_s, 1),
        "generate_s": round(stats.generate_s, 2),
        "collect_wall_s": round(stats.wall_s, 2),
        "stop_s": round(stop_s, 1),
        "completions": stats.completions,
        "engine_errors": errors,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "tokens_per_s": round(stats.completion_tokens / stats.generate_s, 1)
        if stats.generate_s
        else None,
        "records": str(out / "initial.jsonl"),
        "server_log": str(out / "server.log") if log else None,
    }


def child(args: argparse.Namespace) -> int:
    result = run(args.child_gpus, args.model_dir, args.work, args)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --- the parent: the model, one child per run, the report ---------------------------------------


def visible_gpus() -> int:
    from engines import visible_gpus

    return visible_gpus()


def build_model(path: Path, smoke: bool) -> Path:
    from engines.tiny import build_tiny_model

    if (path / "config.json").exists():
        return path
    if smoke:
        return build_tiny_model(path, seed=0)
    return build_tiny_model(
        path, seed=0, eos_logit=0.0, dtype="bfloat16", save_weights=False, **SHAPE_8B
    )


def run_child(gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run in a child process and a process group of its own: at its time limit, or when
    this process is stopped, the whole group ends (the child, its server, vLLM's engines)."""
    command = [sys.executable, "-m", "benchmarks.rollout_gpus", "--child-gpus", str(gpus)]
    command += args.forward
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log = args.work / f"gpus{gpus}.log"
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=args.run_timeout_s)
            note = "" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            note = f"time limit {args.run_timeout_s:.0f}s"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = log.read_text(errors="replace").splitlines()
    results = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
    if results and not note:
        return {**results[0], "run_s": round(time.perf_counter() - started, 1)}
    tail = "\n".join(line for line in lines[-15:] if line.strip())
    print(f"{gpus} GPU(s): {note}\n{tail}", file=sys.stderr, flush=True)
    return {"gpus": gpus, "error": f"{note}: {tail[-1500:]}"}


def same_texts(a: str, b: str) -> float | None:
    """Share of completions (problem, sample) with the same turn-0 text in two runs' records."""

    def texts(path: str) -> dict[tuple[str, int], str]:
        found = {}
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            for sample in record["samples"]:
                found[(record["problem_id"], sample["index"])] = sample["turns"][0]["response"]
        return found

    try:
        first, second = texts(a), texts(b)
    except (OSError, ValueError, KeyError):
        return None
    shared = first.keys() & second.keys()
    return round(sum(first[k] == second[k] for k in shared) / len(shared), 4) if shared else None


def compare(results: list[dict[str, Any]]) -> None:
    """Each run's speed-up over the 1-GPU run (generation seconds) and its same-text share."""
    one = next((r for r in results if r.get("gpus") == 1 and "error" not in r), None)
    for r in results:
        if one is None or "error" in r or r is one:
            continue
        r["speedup_vs_1_gpu"] = round(one["generate_s"] / r["generate_s"], 2)
        r["per_gpu_efficiency"] = round(r["speedup_vs_1_gpu"] / r["gpus"], 3)
        r["goal_3.5x_on_4_met"] = r["per_gpu_efficiency"] >= GOAL / 4
        r["same_text_as_1_gpu"] = same_texts(one["records"], r["records"])


def parse_gpus(text: str, visible: int) -> list[int]:
    runs = []
    for item in text.split(","):
        item = item.strip()
        count = visible if item == "all" else int(item)
        if count < 1:
            raise SystemExit(f"--gpus: {item!r} means {count} GPUs; give counts >= 1 (or all)")
        if count not in runs:
            runs.append(count)
    return runs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rollout_gpus",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arg = parser.add_argument
    arg("--smoke", action="store_true", help="CPU: tiny model, transformers serve for G > 1")
    arg("--gpus", help="comma list of GPU counts to run (all: every visible; default 1,all)")
    arg("--serve-one", action="store_true", help="1 GPU through vllm serve too (not in-process)")
    arg("--baseline", type=Path, help="a JSON of an earlier run: its runs are compared too")
    arg("--problems", type=int, default=256)
    arg("--n", type=int, default=16, help="samples per problem at turn 0")
    arg("--turns", type=int, default=0, help="feedback turns after turn 0 (judged)")
    arg("--max-new-tokens", type=int, default=128)
    arg("--chunk-size", type=int, default=16, help="problems per GPU and generate call")
    arg("--lanes", type=int, default=2, help="lanes of a chunk's feedback turns")
    arg("--max-statement-chars", type=int, default=3000)
    arg("--gpu-memory-utilization", type=float, default=0.9)
    arg("--backend", default="auto", help="sandbox backend of the feedback turns")
    arg("--seed", type=int, default=0)
    arg("--model-dir", type=Path, help="the model (default: a config-only 8B shape built here)")
    arg("--work", type=Path, help="records and logs (default: a temporary directory)")
    arg("--run-timeout-s", type=float, default=900, help="time limit of each run")
    arg("--json", type=Path, help="write the results here (after every run)")
    arg("--child-gpus", type=int, help=argparse.SUPPRESS)
    return parser


SMOKE = {"problems": 4, "n": 2, "max_new_tokens": 8, "chunk_size": 1}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    if args.child_gpus is not None:
        return child(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: end the run's group too
    temporary = args.work is None
    args.work = args.work or Path(tempfile.mkdtemp(prefix="rollout-gpus-"))
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        return measure(args)
    finally:
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)


def measure(args: argparse.Namespace) -> int:
    args.model_dir = build_model(args.model_dir or args.work / "model", args.smoke)
    visible = 1 if args.smoke else visible_gpus()
    runs = parse_gpus(args.gpus or ("1,2" if args.smoke else "1,all"), max(visible, 1))
    args.forward = forwarded(args)
    results: list[dict[str, Any]] = []
    if args.baseline:
        results += [r for r in json.loads(args.baseline.read_text())["results"] if "error" not in r]
    for gpus in runs:
        if not args.smoke and gpus > visible:
            results.append({"gpus": gpus, "error": f"{visible} GPUs visible"})
            continue
        print(f"running on {gpus} GPU(s) ...", file=sys.stderr, flush=True)
        results = [r for r in results if r.get("gpus") != gpus] + [run_child(gpus, args)]
        results.sort(key=lambda r: r["gpus"])
        compare(results)
        if args.json:
            args.json.write_text(json.dumps(report(args, visible, results), indent=1) + "\n")
    print(render(report(args, visible, results)))
    return 0 if all("error" not in r for r in results) else 1


def forwarded(args: argparse.Namespace) -> list[str]:
    """The settings every child gets (its own --child-gpus comes first)."""
    flags = ["--model-dir", str(args.model_dir), "--work", str(args.work)]
    for name in ("problems", "n", "turns", "max_new_tokens", "chunk_size", "lanes", "seed"):
        flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    flags += ["--max-statement-chars", str(args.max_statement_chars)]
    flags += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    flags += ["--backend", args.backend]
    return flags + (["--smoke"] if args.smoke else []) + (["--serve-one"] if args.serve_one else [])


def device_name() -> str:
    """The first GPU's name from nvidia-smi (no CUDA context in this process: the runs' vLLM
    plans from the free memory of every card)."""
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return names[0].strip() if names else "cpu"


def report(args: argparse.Namespace, visible: int, results: list[dict[str, Any]]) -> dict:
    device = "cpu" if args.smoke or not visible else device_name()
    return {
        "benchmark": "rollout_gpus",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "device": device,
            "gpus_visible": visible,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "model": str(args.model_dir),
        "settings": {
            k: getattr(args, k)
            for k in ("problems", "n", "turns", "max_new_tokens", "chunk_size", "lanes", "seed")
        },
        "goal": f"{GOAL}x on 4 GPUs (generation seconds)",
        "results": results,
    }


def render(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"rollouts on {report['machine']['gpus_visible']} x {report['machine']['device']}: "
        f"{s['problems']} problems x {s['n']} samples, {s['turns']} feedback turns, "
        f"{s['max_new_tokens']} new tokens a turn; goal {report['goal']}",
        "",
        "| GPUs | engine | start s | generate s | tokens/s | speed-up | per GPU | same text |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['gpus']} | failed: {r['error'][:200]} |" + " |" * 6)
            continue
        lines.append(
            f"| {r['gpus']} | {r['engine']} | {r['start_s']} | {r['generate_s']} | "
            f"{r['tokens_per_s']} | {r.get('speedup_vs_1_gpu', '-')} | "
            f"{r.get('per_gpu_efficiency', '-')} | {r.get('same_text_as_1_gpu', '-')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
