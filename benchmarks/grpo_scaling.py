"""GRPO on one GPU vs several: optimizer-step time and sampled completions per second, same
per-process settings, through the training stage's own launcher (`cobalt.training.launch`:
in-process for 1, `accelerate launch` DDP for more). Results in docs/RESULTS.md.

    python -m benchmarks.grpo_scaling --processes 1,2          # a 2-GPU machine
    python -m benchmarks.grpo_scaling --smoke --processes 1,2  # CPU (gloo): the code path only
    python -m benchmarks.grpo_scaling --shape 8b --lora --processes 1 \
        --generation transformers,vllm_colocate                # the paper's model size, one GPU

Workload: a Qwen2-shaped model with random weights (`engines.tiny`, default ~148M parameters;
its text is noise, so every completion runs to --max-completion tokens unless it samples the
end-of-turn token), turn-0 prompts of the synthetic problem family as a committed bandit dataset,
the Cobalt correctness reward judged in the sandbox (a random model writes no program, so the
reward is -1 without a sandbox run: the figure is the GPU side of a step). Each process gets
--per-device completions per optimizer step (--generations per prompt), so N processes sample N
times as many completions per step: the goal is samples/s on 2 GPUs >= 1.7 x one GPU. Step time
is the median over the steps after --warmup.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402

from cobalt.bandit.dataset import BanditRef, commit_rows  # noqa: E402
from cobalt.bandit.rows import prepare_rows  # noqa: E402
from cobalt.data import synthetic  # noqa: E402
from cobalt.judging import SandboxRuntime  # noqa: E402
from cobalt.storage import StorageConfig, open_storage  # noqa: E402
from cobalt.training.launch import Job, run_job  # noqa: E402
from cobalt.training.settings import LoraSettings, TrainingConfig  # noqa: E402

GOAL = 1.7


def dataset(storage: StorageConfig, prompts: int) -> BanditRef:
    """Turn-0 rows of the synthetic family, committed as a bandit dataset."""
    rows = [
        {
            "prompt": [{"role": "user", "content": p.instruction}],
            "test_cases": p.tests.model_dump(),
            "prev_best_pass_rate": 0.0,
            "difficulty": p.difficulty,
            "example_id": p.id,
        }
        for p in synthetic.make_problems(synthetic.KINDS, prompts, seed=0)
    ]
    st = open_storage(storage)
    rows = prepare_rows(rows, "cobalt")
    return commit_rows(
        st, st.path("bandit", "bench"), "bench", rows, {}, BenchSpec(prompts=prompts)
    )


class BenchSpec(BaseModel):
    """The manifest's record of what the benchmark dataset is."""

    family: str = "cobalt.data.synthetic.KINDS"
    prompts: int


# model shapes (hidden, layers, heads, kv heads, intermediate); the vocabulary is the tiny BPE's
SHAPES = {
    "148m": (768, 12, 12, 4, 4608),
    "1.5b": (1536, 28, 12, 2, 8960),  # Qwen2.5-1.5B
    "8b": (4096, 36, 32, 8, 12288),  # Qwen3-8B
}


def config(args: argparse.Namespace, processes: int, generation: str) -> TrainingConfig:
    import torch

    gpu = torch.cuda.is_available()
    micro = args.micro_batch or args.per_device
    if args.per_device % micro:
        raise SystemExit("--micro-batch must divide --per-device")
    overrides = {
        "num_generations": args.generations,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": args.per_device // micro,
        "generation_batch_size": args.per_device * processes,
        "max_completion_length": args.max_completion,
        "learning_rate": 1e-5,
        "use_cpu": not gpu,
        "logging_steps": 1,
        "gradient_checkpointing": args.gradient_checkpointing,
    }
    if generation.startswith("vllm"):
        overrides["vllm_gpu_memory_utilization"] = args.vllm_memory
    return TrainingConfig(
        preset="tiny",
        mode="cobalt",
        num_processes=processes,
        max_steps=args.steps,
        max_prompt_length=1024,
        generation=generation,
        lora=LoraSettings() if args.lora else None,
        accelerate_config=args.accelerate_config,
        precision="mixed" if gpu and args.bf16 else "fp32",
        overrides=overrides,
    )


