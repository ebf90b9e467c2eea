"""Trajectory throughput: trajectories per minute, and where the wall time goes (generating vs.
waiting on the sandbox), for the transformers engine with padded batches and with continuous
batching (results in docs/RESULTS.md).

    python -m benchmarks.trajectory_throughput                 # GPU: ~150M model, 16 x 16
    python -m benchmarks.trajectory_throughput --smoke         # CPU: tiny model, a few seconds
    python -m benchmarks.trajectory_throughput --json out.json --modes continuous

Workload, deterministic for a seed:
- Model: a Qwen2-shaped chat model with random weights built here with `engines.tiny`
  (default hidden 768, 12 layers, 12 heads / 4 KV heads, MLP 4608: ~148M parameters; BPE vocab
  of the tiny model's tokenizer). Its text is noise, and its turns end by `<|im_end|>` or at
  --max-new-tokens.
- Problems: the first --problems of samples/apps_sample.jsonl (5, with reference solutions)
  then samples/codecontests_sample.jsonl (first 4 tests public, the rest hidden).
- Programs: a random model writes no code, so the sandbox would idle. Each generated response
  (real generation, real cost) gets a program appended with probability --code-share, chosen
  by a hash of (problem, sample, turn): a reference solution (APPS, half the time) or a wrong
  program that computes for a while (a 200k-step loop) before printing a wrong answer. Those
  programs go through the real procedure: judged on the public tests (fail-fast), feedback, next
  turn; then every turn on all tests (the evaluation, reported apart).
- Procedure: `cobalt.trajectories.collect.collect_initial` (n samples per problem) then
  `collect_multiturn` (--turns feedback turns), exactly as the flow runs them, JSONL records
  fsynced per problem into a temporary directory.

Reported per mode: trajectories (problems x n) per minute of collection wall time; the shares of
that wall time spent in `generate` calls, blocked waiting on the sandbox, and elsewhere (records,
prompts), plus the sandbox's busy time (judging overlaps generation: with --lanes 2, one half of
a chunk is judged while the other half generates); tokens per second; programs judged; then the evaluation pass (all tests of
every turn's program). Goal: sandbox under 10% of the collection wall time.

Imports only sandbox/, engines/ and the plain trajectory modules (no Prefect, no datasets), so
it runs on a GPU machine with torch + transformers + pydantic.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file too
    sys.path.insert(0, str(ROOT))

from cobalt.trajectories.collect import (  # noqa: E402
    BatchConfig,
    CollectConfig,
    collect_initial,
    collect_multiturn,
)
from cobalt.trajectories.evaluation import evaluate  # noqa: E402
from engines import (  # noqa: E402
    Completion,
    Conversation,
    Engine,
    EngineConfig,
    SamplingConfig,
    make_engine,
)
from sandbox import SandboxConfig, SyncJudge, TestSuite  # noqa: E402
from sandbox.formats import taco_tests  # noqa: E402

GOAL_SANDBOX_SHARE = 0.10
APPS = ROOT / "samples" / "apps_sample.jsonl"
CODECONTESTS = ROOT / "samples" / "codecontests_sample.jsonl"
ASK = (
    "Solve the programming problem below in Python. Reason step by step, then give one "
    "complete program in a single ```python code block that reads standard input and "
    "prints the answer.\n\nProblem:\n"
)
WRONG_STDIN = """import sys
data = sys.stdin.read().split()
acc = 0
for i in range(200000):
    acc = (acc * 31 + i) % 1000003
print(len(data) + acc % 7 + 1)
"""
WRONG_CALL = """class Solution:
    def {fn}(self, *args):
        acc = 0
        for i in range(200000):
            acc = (acc * 31 + i) % 1000003
        return acc

def {fn}(*args):
    return Solution().{fn}(*args)
