"""Do N training processes compute what one process computes?

    python -m benchmarks.parity                                   # CPU: GRPO, 1 vs 2 (gloo)
    python -m benchmarks.parity --mode offline
    python -m benchmarks.parity --kill-resume 2:ddp               # + a killed, resumed run
    python -m benchmarks.parity --model DIR --preset paper --precision mixed \\
        --layouts 1 4:ddp 4:fsdp 4:zero3 --repeat --json out.json  # on the GPUs of a machine

Every layout (`PROCESSES[:SHARDING]`, or `NODESxPROCESSES[:SHARDING]`: that many launchers on
this host, each a node with its own node rank, meeting at one rendezvous, as separate machines
do; `@MICRO` after either: micro-batches of MICRO rows a process, the same step; `+pack`: packed
forward passes, no padding; `+share`: packed, each prompt once) trains the same rows from the same
seed through the training stage's own launcher (`cobalt.training.launch.run_job`: the run's GPU
plan, `accelerate launch`, the shipped accelerate configs, the real trainers and the real sandbox
rewards). GRPO trains on fixed completions (benchmarks/parity_rollout.py: sampling is the one part
taken out, so that every layout sees the same completions; everything after it is in), by default
two optimizer steps per generation batch as the paper preset has; offline mode on logged rows. Each
layout is compared with the first: the per-step loss and gradient norm, and the final weights as
||w - w_first|| / ||w_first - w_start|| (the difference relative to the update training made:
0 for identical training, 1 for as different as the update itself) and the largest single weight
difference. `--repeat` trains the first layout twice: the configuration's own noise floor (0 on a
CPU in fp32; bf16 kernels on a GPU are not deterministic). `--kill-resume LAYOUT` kills that
layout once its first checkpoint is complete (SIGKILL of the launcher), resumes it, and compares
the resumed run's weights with the uninterrupted run of the same layout. `--reuse DIR` keeps each
layout's run in DIR under a key of what decides it (the training config, the mode and data, the
model's weights, the completions): a later call with an equal key reads the run back instead of
training it again (adding a layout to a comparison does not retrain the first; the tests share
their one-process runs this way). The key does not cover the code: empty DIR after changing it.

Prints a table and a verdict (every comparison within --tolerance; a step's loss may instead be
within --loss-abs in absolute); exit 1 when one is not.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from benchmarks.grpo_scaling import dataset as dataset_of
from benchmarks.parity_rollout import ENV
from cobalt.bandit.dataset import commit_rows
from cobalt.judging import SandboxRuntime
from cobalt.models import weights_digest
from cobalt.storage import StorageConfig, open_storage
from cobalt.tables import markdown_table
from cobalt.training.launch import Job, run_job
from cobalt.training.machinery.checkpoints import last_checkpoint
from cobalt.training.settings import OfflineSettings, TrainingConfig

ROOT = Path(__file__).resolve().parents[1]
RUN = (
    "import sys; from cobalt.training.launch import Job, run_job; "
    "run_job(Job.model_validate_json(open(sys.argv[1]).read()))"
)
NO_CODE = "I am not sure how to solve this one."


class ParitySpec(BaseModel):
    """What the harness's datasets are (their manifests record it)."""

    family: str = "cobalt.data.synthetic.KINDS"
    prompts: int


def problems(count: int) -> list[Any]:
    from cobalt.data import synthetic

    return synthetic.make_problems(synthetic.KINDS, count, seed=0)


def completions(found: list[Any]) -> dict[str, list[str]]:
    """Four answers of different lengths and rewards per problem: its reference solution, a
    wrong constant, the next problem's solution, no code."""
    table = {}
    for i, p in enumerate(found):
        other = found[(i + 1) % len(found)]
        table[p.id] = [
            f"Here is my solution.\n```python\n{p.solutions[0]}```",
            "```python\nprint(0)\n```",
            f"```python\n{other.solutions[0]}```\nThis reads the input and prints the result.",
            NO_CODE,
        ]
    return table


