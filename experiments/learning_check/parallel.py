"""Several seeds at once: one process per seed (`python -m experiments.learning_check --child
...`), `--parallel` of them at a time on one machine (one GPU shared, the CPUs divided among
them), an optional deadline, then the aggregate of the output directory. Each child logs to
`<out>/logs/<label>.log` and writes `<out>/runs/<label>.json` (`seed_run`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.learning_check import results
from experiments.learning_check.config import as_json, cpus, seeds_of

ROOT = Path(__file__).resolve().parents[2]  # the repository: the children import this code
CHILD = [sys.executable, "-m", "experiments.learning_check"]
POLL_S = 0.5
KILL_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
AGGREGATE_S = 15.0  # kept free at the end of --deadline-s for the aggregate
MIN_START_S = 60.0  # a run is not started this close to its deadline


def labels(args: argparse.Namespace) -> list[tuple[int, str]]:
    """(seed, label) of every run: seed<S> per seed, seed<S>-r<k> for each repeat (k counts on
    past the runs already in the output directory)."""
    taken = {p.stem for p in results.result_files(args.out)}
    out: list[tuple[int, str]] = []
    for seed in seeds_of(args.seeds) + seeds_of(args.repeat):
        label, k = f"seed{seed}", 0
        while label in taken:
            k += 1
            label = f"seed{seed}-r{k}"
        taken.add(label)
        out.append((seed, label))
    return out


def child_env(args: argparse.Namespace) -> dict[str, str]:
    threads = str(max(1, cpus() // args.parallel))
    env = dict(os.environ)
    env.update(
        {
            "PYTHONHASHSEED": "0",
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "TOKENIZERS_PARALLELISM": "false",
            "PYTORCH_CUDA_ALLOC_CONF": env.get(
                "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"
            ),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "TRANSFORMERS_VERBOSITY": "warning",
            "TQDM_DISABLE": "1",
        }
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_seeds(args: argparse.Namespace, child: Sequence[str] = CHILD) -> dict[str, Any]:
    """Start every run (`child --child ...`: this package, unless a test stands in), `args.parallel`
    at a time; stop them at the deadline. Returns {label: {"seed", "exit", "status", "wall_s"}}."""
    started = time.time()
    deadline = started + args.deadline_s if args.deadline_s else 0.0
    child_deadline = deadline - AGGREGATE_S - KILL_GRACE_S if deadline else 0.0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    settings = args.out / "settings.json"
    settings.write_text(json.dumps(as_json(args), indent=1) + "\n")
    env = child_env(args)
    todo = labels(args)
    running: dict[str, tuple[subprocess.Popen, float, int, Any]] = {}
    done: dict[str, Any] = {}
    while todo or running:
        now = time.time()
        while todo and len(running) < args.parallel:
            seed, label = todo.pop(0)
            if child_deadline and now > child_deadline - MIN_START_S:
                done[label] = {"seed": seed, "exit": None, "status": "not_started"}
                continue
            cmd = [*child, "--child", str(settings), "--out", str(args.out)]
            cmd += ["--seed", str(seed), "--label", label, "--deadline-at", str(child_deadline)]
            sink = (args.out / "logs" / f"{label}.log").open("wb")
            proc = subprocess.Popen(
                cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            running[label] = (proc, now, seed, sink)
            print(f"started {label} (pid {proc.pid})", flush=True)
        for label, (proc, t0, seed, sink) in list(running.items()):
            code = proc.poll()
            if code is None and deadline and now > deadline - AGGREGATE_S:
                code = _stop(proc)
                results.mark(args.out, label, "killed")
            if code is not None:
                sink.close()
                status = results.status_of(args.out, label)
                done[label] = {"seed": seed, "exit": code, "status": status, "wall_s": now - t0}
                print(f"{label}: exit {code}, {status}, {now - t0:.0f} s", flush=True)
                del running[label]
        time.sleep(POLL_S)
    return done


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM to the child's process group (its sandbox workers too), SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()
