"""The seed result: the one contract between the half of the check that runs seeds and the half
that reads them. A seed run (`seed_run`) writes `<out>/runs/<label>.json` after every phase, the
parent (`parallel`) marks a run it stopped, and the aggregate (`runs`) reads them back, all
through this module: the file layout and the fields live here.

Per evaluated model ("sft" and each trained mode), every evaluation problem is a
`ProblemResult`: its group and kind, the samples `n` and the correct samples per turn under METHOD
§1.2 (`c`) and stop-on-public-pass (`c_stop`), so Pass@1 of a problem at turn t is c[t] / n.
`read` validates a document against `SeedResult` (fields beyond it are kept) and names the first
field that breaks it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, NotRequired

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from cobalt.errors import UserError

CHECK = "learning_check_seed"
VERSION = 1
RUNS = "runs"  # <out>/runs/<label>.json
PROTOCOLS = {"spec": "c", "stop": "c_stop"}  # METHOD §1.2 / stop on public pass: result keys
Status = Literal["running", "done", "failed", "killed"]


class SeedResultError(UserError):
    """A file under `<out>/runs/` that says it is a seed result and is not one."""


@with_config(ConfigDict(extra="allow"))
class ProblemResult(TypedDict):
    group: str  # a kind group (kinds.GROUPS)
    kind: str
    n: int  # samples
    c: list[int]  # correct samples per turn, METHOD §1.2
    c_stop: list[int]  # the same, each sample stopped at its first program passing the public tests


@with_config(ConfigDict(extra="allow"))
class Evaluation(TypedDict):
    problems: dict[str, ProblemResult]
    stats: NotRequired[dict[str, Any]]  # the rollout's times and counts
    transitions: NotRequired[list[dict[str, Any]]]  # cobalt.analysis.transitions rows
    fingerprint: NotRequired[str]  # of every generated text


@with_config(ConfigDict(extra="allow"))
class SeedResult(TypedDict):
    check: Literal["learning_check_seed"]
    seed: int
    label: str  # seed<S>, seed<S>-r<k> for a repeat
    status: Status
    settings: dict[str, Any]  # the command line (config.as_json)
    training: dict[str, Any]  # mode -> its record ({"outcome": ...}); "note" when none trained
    evaluation: dict[str, Evaluation]  # model ("sft", each trained mode) -> its evaluation
    version: NotRequired[int]
    date: NotRequired[str]
    machine: NotRequired[dict[str, Any]]  # device, CPUs, library versions, code hash
    groups: NotRequired[dict[str, str]]  # kind group -> its name
    kinds: NotRequired[dict[str, list[str]]]  # kind group -> its kinds
    modes: NotRequired[list[str]]  # in the order they run
    determinism: NotRequired[dict[str, Any]]
    fingerprints: NotRequired[dict[str, str | None]]  # weights and texts of every phase
    gpu_memory_gib: NotRequired[dict[str, float]]  # phase -> peak reserved
    phases_s: NotRequired[dict[str, float]]  # phase -> seconds
    wall_s: NotRequired[float]
    sft: NotRequired[dict[str, Any]]  # the recipe and the fit's stats
    reference: NotRequired[Evaluation]  # the reference trajectories, evaluated
    bandit: NotRequired[dict[str, Any]]  # the bandit dataset's counts
    offline: NotRequired[dict[str, Any]]  # the offline dataset's counts
    sandbox_backend: NotRequired[str]
    error: NotRequired[str]
    traceback: NotRequired[str]
    cuda_errors: NotRequired[dict[str, str]]


_SEED_RESULT = TypeAdapter(SeedResult)


def result_path(out: Path, label: str) -> Path:
    return Path(out) / RUNS / f"{label}.json"


def result_files(out: Path) -> list[Path]:
    return sorted(Path(out, RUNS).glob("*.json"))


def write(path: Path, doc: SeedResult) -> None:
    """Replace `path` at once (a reader never sees half a document)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def read(path: Path) -> SeedResult | None:
    """The seed result in `path`; None when the file is unreadable or not a seed result (another
    `check`); SeedResultError when it is one with a field missing or of the wrong type."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("check") != CHECK:
        return None
    try:
        return _SEED_RESULT.validate_python(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(document)"
        raise SeedResultError(
            f"{path}: {where}: {first['msg']} (a seed result of the learning check; rerun the "
            "seed, or move the file out of runs/)"
        ) from None


def status_of(out: Path, label: str) -> str:
    """A run's recorded status; "no result" when it wrote none."""
    try:
        return json.loads(result_path(out, label).read_text()).get("status", "?")
    except (OSError, ValueError, AttributeError):
        return "no result"


def mark(out: Path, label: str, status: Status) -> None:
    """Set a run's status (the parent: a run it stopped at the deadline); nothing if it wrote no
    result."""
    path = result_path(out, label)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    doc["status"] = status
    write(path, doc)