"""


@dataclass
class BenchProblem:
    """What the trajectory procedure needs of a problem (duck-types cobalt.problems.Problem)."""

    id: str
    difficulty: str
    instruction: str
    public_tests: TestSuite
    hidden_tests: TestSuite
    solutions: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def tests(self) -> TestSuite:
        return TestSuite(
            inputs=self.public_tests.inputs + self.hidden_tests.inputs,
            outputs=self.public_tests.outputs + self.hidden_tests.outputs,
            fn_name=self.public_tests.fn_name,
        )

    @property
    def feedback_tests(self) -> TestSuite:
        return self.public_tests


def _split(tests: TestSuite, public: int = 4) -> tuple[TestSuite, TestSuite]:
    def part(sl: slice) -> TestSuite:
        return TestSuite(inputs=tests.inputs[sl], outputs=tests.outputs[sl], fn_name=tests.fn_name)

    return part(slice(0, public)), part(slice(public, None))


def load_problems(count: int, max_chars: int = 3000) -> list[BenchProblem]:
    problems = []
    for line in APPS.read_text().splitlines():
        row = json.loads(line)
        public, hidden = _split(taco_tests(row["input_output"]))
        problems.append(
            BenchProblem(
                id=f"apps/{row['id']}",
                difficulty=row.get("difficulty") or "unknown",
                instruction=ASK + row["question"].strip()[:max_chars],
                public_tests=public,
                hidden_tests=hidden,
                solutions=json.loads(row["solutions"]),
                source="apps",
            )
        )
    for line in CODECONTESTS.read_text().splitlines():
        if len(problems) >= count:
            break
        row = json.loads(line)
        tests = TestSuite(inputs=row["tests"]["input"], outputs=row["tests"]["output"])
        public, hidden = _split(tests)
        problems.append(
            BenchProblem(
                id=f"codecontests/{row['name']}",
                difficulty="unknown",
                instruction=ASK + row["description"].strip()[:max_chars],
                public_tests=public,
                hidden_tests=hidden,
                source="codecontests",
            )
        )
    return problems[:count]


def _unit(*parts: Any) -> float:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class ProgramInjector(Engine):
    """Wraps a real engine: its completions (and their cost) are kept, and a program from a
    fixed workload is appended to some of them, so the sandbox does realistic work."""

    kind = "injector"

    def __init__(
        self, inner: Engine, problems: Sequence[BenchProblem], code_share: float, seed: int
    ):
        super().__init__(inner.config)
        self.inner = inner
        self.by_instruction = {p.instruction: p for p in problems}
        self.code_share = code_share
        self.seed = seed
        self.verbose = False

    def generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        started = time.perf_counter()
        results = self.inner.generate(conversations, sampling)
        if self.verbose:
            done = [c for row in results for c in row]
            print(
                f"  generate: {len(conversations)} conversations x {sampling.n}: "
                f"{time.perf_counter() - started:.1f}s, "
                f"{sum(c.prompt_tokens for c in done) // max(1, len(done))} prompt tokens "
                f"and {sum(c.completion_tokens for c in done) // max(1, len(done))} new per "
                f"completion, {sum(c.error is not None for c in done)} errors",
                file=sys.stderr,
                flush=True,
            )
        for conversation, completions in zip(conversations, results, strict=True):
            problem = self.by_instruction[conversation[1]["content"]]
            history = json.dumps(conversation[2:])  # tells the samples of a feedback turn apart
            for i, completion in enumerate(completions):
                key = (self.seed, problem.id, i, history)
                if completion.error is None and _unit("code", *key) < self.code_share:
                    completion.text = (
                        completion.text.replace("`", "'")
                        + "\n\n```python\n"
                        + self.program(problem, _unit("pick", *key))
                        + "\n```"
                    )
        return results

    @staticmethod
    def program(problem: BenchProblem, u: float) -> str:
        """A reference solution or a busy wrong program, made unique (as a model's programs
        are) so that no two samples share a verdict."""
        tag = f"# variant {u:.12f}\n"
        if problem.solutions and u < 0.5:
            return tag + problem.solutions[int(u * 2 * len(problem.solutions))]
        fn = problem.public_tests.fn_name
        return tag + (WRONG_CALL.format(fn=fn) if fn else WRONG_STDIN)

    def close(self) -> None:
        self.inner.close()


def build_model(path: Path, args: argparse.Namespace, weights: bool = True) -> tuple[Path, int]:
    """The random model; big shapes are initialised on the GPU and saved in bf16. Without
    `weights` (vLLM modes only) just the config and tokenizer (vLLM's load_format=dummy)."""
    from engines.tiny import build_tiny_model

    if not (path / "tiny_model.json").exists():
        gpu = _cuda() and args.device in ("auto", "cuda")
        build_tiny_model(
            path,
            seed=args.seed,
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            intermediate_size=args.intermediate,
            eos_logit=args.eos_logit,
            max_position_embeddings=args.max_positions,
            device="cuda" if gpu else "cpu",
            dtype="bfloat16" if gpu and args.dtype in ("auto", "bfloat16") else "float32",
            save_weights=weights,
        )
    config = json.loads((path / "config.json").read_text())
    h, i, layers, v = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
        config["vocab_size"],
    )
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    params = 2 * v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h
    return path, params


