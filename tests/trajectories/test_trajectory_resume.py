"""Durability: a run killed with SIGKILL (a real subprocess) resumes without regenerating
finished problems and without duplicate or lost records; corrupt records are skipped."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trajectory_helpers import ScriptedEngine, doubling, repairing_script

from cobalt.trajectories.collect import CollectConfig, collect_initial
from cobalt.trajectories.records import Record, RecordLog, read_records
from engines import SamplingConfig

WORKER = Path(__file__).with_name("trajectory_resume_worker.py")
PROBLEMS = 8


def start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(out), str(PROBLEMS), "0.4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def kill_after(proc: subprocess.Popen, path: Path, lines: int, timeout: float = 90) -> bytes:
    """SIGKILL `proc` once `path` holds `lines` complete records; the file's bytes then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the worker ended before the kill:\n{proc.stderr.read()[-3000:]}")
        if path.exists() and path.read_bytes().count(b"\n") >= lines:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return path.read_bytes()
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{path} did not reach {lines} records in {timeout}s")


def ids(path: Path) -> list[str]:
    return [json.loads(line)["problem_id"] for line in path.read_text().splitlines()]


def complete_prefix(data: bytes) -> bytes:
    return data[: data.rfind(b"\n") + 1]


@pytest.mark.timeout(240)
def test_sigkill_mid_run_then_resume(tmp_path):
    initial, multiturn = tmp_path / "initial.jsonl", tmp_path / "multiturn.jsonl"
    # 1st run: killed while the first programs are being written
    at_kill_1 = kill_after(start(tmp_path), initial, 2)
    assert not multiturn.exists()
    # 2nd run: finishes the first programs, is killed during the feedback turns
    at_kill_2 = kill_after(start(tmp_path), multiturn, 2)
    # 3rd run: to the end
    proc = start(tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    stats = json.loads(out.strip().splitlines()[-1])

    expected = sorted(f"hand/p{i}" for i in range(PROBLEMS))
    for path in (initial, multiturn):
        assert sorted(ids(path)) == expected  # no duplicates, no losses
    # finished records were never rewritten: what had landed is a prefix of the final file
    assert initial.read_bytes().startswith(complete_prefix(at_kill_1))
    assert multiturn.read_bytes().startswith(complete_prefix(at_kill_2))
    done_before = complete_prefix(at_kill_2).count(b"\n")
    assert stats["initial"]["skipped"] == PROBLEMS and stats["initial"]["problems"] == 0
    assert PROBLEMS > done_before >= 2 and complete_prefix(at_kill_1).count(b"\n") < PROBLEMS
    assert stats["multiturn"]["skipped"] == done_before
    assert stats["multiturn"]["problems"] == PROBLEMS - done_before
    records, _ = read_records(multiturn)
    assert all(len(s.turns) == 3 for r in records.values() for s in r.samples)


def test_torn_and_corrupt_records_are_skipped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "initial.jsonl"
    problems = [doubling(f"q{i}") for i in range(3)]
    engine = ScriptedEngine(repairing_script)
    config = CollectConfig(sampling=SamplingConfig(n=1, seed=0), turns=0)
    collect_initial(problems[:2], engine, config, path)
    good = path.read_bytes()
    lines = good.splitlines(keepends=True)
    # a corrupt line in the middle, and a torn record at the end (a write cut by a kill)
    path.write_bytes(lines[0] + b'{"problem_id": "hand/zz", "oops"\n' + lines[1] + lines[0][:40])
    caplog.set_level(logging.WARNING)
    records, stats = collect_initial(problems, engine, config, path)
    assert sorted(records) == ["hand/q0", "hand/q1", "hand/q2"] and stats.skipped == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("line 2: skipping a corrupt record" in w for w in warnings)
    assert any("line 4: skipping a corrupt record" in w and "torn" in w for w in warnings)
    assert any("cutting 40 bytes" in w for w in warnings)
    # the torn tail was cut, so the new record starts on its own line
    assert ids_in(path) == ["hand/q0", "hand/q1", "hand/q2"]
    assert path.read_bytes().startswith(lines[0])


def ids_in(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["problem_id"])
        except (ValueError, KeyError):
            continue
    return out


def test_duplicates_are_ignored_and_a_second_writer_is_refused(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    record = Record(problem_id="x", stage="initial", system="s", instruction="i", samples=[])
    path.write_text(record.model_dump_json() + "\n" + record.model_dump_json() + "\n")
    with caplog.at_level(logging.WARNING):
        records, end = read_records(path)
    assert list(records) == ["x"] and end == path.stat().st_size
    assert "duplicate record for x" in caplog.text
    with RecordLog(path) as first:
        first.open()
        with pytest.raises(RuntimeError, match="being written by another process"):
            RecordLog(path).open()
