"""`cobalt.training.machinery.collectives`: what a process's collectives moved since the last read,
from torch's flight recorder in a real (one-process, gloo) process group, and the read's warning
when the recorder's ring dropped entries between two reads. Each case runs in a fresh interpreter:
torch reads the recorder's size once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys, tempfile
import torch, torch.distributed as dist
from cobalt.training.machinery.collectives import CollectiveMeter

meter = CollectiveMeter()
print(json.dumps(meter.read()))  # no process group yet: off
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
reads = []
for count in map(int, sys.argv[1:]):
    for _ in range(count):
        dist.all_reduce(torch.ones(1000))  # 4,000 bytes each
    reads.append(meter.read())
print(json.dumps(reads))
dist.destroy_process_group()
"""


def reads(buffer: str | None, *counts: int) -> tuple[object, list]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("BUFFER_SIZE")}
    if buffer is not None:
        env["TORCH_FR_BUFFER_SIZE"] = buffer
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *map(str, counts)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    before, after = done.stdout.strip().splitlines()[-2:]
    return json.loads(before), json.loads(after)


def test_each_read_counts_the_collectives_since_the_last() -> None:
    before, (first, second) = reads("64", 3, 5)
    assert before is None
    assert first["calls"] == {"all_reduce": 3} and second["calls"] == {"all_reduce": 5}
    assert second["gb"]["all_reduce"] == 5 * 4000 / 1e9
    assert first["complete"] and second["complete"]


def test_a_ring_too_small_for_a_step_says_so() -> None:
    _, (first, second) = reads("4", 3, 6)
    assert first["complete"] and not second["complete"]  # 2 of the 6 were dropped


def test_off_without_the_recorder() -> None:
    _, found = reads(None, 2)
    assert found == [None]
