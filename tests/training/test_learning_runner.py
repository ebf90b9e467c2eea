"""The learning check's parent process (scripts/learning/parallel.py) and the deadline rule of a
seed run, with a stand-in child: run names and repeats, several children at once, a child
stopped at the deadline keeps its result marked as killed."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from learning import parallel  # noqa: E402
from learning.config import build_parser, resolve  # noqa: E402
from learning.seed_run import _determinism, too_late  # noqa: E402

CHILD = """
import json, sys, time
from pathlib import Path
argv = sys.argv[1:]
value = lambda name: argv[argv.index(name) + 1]
out, label, seed = Path(value("--out")), value("--label"), int(value("--seed"))
doc = {"check": "learning_check_seed", "seed": seed, "label": label, "status": "running",
       "deadline_at": float(value("--deadline-at")), "settings": json.loads(Path(value("--child")).read_text())}
(out / "runs").mkdir(parents=True, exist_ok=True)
(out / "runs" / f"{label}.json").write_text(json.dumps(doc))
if seed == 9:  # the slow one
    time.sleep(120)
doc["status"] = "done"
(out / "runs" / f"{label}.json").write_text(json.dumps(doc))
"""


def args_for(tmp_path: Path, *extra: str):
    return resolve(build_parser().parse_args(["--out", str(tmp_path / "out"), *extra]))


def test_run_names_count_repeats_past_existing_results(tmp_path: Path) -> None:
    args = args_for(tmp_path, "--seeds", "0,1", "--repeat", "0,0")
    assert [label for _, label in parallel.labels(args)] == [
        "seed0",
        "seed1",
        "seed0-r1",
        "seed0-r2",
    ]
    (args.out / "runs").mkdir(parents=True)
    (args.out / "runs" / "seed0.json").write_text("{}")
    args = args_for(tmp_path, "--seeds", "0")
    assert parallel.labels(args) == [(0, "seed0-r1")]
    assert args.sandbox_concurrency >= 1 and args.modes == "single_turn,cobalt,offline,cobalt_bf16"
    with pytest.raises(SystemExit, match="unknown"):
        args_for(tmp_path, "--modes", "cobalt,grpo")


def test_children_run_in_parallel_and_a_late_one_is_stopped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "MIN_START_S", 0.0)
    monkeypatch.setattr(parallel, "KILL_GRACE_S", 1.0)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    deadline = parallel.AGGREGATE_S + parallel.KILL_GRACE_S + 4  # kill after 5 s
    args = args_for(tmp_path, "--seeds", "0,9", "--parallel", "2", "--deadline-s", str(deadline))
    started = time.time()
    done = parallel.run_seeds(args, script=script)
    assert time.time() - started < deadline + parallel.KILL_GRACE_S
    assert done["seed0"]["status"] == "done" and done["seed0"]["exit"] == 0
    assert done["seed9"]["status"] == "killed" and done["seed9"]["exit"] != 0
    result = json.loads((args.out / "runs" / "seed9.json").read_text())
    assert result["status"] == "killed"
    # the children got the parent's settings and a deadline that leaves time to aggregate
    assert result["settings"]["seeds"] == "0,9"
    assert result["deadline_at"] == pytest.approx(
        started + deadline - parallel.AGGREGATE_S - parallel.KILL_GRACE_S, abs=2
    )
    assert (args.out / "logs" / "seed9.log").exists()


def test_a_mode_is_skipped_when_it_would_end_after_the_deadline() -> None:
    assert not too_late(100.0, [], 10.0, 0.0)  # no deadline
    assert too_late(100.0, [], 10.0, 120.0)  # the first mode is guessed at 2.5 evaluations
    assert not too_late(100.0, [], 10.0, 130.0)
    assert too_late(100.0, [30.0, 50.0], 10.0, 143.0)  # then the mean of the modes so far
    assert not too_late(100.0, [30.0, 50.0], 10.0, 145.0)
    # an offline mode generates nothing: 2 evaluations, whatever GRPO took
    assert not too_late(100.0, [300.0], 10.0, 123.0, "offline")
    assert too_late(100.0, [300.0], 10.0, 121.0, "offline")
    # offline_grpo: 2 evaluations + its share of a GRPO mode's training (60 s - 10 s of eval)
    assert not too_late(100.0, [60.0], 10.0, 100 + 1.1 * (20 + 0.5 * 50) + 0.1, "offline_grpo", 0.5)
    assert too_late(100.0, [60.0], 10.0, 100 + 1.1 * (20 + 0.5 * 50) - 0.1, "offline_grpo", 0.5)


@pytest.mark.parametrize(
    ("flags", "device", "strict"),
    [
        ([], "cpu", False),  # the default: off on CPU (identical runs without it)
        ([], "cuda", True),  # the default: on for a GPU (issue 19)
        (["--strict-determinism"], "cpu", True),
        (["--no-strict-determinism"], "cuda", False),
    ],
)
def test_strict_determinism_turns_warn_only_off(flags: list, device: str, strict: bool) -> None:
    import torch

    args = build_parser().parse_args(["--out", "x", *flags])
    args.device = device  # resolved by the run before this (no GPU needed to set the mode)
    try:
        got = _determinism(args)
        assert got["deterministic_algorithms"] is True
        assert got["warn_only"] is (not strict) and got["strict"] is strict
        assert got["strict_source"] == ("flag" if flags else "default (on for a GPU, off on CPU)")
        # an op without a deterministic implementation raises now, else it only warns
        put = lambda: torch.zeros(4).put_(torch.tensor([0, 0]), torch.ones(2))  # noqa: E731
        if strict:
            with pytest.raises(RuntimeError, match="deterministic implementation"):
                put()
        else:
            with pytest.warns(UserWarning, match="deterministic implementation"):
                put()
    finally:
        torch.use_deterministic_algorithms(False)