def offline_dataset(storage: StorageConfig, found: list[Any], table: dict[str, list[str]]) -> Any:
    """Logged rows: each problem's four answers with rewards 1, -0.1, -0.1, -1 and their
    leave-one-out advantages."""
    rewards = [1.0, -0.1, -0.1, -1.0]
    rows = []
    for p in found:
        for j, (text, reward) in enumerate(zip(table[p.id], rewards, strict=True)):
            others = [r for k, r in enumerate(rewards) if k != j]
            rows.append(
                {"prompt": [{"role": "user", "content": p.instruction}], "completion": text,
                 "reward": reward, "advantage": reward - sum(others) / len(others),
                 "stopped": True, "turn": 0, "example_id": p.id, "sample": j}
            )  # fmt: skip
    st = open_storage(storage)
    return commit_rows(
        st, st.path("offline", "parity"), "parity", rows, {}, ParitySpec(prompts=len(found))
    )


def base_config(args: argparse.Namespace) -> TrainingConfig:
    """The recipe every layout trains: one process's step (shared by N processes)."""
    common: dict[str, Any] = {
        "preset": args.preset, "precision": args.precision, "max_steps": args.steps,
        "report_to": [],
    }  # fmt: skip
    accumulation = args.step // args.micro_batch
    if args.mode == "offline":
        offline = OfflineSettings(
            objective="reinforce_loo", batch_size=args.micro_batch,
            gradient_accumulation_steps=accumulation, learning_rate=args.lr,
        )  # fmt: skip
        return TrainingConfig(mode="offline", offline=offline, **common)
    overrides = {
        "num_generations": 4, "per_device_train_batch_size": args.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "generation_batch_size": args.step * args.windows, "max_completion_length": 256,
        "learning_rate": args.lr,
    }  # fmt: skip
    return TrainingConfig(
        mode="single_turn", rollout="benchmarks.parity_rollout:replay",
        generation="transformers", overrides=overrides, **common,
    )  # fmt: skip


def layout_config(base: TrainingConfig, layout: str, **more: Any) -> TrainingConfig:
    """`[NODESx]PROCESSES[:SHARDING[/GATHER]][@MICRO][+pack][+trim][+sync]`: `@MICRO` trains
    the same step in micro-batches of MICRO rows a process (the accumulation follows), the
    yardstick of a layout whose only change is how a step's rows are grouped; `/GATHER` FSDP's
    training.fsdp_gather; `+pack` packed forward passes (training.packing), `+share` packed with
    each prompt computed once (training.share_prompts), `+trim` trimmed ones
    (training.trim_padding), `+sync` the gradients reduced every micro-batch
    (training.gradient_sync micro_batch)."""
    layout, *passes = layout.split("+")
    unknown = set(passes) - {"pack", "share", "trim", "sync"}
    if unknown:
        raise SystemExit(
            f"layout {layout!r}: unknown +{sorted(unknown)[0]}; use +pack, +share, +trim or +sync"
        )
    share = "share" in passes
    more = {
        "packing": "pack" in passes or share, "share_prompts": share,
        "trim_padding": "trim" in passes or None,
        "gradient_sync": "micro_batch" if "sync" in passes else "auto", **more,
    }  # fmt: skip
    layout, _, micro = layout.partition("@")
    shape, _, sharding = layout.partition(":")
    sharding, _, gather = sharding.partition("/")
    nodes, _, processes = shape.rpartition("x")
    update = {"num_processes": int(processes), "sharding": sharding or "auto", **more}
    if gather:
        update["fsdp_gather"] = gather
    if nodes and int(nodes) > 1:
        update |= {"nodes": int(nodes), "rdzv_endpoint": f"127.0.0.1:{free_port()}"}
    if micro:
        update |= regrouped(base, int(micro))
    return base.model_copy(update=update)


