"""A sharded training run killed mid-way resumes with the same job, and saves a model directory
that transformers (and vLLM, where installed) load, on the GPUs of this
machine: the training stage's own launcher (`cobalt.training.launch.run_job`) with --sharding,
the tiny model and the synthetic turn-0 rows (small and quick: the figure is the mechanism; the
8B runs are scripts/gpu/paper.sh). Prints a JSON summary; exit 1 when a check fails.

    python scripts/gpu/sharded_check.py --processes 4 --sharding fsdp --json out.json
    python scripts/gpu/sharded_check.py --processes 4 --generation vllm_colocate --no-kill
    python scripts/gpu/sharded_check.py --processes 2 --sharding ddp --smoke   # CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grpo_scaling import dataset  # noqa: E402
from benchmarks.parity import kill_after_first_checkpoint  # noqa: E402
from cobalt.judging import SandboxRuntime  # noqa: E402
from cobalt.storage import StorageConfig  # noqa: E402
from cobalt.training.launch import Job, run_job  # noqa: E402
from cobalt.training.settings import TrainingConfig  # noqa: E402


def job(args: argparse.Namespace, model: Path, work: Path) -> Job:
    storage = StorageConfig(url=str(work / "runs"))
    overrides: dict[str, Any] = {
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "generation_batch_size": 4 * args.processes,
        "max_completion_length": 32,
    }
    if args.generation.startswith("vllm"):
        overrides["vllm_gpu_memory_utilization"] = 0.2
    return Job(
        config=TrainingConfig(
            preset="tiny",
            mode="cobalt",
            num_processes=args.processes,
            sharding=args.sharding,
            generation=args.generation,
            max_steps=args.steps,
            save_steps=2,
            report_to=[],
            overrides=overrides,
        ),
        dataset=dataset(storage, 64),
        storage=storage,
        sandbox=SandboxRuntime(backend=args.backend, concurrency=8),
        model=str(model),
        output_dir=str(work / "out"),
    )


def check_saved(out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out))
    found: dict[str, Any] = {
        "transformers_loads": True,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype),
        "finite": all(torch.isfinite(p).all().item() for p in model.parameters()),
    }
    try:
        import vllm
    except ImportError:
        return found | {"vllm_loads": None}
    # this process has used CUDA already: vLLM's engine process must be spawned, not forked
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    llm = vllm.LLM(model=str(out), gpu_memory_utilization=0.2, enforce_eager=True)
    text = llm.generate(["Hello"], vllm.SamplingParams(max_tokens=4))[0].outputs[0].text
    return found | {"vllm_loads": isinstance(text, str)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arg = parser.add_argument
    arg("--processes", type=int, default=4)
    arg("--sharding", default="fsdp", choices=["auto", "ddp", "fsdp", "zero3"])
    arg("--generation", default="transformers", help="transformers or vllm_colocate")
    arg("--steps", type=int, default=8)
    arg("--kill", action=argparse.BooleanOptionalAction, default=True, help="kill and resume")
    arg("--backend", default="namespace")
    arg("--smoke", action="store_true", help="CPU: gloo processes (use --sharding ddp)")
    arg("--json", type=Path)
    args = parser.parse_args(argv)
    from engines.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "tiny", seed=0)
        the_job = job(args, model, work)
        result: dict[str, Any] = {"settings": vars(args) | {"json": str(args.json)}}
        if args.kill:
            result["first_run"] = kill_after_first_checkpoint(the_job, work)
        started = time.monotonic()
        history, timing, extra = run_job(the_job)
        out = Path(the_job.output_dir)
        result["resumed_run"] = {
            "wall_s": round(time.monotonic() - started, 1),
            "steps_in_history": [h["step"] for h in history if "loss" in h],
            "steps_run": timing["steps"],
            "timing": timing,
            "gpu_peaks_by_process_gib": extra.get("gpu_peaks_by_process_gib"),
            "launch": (out / ".launch" / "launch.log").read_text(errors="replace")[-800:],
        }
        if args.json:  # what ran so far, before the load checks
            args.json.write_text(json.dumps(result, indent=1, default=str))
        result["saved"] = check_saved(out)
    steps = result["resumed_run"]["steps_in_history"]
    ok = steps == list(range(1, args.steps + 1)) and result["saved"]["finite"]
    if args.kill:
        first = result["first_run"]
        ok = ok and first["killed"] and first["processes_left_running"] == 0
        ok = ok and timing["steps"] < args.steps
    result["ok"] = ok
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
