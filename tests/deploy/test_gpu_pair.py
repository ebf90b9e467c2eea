"""`scripts/gpu/pair.sh`, the two-steps-at-once device call, on CPU: a stand-in `nvidia-smi`
reports the GPUs, a stand-in worker records where it ran. Each step gets its own card and half of
the CPUs, both run at once, and each step's files come back packed in one archive; with one GPU
the steps run one after the other on all CPUs. `scripts/gpu/side_by_side.sh` (N pipelines at
once, one per card, every core shared) and `scan_and_steps.sh` the same way."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WORKER = """#!/usr/bin/env bash
# records the card, the CPUs and the arguments it was given, and when it ran
echo "gpu=$CUDA_VISIBLE_DEVICES cpus=$(taskset -cp $$ | sed 's/.*: //') args=$*" >"$OUT/info.txt"
date +%s.%N >"$OUT/start"; sleep 1; date +%s.%N >"$OUT/end"
echo "step $1 done"
"""


def fake_nvidia_smi(bin_dir: Path, gpus: int) -> None:
    rows = "\\n".join(f"{i}, Stand-in GPU, 81559 MiB" for i in range(gpus))
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'case "$*" in *index,name*) printf "{rows}\\n" ;; '
        f"*) for i in $(seq 0 {gpus - 1}); do echo $i; done ;; esac\n"
    )
    script.chmod(0o755)


def cpu_set(text: str) -> set[int]:
    """taskset's list ("0,1", "0-15", "0-3,8") as a set."""
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out |= set(range(int(low), int(high or low) + 1))
    return out


def parse(info: str) -> tuple[str, set[int], str]:
    gpu, cpus, args = info.split(" ", 2)
    return gpu.removeprefix("gpu="), cpu_set(cpus.removeprefix("cpus=")), args.removeprefix("args=")


