"""`scripts/gpu/seed_scan.sh`, the device call that runs `scripts/embedded_seeds.py` for many seeds
at once, on CPU with a small plan: every seed's process adds its results to one file, the script
returns once the plan is done, and at its deadline it stops the seeds still running; and what the
seeds of `scripts/embedded_seeds.py` share (the data stage) and do not (trajectories, evaluations),
and that a second call runs nothing already recorded. (Several settings in one file:
tests/pipeline/test_embedded_seeds.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def scan(tmp_path: Path, plan_lines: list[str], seeds: str, seconds: int) -> str:
    plan = tmp_path / "plan.txt"
    plan.write_text("# a comment line, skipped\n\n" + "\n".join(plan_lines) + "\n")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3: this venv's
        "OUT": str(tmp_path / "out"),
        "SCAN_DIR": str(tmp_path / "scan"),
        "BUNDLE_READY": "1",  # no bundle to install here
    }
    done = subprocess.run(
        ["bash", str(REPO / "scripts/gpu/seed_scan.sh"), seeds, str(seconds), str(plan)],
        env=env, capture_output=True, text=True, timeout=seconds + 120, check=True,
    )  # fmt: skip
    return done.stdout


def leftovers(tmp_path: Path) -> list[str]:
    """Processes still running with the scan's storage in their command line."""
    found = subprocess.run(["pgrep", "-af", str(tmp_path / "scan")], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def embedded_seeds():
    spec = importlib.util.spec_from_file_location(
        "embedded_seeds", REPO / "scripts/embedded_seeds.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_seeds_run_side_by_side_into_one_results_file_and_the_deadline_stops_them(
    tmp_path, small_run_config, capsys
):
    """Over 60 s: two small pipeline runs side by side, each a process of its own."""
    config = small_run_config(eval_limit=4, concurrency=1)
    small = f"--config {config} --max-steps 1 --batch 8"
    out = scan(tmp_path, [f"{small} --label a"], "0-1", 600)
    assert "0 of 2 seeds stopped at the deadline" in out
    results = json.loads((tmp_path / "out" / "scan.json").read_text())["settings"]
    assert {label: sorted(entry["seeds"]) for label, entry in results.items()} == {"a": ["0", "1"]}
    assert (tmp_path / "out" / "seed-1.tail.log").stat().st_size > 0
    for result in results["a"]["seeds"].values():
        assert "after 1 cobalt GRPO steps" in result["line"]
        problems = result["problems"]  # per-problem Pass@1, for the bootstrap
        assert len(problems["ids"]) == len(problems["0"]["before"]) == 4
    assert results["a"]["fields"]["training"]["max_steps"] == 1
    storage = tmp_path / "scan" / "runs"  # both seeds' one storage
    assert len(list(storage.glob("datasets/problemsets/*/MANIFEST.json"))) == 1  # shared
    # each seed its own: training trajectories, evaluation before, evaluation after
    assert len(list(storage.glob("trajectories/evaluation/*/MANIFEST.json"))) == 6
    # both seeds recorded: a second call runs nothing (no flow, no Prefect API)
    argv = ["--storage", str(storage), "--out", str(tmp_path / "scan" / "scan.json")]
    assert embedded_seeds().main([*argv, "--seeds", "0,1", *small.split(), "--label", "a"]) == 0
    printed = capsys.readouterr().out
    assert "| all | 0 | 2 |" in printed and "seed 0:" not in printed

    # a plan longer than its deadline: the seeds are stopped, nothing of them keeps running
    out = scan(tmp_path, [f"{small} --max-steps 3 --label c"], "2-3", 3)
    assert "2 of 2 seeds stopped at the deadline" in out
    deadline = time.monotonic() + 30  # their processes end on SIGTERM, after the script returns
    while leftovers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(tmp_path) == []
    results = json.loads((tmp_path / "scan" / "scan.json").read_text())["settings"]
    assert "c" not in results and sorted(results["a"]["seeds"]) == ["0", "1"]