def regrouped(base: TrainingConfig, micro: int) -> dict[str, Any]:
    """The config fields that train `base`'s step in micro-batches of `micro` rows."""
    if base.mode == "offline":
        settings = base.offline
        step = settings.batch_size * settings.gradient_accumulation_steps
    else:
        overrides = base.overrides
        step = overrides["per_device_train_batch_size"] * overrides["gradient_accumulation_steps"]
    if micro < 1 or step % micro:
        raise SystemExit(f"layout @{micro}: a step's {step} rows do not split into micro-batches "
                         f"of {micro}; pick a divisor of {step}")  # fmt: skip
    if base.mode == "offline":
        fields = {"batch_size": micro, "gradient_accumulation_steps": step // micro}
        return {"offline": base.offline.model_copy(update=fields)}
    fields = {"per_device_train_batch_size": micro, "gradient_accumulation_steps": step // micro}
    return {"overrides": {**base.overrides, **fields}}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_gpus(rank: int, per_node: int) -> dict[str, str]:
    """The GPUs node `rank` sees (CUDA_VISIBLE_DEVICES: this host's GPUs cut into nodes), or
    nothing on a machine without GPUs."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(rank * per_node + i) for i in range(per_node))}


def run_nodes(job: Job, work: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """`job` on each of its nodes: nodes 1.. as launchers of their own in the background (each in
    an output directory of its own and with GPUs of its own, as on another machine), node 0
    here; node 0's result."""
    per_node = job.config.num_processes
    others = []
    for rank in range(1, job.config.nodes):
        config = job.config.model_copy(update={"node_rank": rank})
        node = job.model_copy(
            update={"config": config, "output_dir": f"{job.output_dir}-node{rank}", "plan": None}
        )
        job_file = work / f"{Path(job.output_dir).name}-node{rank}.json"
        job_file.write_text(node.model_dump_json())
        log = (work / f"{job_file.stem}.log").open("wb")
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        env |= node_gpus(rank, per_node)
        command = [sys.executable, "-c", RUN, str(job_file)]
        others.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ.update(node_gpus(0, per_node))  # node 0's launch sees its own GPUs
    try:
        return run_job(job)
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
        for other in others:
            other.wait(timeout=600)


def run_key(config: TrainingConfig, args: argparse.Namespace, model: str, table: dict) -> str:
    """What decides a layout's run (its rendezvous port aside): `--reuse`'s key."""
    import hashlib

    blob = {
        "config": config.model_dump(mode="json", exclude={"rdzv_endpoint"}),
        "mode": args.mode, "prompts": args.prompts, "backend": args.backend,
        "model": model, "completions": table,
    }  # fmt: skip
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def history_of(history: list[dict[str, Any]]) -> dict[str, list[float]]:
    steps = [h for h in history if "loss" in h and "step" in h]
    return {k: [float(h.get(k, float("nan"))) for h in steps] for k in ("loss", "grad_norm")}


def weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    found: dict[str, Any] = {}
    for path in sorted(directory.glob("*.safetensors")):
        found |= {k: v.float() for k, v in load_file(str(path)).items()}
    return found


def compare(a: Path, b: Path, start: dict[str, Any]) -> dict[str, float]:
    """b's final weights against a's, relative to a's update."""
    import torch

    wa, wb = weights(a), weights(b)
    diff = sum(float(((wa[k] - wb[k]) ** 2).sum()) for k in wa) ** 0.5
    update = sum(float(((wa[k] - start[k]) ** 2).sum()) for k in wa) ** 0.5
    return {
        "weights_rel": diff / update if update else float("inf"),
        "weights_max_abs": max(float((wa[k] - wb[k]).abs().max()) for k in wa),
        "update_max_abs": max(float((wa[k] - start[k]).abs().max()) for k in wa),
        "finite": all(bool(torch.isfinite(v).all()) for v in wb.values()),
    }


def steps_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, float]:
    out = {"steps": len(b["loss"])}
    for key in ("loss", "grad_norm"):
        pairs = list(zip(a[key], b[key], strict=False))
        out[f"{key}_max_rel"] = max(
            (abs(x - y) / max(abs(x), 1e-12) for x, y in pairs), default=float("nan")
        )
    out["loss_max_abs"] = max(
        (abs(x - y) for x, y in zip(a["loss"], b["loss"], strict=False)), default=float("nan")
    )
    return out


def row_of(first: dict[str, Any], other: dict[str, Any], start: dict[str, Any]) -> dict[str, Any]:
    """A layout's row: against the first layout, or the error that stopped it."""
    if "error" in other:
        return {"layout": other["name"], "error": other["error"], "finite": False,
                "weights_rel": float("inf"), "loss_max_rel": float("inf")}  # fmt: skip
    row = {"layout": other["name"], "wall_s": other["wall_s"], "train_s": other["train_s"],
           "peak_gib": other["peak_gib"],
           "wrapped": other["plan"].get("wrapped_as"),
           "gather": other["plan"].get("gather_in_use"),
           "reduce": other["plan"].get("reduce_in_use"),
           "sync": other["plan"].get("gradient_sync")}  # fmt: skip
    row |= steps_diff(first["history"], other["history"])
    return row | compare(first["dir"], other["dir"], start)


def kill_after_first_checkpoint(job: Job, work: Path) -> dict[str, Any]:
    """Run `job` in a process group of its own and SIGKILL it once a checkpoint is complete."""
    job_file = work / "killed-job.json"
    job_file.write_text(job.model_dump_json())
    out = Path(job.output_dir)
    started = time.monotonic()
    with (work / "killed.log").open("wb") as log:
        run = subprocess.Popen(
            [sys.executable, "-c", RUN, str(job_file)], start_new_session=True, stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"},
        )  # fmt: skip
        while last_checkpoint(out) is None and run.poll() is None:
            time.sleep(0.05)
        killed = run.poll() is None
        if killed:
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    time.sleep(2)  # the training processes die with their launcher
    left = subprocess.run(
        ["pgrep", "-f", "cobalt.training.launch"], capture_output=True, text=True
    ).stdout.split()
    survived = last_checkpoint(out)
    return {
        "killed": killed,
        "after_s": round(time.monotonic() - started, 1),
        "checkpoint": survived and Path(survived).name,
        "processes_left_running": len(left),
        "log_tail": "" if killed else (work / "killed.log").read_text(errors="replace")[-1500:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.parity",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    arg = parser.add_argument
    arg("--model", type=Path, help="a model directory (default: the tiny random model, built)")
    arg("--mode", choices=["grpo", "offline"], default="grpo")
    arg("--preset", choices=["tiny", "paper"], default="tiny")
    arg("--precision", choices=["auto", "mixed", "fp32", "bf16"], default="auto")
    arg(
        "--layouts",
        nargs="+",
        default=["1", "2:ddp"],
        help="[NODESx]PROCESSES[:SHARDING[/GATHER]][@MICRO][+pack|+share], the first is the base",
    )
    arg("--steps", type=int, default=4, help="optimizer steps")
    arg("--step", type=int, default=16, help="completions (rows) per optimizer step")
    arg("--micro-batch", type=int, default=4, help="one process's micro-batch")
    arg("--windows", type=int, default=2, help="GRPO: optimizer steps per generation batch")
    arg("--prompts", type=int, default=32)
    arg("--lr", type=float, default=1e-4)
    arg("--repeat", action="store_true", help="the first layout twice: the noise floor")
    arg("--kill-resume", metavar="LAYOUT", help="kill that layout after a checkpoint, resume")
    arg("--tolerance", type=float, default=1e-3, help="largest weights_rel and step diffs")
    arg("--loss-abs", type=float, default=0.0,
        help="a step's loss may also differ by this much in absolute (small losses: mixed "
             "precision)")  # fmt: skip
    arg("--backend", default="namespace", help="the sandbox backend of the rewards")
    arg("--reuse", type=Path, metavar="DIR",
        help="keep each layout's run in DIR and read back a run whose config, data and model "
             "are the same (not the code: empty DIR after changing it)")  # fmt: skip
    arg("--json", type=Path)
    arg("--work", type=Path, help="keep the runs' directories and logs here (default: removed)")
    args = parser.parse_args(argv)
    if args.step % args.micro_batch:
        parser.error("--step must be a multiple of --micro-batch")

    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = args.model
        if model is None:
            from engines.tiny import build_tiny_model

            model = build_tiny_model(work / "tiny", seed=0)
        found = problems(args.prompts)
        table = completions(found)
        (work / "completions.json").write_text(json.dumps(table))
        os.environ[ENV] = str(work / "completions.json")
        storage = StorageConfig(url=str(work / "runs"))
        dataset = (
            offline_dataset(storage, found, table)
            if args.mode == "offline"
            else dataset_of(storage, args.prompts)  # the same problems, as turn-0 bandit rows
        )
        sandbox = SandboxRuntime(backend=args.backend, concurrency=8)
        base = base_config(args)
        start = weights(Path(model))

        model_digest = weights_digest(model)

        def run(name: str, config: TrainingConfig) -> dict[str, Any]:
            kept = None
            if args.reuse:
                kept = args.reuse / run_key(config, args, model_digest, table)
                if (kept / "run.json").is_file():
                    found = json.loads((kept / "run.json").read_text())
                    return found | {"name": name, "dir": kept / "out", "reused": True}
            out = kept / "out" if kept else work / name
            job = Job(config=config, dataset=dataset, storage=storage, sandbox=sandbox,
                      model=str(model), output_dir=str(out))  # fmt: skip
            began = time.monotonic()
            try:
                history, timing, extra = run_nodes(job, work) if config.nodes > 1 else run_job(job)
            except Exception as exc:  # one layout failing is a result too: the others still run
                return {"name": name, "error": str(exc).splitlines()[0][:400]}
            result = {
                "name": name, "dir": out, "wall_s": round(time.monotonic() - began, 1),
                "train_s": timing.get("total_s"), "history": history_of(history),
                "peak_gib": extra.get("gpu_peak_memory_gib"),
                "plan": (extra.get("numerics") or {}),
            }  # fmt: skip
            if kept:
                (kept / "run.json").write_text(json.dumps(result, default=str))
            return result

        runs: list[dict[str, Any]] = []
        rows: list[dict[str, Any]] = []
        asked = [(layout, layout) for layout in args.layouts]
        if args.repeat:
            asked.append((f"{args.layouts[0]} again", args.layouts[0]))
        for name, layout in asked:  # each layout's row as soon as it ran (a stopped run keeps them)
            runs.append(run(name, layout_config(base, layout)))
            if "error" in runs[0]:
                raise SystemExit(f"the first layout failed: {runs[0]['error']}")
            rows.append(row_of(runs[0], runs[-1], start))
            if args.json:
                args.json.write_text(json.dumps({"rows": rows, "partial": True}, default=str))
        first = runs[0]
        if args.kill_resume and not any(
            r["name"] == args.kill_resume and "error" not in r for r in runs
        ):
            rows.append({"layout": f"{args.kill_resume} killed and resumed", "finite": False,
                         "error": "not run: the uninterrupted layout failed or was not asked for",
                         "weights_rel": float("inf"), "loss_max_rel": float("inf")})  # fmt: skip
        elif args.kill_resume:
            layout = args.kill_resume
            # a checkpoint between generation batches (the plan refuses any other)
            windows = args.windows if args.mode == "grpo" else 1
            config = layout_config(base, layout, save_steps=windows)
            job = Job(config=config, dataset=dataset, storage=storage, sandbox=sandbox,
                      model=str(model), output_dir=str(work / "resumed"))  # fmt: skip
            killed = kill_after_first_checkpoint(job, work)
            history, _, _ = run_job(job)
            plain = next(r for r in runs if r["name"] == layout and "error" not in r)
            row = {"layout": f"{layout} killed after {killed['checkpoint']}, resumed",
                   "wall_s": None, "train_s": None, "wrapped": None, "gather": None,
                   "reduce": None}  # fmt: skip
            row |= steps_diff(plain["history"], history_of(history))
            row |= compare(plain["dir"], work / "resumed", start)
            row["killed"] = killed["killed"]
            rows.append(row)
        for row in rows:
            for key, value in row.items():
                if isinstance(value, float):
                    row[key] = float(f"{value:.3g}")
    checked = rows[1:]
    ok = all(
        r["finite"] and r["weights_rel"] <= args.tolerance and r.get("killed", True)
        and (r["loss_max_rel"] <= args.tolerance or r.get("loss_max_abs", 1.0) <= args.loss_abs)
        for r in checked
    )  # fmt: skip
    result = {
        "settings": {k: str(v) for k, v in vars(args).items()},
        "first": {"loss": first["history"]["loss"], "grad_norm": first["history"]["grad_norm"]},
        "histories": {r["name"]: r.get("history") for r in runs},
        "rows": rows,
        "ok": ok,
    }
    columns = {k: None for row in rows for k in row}
    print(markdown_table([{k: row.get(k) for k in columns} for row in rows]))
    also = f" (a step's loss: or within {args.loss_abs} absolute)" if args.loss_abs else ""
    print(f"\nverdict: {'every' if ok else 'NOT every'} layout within {args.tolerance}{also}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