def vllm_args(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """vLLM's settings: dummy weights when the model directory has none."""
    kwargs: dict[str, Any] = {"seed": args.seed}
    if not any(model.glob("*.safetensors")):
        kwargs["load_format"] = "dummy"
    return kwargs


def run_mode(
    mode: str, model: Path, problems: list[BenchProblem], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    if mode == "vllm":
        config = EngineConfig(
            kind="vllm",
            model=str(model),
            max_model_len=args.max_positions,
            gpu_memory_utilization=args.vllm_memory,
            extra=vllm_args(args, model),
        )
        result = _run(mode, config, problems, args, work)
        result["engine"] = "vLLM LLM.chat in this process (continuous batching, paged KV cache)"
        return result
    if mode == "vllm-served":
        from engines.serving import local_server

        started = time.perf_counter()
        extra = ["--max-model-len", str(args.max_positions)]
        extra += ["--gpu-memory-utilization", str(args.vllm_memory), "--seed", str(args.seed)]
        if "load_format" in vllm_args(args, model):
            extra += ["--load-format", "dummy"]
        with local_server(model, work, kind="vllm", extra_args=extra) as server:
            result = _run_served(mode, server, problems, args, work, timeout_s=600)
        result["engine"] = f"vllm serve + LiteLLM, {args.llm_concurrency} requests in flight"
        result["server_start_s"] = round(time.perf_counter() - started - result["wall_s"], 1)
        return result
    if mode == "served":
        from engines.serving import local_server

        started = time.perf_counter()
        device = "cuda" if args.device == "auto" and _cuda() else args.device
        with local_server(
            model,
            work,
            device="cpu" if device == "auto" else device,
            dtype=None if args.dtype == "auto" else args.dtype,
            continuous_batching=args.serve_continuous,
        ) as server:
            result = _run_served(mode, server, problems, args, work)
        result["engine"] = (
            f"transformers serve ({'continuous batching' if args.serve_continuous else 'generate'}) "
            f"+ LiteLLM, {args.llm_concurrency} requests in flight"
        )
        result["server_start_s"] = round(time.perf_counter() - started - result["wall_s"], 1)
        return result
    config = EngineConfig(
        kind="transformers",
        model=str(model),
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        continuous_batching=mode == "continuous",
    )
    return _run(mode, config, problems, args, work)


def _run_served(
    mode: str,
    server: Any,
    problems: list[BenchProblem],
    args: argparse.Namespace,
    work: Path,
    timeout_s: float = 300,
) -> dict[str, Any]:
    """The workload through the LiteLLM engine against a local server, once it is up."""
    server.wait_until_up(timeout_s=timeout_s)
    config = EngineConfig(
        kind="litellm",
        model=server.litellm_model,
        api_base=server.api_base,
        concurrency=args.llm_concurrency,
    )
    return _run(mode, config, problems, args, work)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _run(
    mode: str,
    config: EngineConfig,
    problems: list[BenchProblem],
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    collect = CollectConfig(
        sampling=SamplingConfig(
            n=args.n,
            temperature=0.6,
            top_p=0.95,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
        ),
        turns=args.turns,
    )
    batch = BatchConfig(chunk_size=args.chunk_size, lanes=args.lanes)
    sandbox = SandboxConfig(backend=args.backend, concurrency=args.sandbox_concurrency)
    out = work / mode
    started = time.perf_counter()
    inner = make_engine(config)
    load_s = time.perf_counter() - started
    engine = ProgramInjector(inner, problems, args.code_share, args.seed)
    engine.verbose = args.verbose
    try:
        if args.warmup:  # one short call: CUDA kernels, allocator, cache sizing
            inner.generate(
                [[{"role": "user", "content": "hi"}]], SamplingConfig(n=2, max_new_tokens=8, seed=0)
            )
        with SyncJudge(sandbox) as judge:
            initial, first = collect_initial(
                problems, engine, collect, out / "initial.jsonl", batch
            )
            records, rest = collect_multiturn(
                problems, initial, engine, judge, collect, out / "multiturn.jsonl", batch
            )
            _, evaluation = evaluate(
                problems, records, judge, collect.turns, out / "evaluation.jsonl", batch
            )
            backend = judge.backend_name
    finally:
        engine.close()
    stats = first.merge(rest)
    wall = stats.wall_s
    other = max(0.0, wall - stats.generate_s - stats.sandbox_s)
    trajectories = len(problems) * args.n
    return {
        "mode": mode,
        "seconds_total": round(time.perf_counter() - started, 2),
        "engine": "transformers generate_batch (continuous batching)"
        if mode == "continuous"
        else f"transformers generate (padded batches of {args.batch_size} conversations)",
        "engine_kind": config.kind,
        "engine_device": str(getattr(inner, "device", "?")),
        "sandbox_backend": backend,
        "problems": len(problems),
        "trajectories": trajectories,
        "turns_per_trajectory": args.turns + 1,
        "model_load_s": round(load_s, 2),
        "wall_s": round(wall, 2),
        "trajectories_per_min": round(trajectories / wall * 60, 2) if wall else None,
        "generate_s": round(stats.generate_s, 2),
        "sandbox_s": round(stats.sandbox_s, 2),
        "sandbox_busy_s": round(stats.sandbox_busy_s, 2),
        "generate_share": round(stats.generate_s / wall, 4) if wall else None,
        "sandbox_share": round(stats.sandbox_s / wall, 4) if wall else None,
        "other_share": round(other / wall, 4) if wall else None,
        "completions": stats.completions,
        "completion_tokens": stats.completion_tokens,
        "mean_completion_tokens": round(stats.completion_tokens / stats.completions, 1)
        if stats.completions
        else None,
        "prompt_tokens": stats.prompt_tokens,
        "generated_tokens_per_s": round(stats.completion_tokens / stats.generate_s, 1)
        if stats.generate_s
        else None,
        "programs_judged": stats.programs_judged,
        "outcomes": stats.outcomes,
        "evaluation_s": round(evaluation.wall_s, 2),
        "evaluation_programs": evaluation.programs_judged,
        "goal_sandbox_share_met": bool(wall and stats.sandbox_s / wall < GOAL_SANDBOX_SHARE),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.trajectory_throughput",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Defaults are for one GPU (H100/H200, 16 CPU cores); --smoke is a CPU check.",
    )
    arg = parser.add_argument
    arg("--smoke", action="store_true", help="tiny settings for a CPU check (overrides below)")
    arg(
        "--modes",
        default="padded,continuous",
        help="comma list of: padded, continuous (the in-process transformers engine), served "
        "(a local `transformers serve` process behind the LiteLLM engine), vllm (vLLM in this "
        "process), vllm-served (a local `vllm serve` behind the LiteLLM engine)",
    )
    arg("--vllm-memory", type=float, default=0.85, help="vllm: gpu_memory_utilization")
    arg("--llm-concurrency", type=int, default=128, help="served: requests in flight")
    arg(
        "--serve-continuous",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="served: the server's continuous batching (--no-serve-continuous: plain generate)",
    )
    arg("--problems", type=int, default=16, help="problems (5 APPS, then CodeContests)")
    arg("--n", type=int, default=16, help="samples per problem (trajectories per problem)")
    arg("--turns", type=int, default=2, help="feedback turns")
    arg("--max-new-tokens", type=int, default=256, help="tokens per turn")
    arg("--batch-size", type=int, default=256, help="conversations per padded generate call")
    arg("--chunk-size", type=int, default=16, help="problems per batch (records land per chunk)")
    arg(
        "--lanes",
        type=int,
        default=2,
        help="lanes per chunk: one is judged while another "
        "generates (1: generate and judge in turn)",
    )
    arg("--code-share", type=float, default=0.75, help="share of responses given a program")
    arg("--hidden", type=int, default=768)
    arg("--layers", type=int, default=12)
    arg("--heads", type=int, default=12)
    arg("--kv-heads", type=int, default=4)
    arg("--intermediate", type=int, default=4608)
    arg("--max-positions", type=int, default=16384, help="context length of the model")
    arg(
        "--max-statement-chars",
        type=int,
        default=3000,
        help="statements are cut to this (the tiny BPE vocab spends ~2 chars per token)",
    )
    arg("--eos-logit", type=float, default=2.5, help="end-of-turn bias of the random model")
    arg("--device", default="auto", help="torch device (auto: cuda if available)")
    arg("--dtype", default="bfloat16", choices=["auto", "float32", "bfloat16", "float16"])
    arg("--backend", default="auto", choices=["auto", "docker", "namespace"])
    arg("--sandbox-concurrency", type=int, default=os.cpu_count() or 1)
    arg("--seed", type=int, default=0)
    arg("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up call")
    arg("--model-dir", type=Path, help="build (or reuse) the model here (default: temporary)")
    arg("--verbose", action="store_true", help="print every generate call's size and time")
    arg("--json", type=Path, help="also write the results as JSON here")
    return parser


SMOKE = {
    "dtype": "auto",
    "problems": 3,
    "n": 2,
    "turns": 1,
    "max_new_tokens": 16,
    "batch_size": 8,
    "chunk_size": 3,
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 128,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = {"padded", "continuous", "served", "vllm", "vllm-served"}
    if not set(modes) <= known:
        raise SystemExit(f"--modes: some of {', '.join(sorted(known))}; got {args.modes!r}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-list download
    work = Path(tempfile.mkdtemp(prefix="trajectory-bench-"))
    try:
        weights = any(not m.startswith("vllm") for m in modes)  # vLLM alone: dummy weights
        model, params = build_model(args.model_dir or work / "model", args, weights)
        problems = load_problems(args.problems, args.max_statement_chars)
        import torch

        device = (
            torch.cuda.get_device_name(0)
            if torch.cuda.is_available() and args.device in ("auto", "cuda")
            else "cpu"
        )
        results = []
        for mode in modes:
            print(f"running {mode} ...", file=sys.stderr, flush=True)
            try:
                results.append(run_mode(mode, model, problems, args, work))
            except Exception as exc:  # one engine failing must not lose the others' figures
                print(f"{mode} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                results.append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "trajectory_throughput",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "device": device,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
        },
        "model": {
            "parameters": params,
            "hidden": args.hidden,
            "layers": args.layers,
            "dtype": args.dtype,
        },
        "settings": {
            k: getattr(args, k)
            for k in (
                "problems",
                "n",
                "turns",
                "max_new_tokens",
                "batch_size",
                "chunk_size",
                "lanes",
                "code_share",
                "sandbox_concurrency",
                "backend",
                "seed",
            )
        },
        "results": results,
    }
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def render(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        f"trajectory throughput on {m['device']} ({m['cpus']} CPUs), torch {m['torch']}, "
        f"transformers {m['transformers']}",
        f"model: {report['model']['parameters'] / 1e6:.1f}M parameters; {s['problems']} problems "
        f"x {s['n']} samples, {s['turns']} feedback turns, {s['max_new_tokens']} new tokens/turn, "
        f"sandbox concurrency {s['sandbox_concurrency']}",
        "",
        "| mode | traj/min | wall s | generate | waiting on sandbox | other | sandbox busy s | "
        "gen tok/s | programs | eval s (programs) | sandbox < 10% |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ok = [r for r in report["results"] if "error" not in r]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['mode']} | failed: {r['error'][:300]} |" + " |" * 9)
            continue
        lines.append(
            f"| {r['mode']} | {r['trajectories_per_min']} | {r['wall_s']} | "
            f"{100 * r['generate_share']:.1f}% | {100 * r['sandbox_share']:.1f}% | "
            f"{100 * r['other_share']:.1f}% | {r['sandbox_busy_s']} | "
            f"{r['generated_tokens_per_s']} | "
            f"{r['programs_judged']} | {r['evaluation_s']} ({r['evaluation_programs']}) | "
            f"{'yes' if r['goal_sandbox_share_met'] else 'NO'} |"
        )
    for r in ok[1:]:
        lines.append(
            f"{ok[0]['mode']} / {r['mode']}: "
            f"{ok[0]['trajectories_per_min'] / r['trajectories_per_min']:.2f}x trajectories/min"
        )
    turns = s["turns"] + 1
    for r in ok:
        lines.append(
            f"{r['mode']}: {r['trajectories']} trajectories x {turns} turns x "
            f"{s['max_new_tokens']} tokens in {r['wall_s']} s (model load {r['model_load_s']} s)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