def run_pair(tmp_path: Path, gpus: int, *specs: str) -> tuple[str, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir, gpus)
    worker = tmp_path / "worker.sh"
    worker.write_text(WORKER)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUT": str(out),
        "PAIR_WORKER": str(worker),
        "BUNDLE_READY": "1",  # no bundle to install here
    }
    done = subprocess.run(
        ["bash", str(REPO / "scripts/gpu/pair.sh"), *specs],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    steps = {}
    for archive in sorted(out.glob("*.tgz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / "unpacked", filter="data")
        tag = archive.name.removesuffix(".tgz")
        steps[tag] = (tmp_path / "unpacked" / tag / "info.txt").read_text().strip()
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.tgz" for t in steps)
    return done.stdout, steps


@pytest.mark.skipif(not os.path.exists("/usr/bin/taskset"), reason="needs taskset (util-linux)")
def test_two_steps_run_at_once_one_per_card_on_half_of_the_cpus(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs two CPUs")
    half = cpus // 2
    stdout, steps = run_pair(tmp_path, 2, "learning run-a 1,2 --modes x", "paper --steps 3")
    assert parse(steps["learning-run-a"]) == ("0", set(range(half)), "learning run-a 1,2 --modes x")
    assert parse(steps["paper"]) == ("1", set(range(half, cpus)), "paper --steps 3")
    assert "[learning-run-a] exit 0 on GPU 0" in stdout and "[paper] exit 0 on GPU 1" in stdout
    unpacked = tmp_path / "unpacked"
    starts = [float((unpacked / t / "start").read_text()) for t in steps]
    ends = [float((unpacked / t / "end").read_text()) for t in steps]
    assert max(starts) < min(ends)  # the two steps overlapped in time


@pytest.mark.skipif(not os.path.exists("/usr/bin/taskset"), reason="needs taskset (util-linux)")
def test_with_one_card_the_steps_run_one_after_the_other_on_every_cpu(tmp_path: Path) -> None:
    every = set(range(len(os.sched_getaffinity(0))))
    _, steps = run_pair(tmp_path, 1, "learning a 1", "learning b 2")
    assert parse(steps["learning-a"]) == ("0", every, "learning a 1")
    assert parse(steps["learning-b"]) == ("0", every, "learning b 2")
    unpacked = tmp_path / "unpacked"
    assert float((unpacked / "learning-a" / "end").read_text()) <= float(
        (unpacked / "learning-b" / "start").read_text()
    )


@pytest.mark.skipif(not os.path.exists("/usr/bin/taskset"), reason="needs taskset (util-linux)")
def test_scan_and_steps_gives_each_step_a_card_and_cores_of_its_own_beside_the_scan(
    tmp_path: Path,
) -> None:
    """`scripts/gpu/scan_and_steps.sh`: the step on GPU 0 and the top CPU (STEP_CPUS=1), the seed
    scan (a plan of comments only: its seeds have nothing to run) on the other CPUs; more steps
    than GPUs are refused before anything starts."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs two CPUs")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir, 1)
    (tmp_path / "worker.sh").write_text(WORKER)
    plan = tmp_path / "plan.txt"
    plan.write_text("# nothing to run\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "SCAN_DIR": str(tmp_path / "scan"),
        "PAIR_WORKER": str(tmp_path / "worker.sh"),
        "STEP_CPUS": "1",
        "BUNDLE_READY": "1",  # no bundle to install here
    }
    script = str(REPO / "scripts/gpu/scan_and_steps.sh")
    done = subprocess.run(
        ["bash", script, "0-1", "30", str(plan), "learning a 1"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert f"the scan on CPUs 0-{cpus - 2}" in done.stdout
    assert "0 of 2 seeds stopped at the deadline" in done.stdout
    with tarfile.open(tmp_path / "out" / "learning-a.tgz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    info = (tmp_path / "unpacked" / "learning-a" / "info.txt").read_text().strip()
    assert parse(info) == ("0", {cpus - 1}, "learning a 1")

    refused = subprocess.run(
        ["bash", script, "0-1", "30", str(plan), "learning a 1", "learning b 2"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "2 steps for 1 GPUs" in refused.stdout


@pytest.mark.skipif(not os.path.exists("/usr/bin/taskset"), reason="needs taskset (util-linux)")
def test_side_by_side_runs_n_pipelines_at_once_one_per_card_on_every_cpu(tmp_path: Path) -> None:
    """Issue 40: three default pipelines at once on a 4-GPU host, each with its own card,
    storage tag and Prefect home, none pinned to cores; more runs than GPUs are refused."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir, 4)
    worker = tmp_path / "worker.sh"
    worker.write_text(WORKER.replace('args=$*"', 'args=$* tag=$PIPELINE_TAG home=$PREFECT_HOME"'))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "PAIR_WORKER": str(worker),
        "BUNDLE_READY": "1",  # no bundle to install here
    }
    script = str(REPO / "scripts/gpu/side_by_side.sh")
    done = subprocess.run(
        ["bash", script, "3", "--n", "4"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    every = set(range(len(os.sched_getaffinity(0))))
    unpacked = tmp_path / "unpacked"
    for i in range(3):
        with tarfile.open(tmp_path / "out" / f"pipeline-{i}.tgz") as tar:
            tar.extractall(unpacked, filter="data")
        gpu, cpus, args = parse((unpacked / f"pipeline-{i}" / "info.txt").read_text().strip())
        assert (gpu, cpus) == (str(i), every)
        assert args == f"pipeline --n 4 tag=pipeline-{i} home=/tmp/prefect-home-{i}"
        assert f"[pipeline-{i}] exit 0 on GPU {i} after " in done.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"pipeline-{i}.tgz" for i in range(3)
    ]
    starts = [float((unpacked / f"pipeline-{i}" / "start").read_text()) for i in range(3)]
    ends = [float((unpacked / f"pipeline-{i}" / "end").read_text()) for i in range(3)]
    assert max(starts) < min(ends)  # all three at once
    refused = subprocess.run(["bash", script, "5"], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "5 runs for 4 GPUs" in refused.stdout