def run(
    args: argparse.Namespace, processes: int, generation: str, model: Path, work: Path
) -> dict[str, Any]:
    import torch

    storage = StorageConfig(url=str(work / "runs"))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    job = Job(
        config=config(args, processes, generation),
        dataset=dataset(storage, args.prompts),
        storage=storage,
        sandbox=SandboxRuntime(backend=args.backend, concurrency=args.sandbox_concurrency),
        model=str(model),
        output_dir=str(work / f"out-{processes}-{generation}"),
    )
    history, timing, extra = run_job(job)
    # on a GPU the training runs in a process of its own (cobalt.training.launch), which reports
    # its peak reserved memory
    peak = (extra.get("gpu_peak_reserved_gib") or 0) * 2**30 if torch.cuda.is_available() else None
    steps = timing["step_s"][args.warmup :] or timing["step_s"]
    step_s = statistics.median(steps)
    completions = args.per_device * processes
    return {
        "processes": processes,
        "generation": generation,
        "peak_reserved_gib": round(peak / 2**30, 1) if peak else None,
        "step_s_all": [round(x, 3) for x in timing["step_s"]],
        "steps": timing["steps"],
        "step_s_median": round(step_s, 3),
        "completions_per_step": completions,
        "samples_per_s": round(completions / step_s, 2),
        "generation_share": timing.get("generation_share"),
        "reward_share": timing.get("reward_share"),
        "reward_last": next((h["reward"] for h in reversed(history) if "reward" in h), None),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.grpo_scaling",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arg = parser.add_argument
    arg("--processes", default="1,2", help="comma list of process (GPU) counts")
    arg("--smoke", action="store_true", help="a tiny model and batch: the CPU code path")
    arg("--steps", type=int, default=12, help="optimizer steps per run")
    arg("--warmup", type=int, default=2, help="first steps left out of the median")
    arg("--per-device", type=int, default=64, help="completions per process per step")
    arg("--generations", type=int, default=8, help="completions per prompt (num_generations)")
    arg("--max-completion", type=int, default=256, help="max completion tokens")
    arg("--prompts", type=int, default=512, help="prompts in the dataset")
    arg("--shape", choices=sorted(SHAPES), default="148m", help="the random model's shape")
    arg(
        "--generation",
        default="transformers",
        help="comma list of TrainingConfig.generation values to compare: transformers, paged, "
        "vllm_colocate (vLLM in the training process)",
    )
    arg("--lora", action="store_true", help="train LoRA adapters (r 16, all linear layers)")
    arg("--micro-batch", type=int, help="completions per forward/backward (default: --per-device)")
    arg(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="recompute activations in the backward pass (big shapes)",
    )
    arg("--vllm-memory", type=float, default=0.3, help="vllm_colocate: GPU memory share of vLLM")
    arg("--accelerate-config", help="an accelerate config file (DeepSpeed ZeRO-3, FSDP)")
    arg("--bf16", action=argparse.BooleanOptionalAction, default=False, help="bf16 autocast")
    arg("--backend", default="auto", choices=["auto", "docker", "namespace"])
    arg("--sandbox-concurrency", type=int, default=os.cpu_count() or 1)
    arg("--model-dir", type=Path, help="a model to train instead of the random one")
    arg("--json", type=Path, help="also write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.steps, args.warmup, args.per_device, args.generations = 3, 1, 4, 2
        args.max_completion, args.prompts = 16, 16
    import torch

    from engines.tiny import build_tiny_model

    counts = [int(x) for x in args.processes.split(",")]
    generations = [g.strip() for g in args.generation.split(",") if g.strip()]
    hidden, layers, heads, kv_heads, intermediate = (
        (64, 2, 4, 2, 128) if args.smoke else SHAPES[args.shape]
    )
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="grpo-scaling-") as tmp:
        work = Path(tmp)
        model = args.model_dir or build_tiny_model(
            work / "model",
            seed=0,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            intermediate_size=intermediate,
            max_position_embeddings=4096,
            eos_logit=-5.0,  # (almost) never ends a turn: every completion has the same length
            device="cuda" if gpu else "cpu",
            dtype="bfloat16" if gpu and args.shape != "148m" else "float32",
        )
        results = []
        for generation in generations:
            for n in counts:
                print(
                    f"GRPO: {n} process(es), generation {generation} ...",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    results.append(run(args, n, generation, Path(model), work))
                except Exception as exc:  # keep the other runs' figures
                    results.append(
                        {
                            "processes": n,
                            "generation": generation,
                            "error": f"{type(exc).__name__}: {exc}"[-3000:],
                        }
                    )
    ok = [r for r in results if "error" not in r]
    base = ok[0]["samples_per_s"] if ok else None
    for r in ok:
        r["speedup"] = round(r["samples_per_s"] / base, 2) if base else None
    report = {
        "benchmark": "grpo_scaling",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "gpus": torch.cuda.device_count(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "settings": {
            k: getattr(args, k)
            for k in (
                "shape",
                "steps",
                "warmup",
                "per_device",
                "micro_batch",
                "generations",
                "max_completion",
                "bf16",
                "lora",
                "gradient_checkpointing",
                "vllm_memory",
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
        f"GRPO scaling on {m['gpus']} x {m['device']} ({m['cpus']} CPUs), torch {m['torch']}; "
        f"shape {s['shape']}, LoRA {s['lora']}, {s['per_device']} completions per process per "
        f"step, {s['generations']} per prompt, {s['max_completion']} tokens max, bf16 {s['bf16']}",
        "",
        "| processes | generation | step s (median) | completions/step | samples/s | vs first | "
        "generation share | peak reserved GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['processes']} | {r['generation']} | failed: {r['error'][-300:]} |")
            continue
        lines.append(
            f"| {r['processes']} | {r['generation']} | {r['step_s_median']} | "
            f"{r['completions_per_step']} | {r['samples_per_s']} | {r['speedup']}x | "
            f"{r['generation_share']} | {r['peak_reserved_gib']} |"
        )
    last = report["results"][-1]
    if "error" not in last and last["processes"] > 1 and last["speedup"] is not None:
        verdict = "met" if last["speedup"] >= GOAL else "NOT met"
        lines.append(f"\ngoal >= {GOAL}x samples/s on {last['processes']}: {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
