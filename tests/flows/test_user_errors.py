"""Every error a user can cause ends in one clear line: each row runs a command as a
new user would, up to its error, and checks the exit status, the one `error:` line (no
traceback), and that what was already written is still there. Before the run (parsing and
preflight) the flows run in this process; at a stage (`harness` rows) against the session's
Prefect API; `python -m sandbox judge` as a subprocess. Then the units: the --config reader and
merge, the retry condition; and a real flow killed with SIGKILL leaves no process
behind and logs no telemetry."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.sorting import FlowRunSort
from prefect.states import Failed

from cobalt.analysis.judged import JudgeFailures
from cobalt.data.sources import SourceError
from cobalt.errors import EmptyStageError, UserError, user_error
from cobalt.params import ConfigError, deep_merge
from engines.reaper import TICK_S, alive, descendants
from flows import data, pipeline, reward_hacking, training, trajectories
from flows.cli import RUN_LOGGERS, read_config
from tasks.retry import transient

REPO = Path(__file__).resolve().parents[2]
FLOWS = {
    "data": data,
    "trajectories": trajectories,
    "training": training,
    "reward_hacking": reward_hacking,
    "pipeline": pipeline,
}
TINY_RUN = [  # a trajectories run of the random tiny model: 2 problems, nothing repaired
    *("--problems", "samples/apps_sample.jsonl:taco", "--limit", "2", "--n", "2"),
    *("--turns", "1", "--max-new-tokens", "8", "--backend", "namespace"),
]

# the same, with a feedback stage long enough (about 1.5 s of its sandbox pool beside the server,
# on this 2-core VM) to be caught in it: with TINY_RUN's the pool lived ~0.2 s, a coin flip
WATCHED_RUN = [*TINY_RUN[:2], "--limit", "2", "--n", "4", "--turns", "2"]
WATCHED_RUN += ["--max-new-tokens", "128", "--backend", "namespace"]


@dataclass
class Row:
    command: str  # a flow of FLOWS, or "sandbox" (python -m sandbox judge, a subprocess)
    argv: list[str]  # "{tmp}" stands for the test's directory
    code: int
    line: str | None  # the one error line (a regex); None: no error
    harness: bool = False  # runs the flow: needs the Prefect API
    before: list[str] | None = None  # a trajectories run first (its argv)
    kept: Callable[[Path, str], None] | None = None  # what must be there after (tmp, output)


def config_rows(flow: str) -> list[tuple[str, Row]]:
    config = ["--config", "{tmp}/%s"]
    return [
        (
            f"{flow}-config-invalid-json",
            Row(flow, [*config[:1], config[1] % "invalid.json"], 2, r"invalid\.json:3:5: invalid "
                r"JSON \(Expecting property name enclosed in double quotes\)"),
        ),
        (
            f"{flow}-config-not-an-object",
            Row(flow, [*config[:1], config[1] % "list.json"], 2, r"list\.json: holds a JSON list"),
        ),
        (
            f"{flow}-config-missing",
            Row(flow, [*config[:1], config[1] % "nope.json"], 2, r"nope\.json: No such file"),
        ),
        (
            f"{flow}-config-not-utf8",
            Row(flow, [*config[:1], config[1] % "latin1.json"], 2,
                r"latin1\.json: line 2: a byte that is not UTF-8 \(0xe9\)"),
        ),
    ]  # fmt: skip


def data_kept(tmp: Path, output: str) -> None:
    """The good source, loaded before the bad one failed, is still in storage."""
    assert list((tmp / "runs/datasets/load/apps_sample").glob("*/MANIFEST.json"))


def bandit_kept(tmp: Path, output: str) -> None:
    """The bandit dataset written before the check failed, and the trajectories, stay."""
    assert list((tmp / "runs/bandit").glob("*/MANIFEST.json"))
    assert list((tmp / "runs/trajectories/evaluation").glob("*/MANIFEST.json"))


def verdicts_kept(tmp: Path, output: str) -> None:
    rows = [json.loads(line) for line in (tmp / "verdicts.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in rows] == [
        ("double", "accepted"),
        ("line-2", "invalid_request"),
        ("wrong", "wrong_answer"),
    ]
    assert rows[1]["error"] == "line 2: not UTF-8 (byte 0xff at column 30)"


VLLM = importlib.util.find_spec("vllm") is not None
ROWS: list[tuple[str, Row]] = [
    *(row for flow in FLOWS for row in config_rows(flow)),
    (
        "trajectories-config-field-not-an-object",
        Row("trajectories", ["--config", "{tmp}/sampling.json"], 2,
            r"config field collect\.sampling: a JSON object expected, not 3"),
    ),
    (
        "pipeline-config-field-not-an-object",
        Row("pipeline", ["--config", "{tmp}/sampling.json", "--n", "2"], 2,
            r"config field collect\.sampling: a JSON object expected, not 3"),
    ),
    (
        "pipeline-model-dir-empty",
        Row("pipeline", ["--model", "{tmp}/empty"], 2,
            r"--model \S+/empty: the directory has no config\.json: pass a directory saved"),
    ),
    (
        "pipeline-model-hub-not-cached",
        Row("pipeline", ["--model", "cobalt-test/not-cached@v2"], 2,
            r"--model cobalt-test/not-cached@v2: not in the Hugging Face cache \S+ and the Hub "
            r"cannot be reached \(HF_HUB_OFFLINE=1\): download it where there is a network "
            r"\(`hf download cobalt-test/not-cached --revision v2`\)"),
    ),
    (
        "trajectories-model-dir-empty",
        Row("trajectories", ["--model", "{tmp}/empty"], 2,
            r"--model \S+/empty: the directory has no config\.json: .* name a Hub id"),
    ),
    (
        "trajectories-model-not-a-name",
        Row("trajectories", ["--model", "{tmp}/nope"], 2,
            r"--model \S+/nope: no such directory: name a Hub id \(org/name\[@revision\]\)"),
    ),
    (
        "trajectories-compare-not-an-evaluation",
        Row("trajectories", ["--compare", "{tmp}/empty", "latest"], 2,
            r"\S+/empty is not a finished evaluation stage \(no MANIFEST\.json\): pass "
            r"<storage>/trajectories/evaluation/<key>"),
    ),
    (
        "reward-hacking-model-dir-empty",
        Row("reward_hacking", ["--model", "{tmp}/empty"], 2,
            r"--model \S+/empty: the directory has no config\.json"),
    ),
    (
        "reward-hacking-judge-model-missing",
        Row("reward_hacking", ["--judge-model", "{tmp}/nope"], 2,
            r"--judge-model \S+/nope: no such directory"),
    ),
    *(
        []
        if VLLM
        else [
            (
                "trajectories-vllm-not-installed",
                Row("trajectories", ["--engine", "vllm", "--model", "{tmp}/empty"], 2,
                    r"engine vllm: vLLM is not installed here: install the GPU extra"),
            )
        ]
    ),
    (
        "pipeline-fsdp-without-gpus",
        Row("pipeline", ["--gpus", "2", "--sharding", "fsdp"], 2,
            r"training\.sharding fsdp: accelerate shards a model with FSDP across GPUs only \(it "
            r"runs an FSDP config on CPU processes as plain DDP\), and this machine has none; on "
            r"CPU processes \(gloo\) use --sharding ddp, or zero3"),
    ),
    (
        "training-packing-offline",
        Row("training", ["--mode", "offline", "--packing"], 2,
            r"training\.packing: packed passes are GRPO's \(modes cobalt, single_turn, "
            r"multi_turn\); the offline trainer pads its rows: drop --packing"),
    ),
    (
        "training-fsdp-on-one-process",
        Row("training", ["--sharding", "fsdp"], 2,
            r"training\.sharding fsdp on 1 process shards nothing: pass --gpus N"),
    ),
    (
        "training-hybrid-on-one-node",
        Row("training", ["--gpus", "2", "--sharding", "hybrid", "--set", "generation_batch_size=4"],
            2,
            r"training\.sharding hybrid shards within each node and replicates across nodes: on "
            r"1 node pass --sharding fsdp, or --nodes N \(N > 1\)"),
    ),
    (
        "training-batch-does-not-split-over-the-gpus",
        Row("training", ["--gpus", "2", "--set", "num_generations=3", "--set",
                         "generation_batch_size=9"], 2,
            r"generation_batch_size 9 does not split over 2 processes of "
            r"per_device_train_batch_size 1 .*--set generation_batch_size=6"),
    ),
    (
        "pipeline-paper-preset-on-3-gpus",
        Row("pipeline", ["--preset", "paper", "--gpus", "3"], 2,
            r"training\.num_processes 3: the paper preset's step of 64 prompts x 16 samples must "
            r"split evenly over the processes: use --gpus 1, 2, 4"),
    ),
    (
        "trajectories-more-gpus-than-visible",
        Row("trajectories", ["--engine", "vllm", "--gpus", "64", "--model", "{tmp}/empty"], 2,
            r"engine\.data_parallel_size 64 x tensor_parallel_size 1 needs 64 GPUs but \d+ "
            r"are visible here.*: pass --gpus \d+ or fewer"),
    ),
    (
        "trajectories-gpus-of-the-transformers-engine",
        Row("trajectories", ["--engine", "transformers", "--gpus", "2"], 2,
            r"invalid parameters: engine: data_parallel_size 2 applies to kind 'vllm'"),
    ),
    (
        "pipeline-more-gpus-than-visible",
        Row("pipeline", ["--engine", "vllm", "--gpus", "64"], 2,
            r"engine\.data_parallel_size 64 .* needs 64 GPUs .*: pass --gpus \d+ or fewer"),
    ),
    (
        "data-malformed-rows-counted",
        Row("data", ["--source", "{tmp}/broken.jsonl:taco", "--no-verify"], 0, None,
            harness=True),
    ),
    (
        "data-no-readable-row-at-the-load-stage",
        Row("data", ["--source", "samples/apps_sample.jsonl:taco", "--source",
                     "{tmp}/junk.jsonl:taco", "--no-verify"], 2,
            r"junk\.jsonl has no readable row \(line 1: invalid_json: Expecting value at column "
            r"1\): pass a JSON Lines file", harness=True, kept=data_kept),
    ),
    (
        "training-empty-stage",
        Row("training", ["--backend", "namespace"], 2,
            r"the bandit dataset has no repair contexts: of 2 problems .* --mode single_turn",
            harness=True, before=TINY_RUN, kept=bandit_kept),
    ),
    (
        "judge-undecodable-row",
        Row("sandbox", ["-i", "{tmp}/programs.jsonl", "-o", "{tmp}/verdicts.jsonl"], 0, None,
            kept=verdicts_kept),
    ),
    (
        "judge-missing-input",
        Row("sandbox", ["-i", "{tmp}/nope.jsonl", "-o", "{tmp}/verdicts.jsonl"], 2,
            r"^error: --input \S+/nope\.jsonl: No such file or directory$"),
    ),
]  # fmt: skip


def write_inputs(tmp: Path) -> None:
    (tmp / "invalid.json").write_text('{\n  "refresh": true,\n    }\n')
    (tmp / "list.json").write_text("[1, 2]\n")
    (tmp / "latin1.json").write_bytes(b'{\n  "label": "caf\xe9"\n}\n')
    (tmp / "sampling.json").write_text('{"collect": {"sampling": 3}}')
    (tmp / "empty").mkdir()
    (tmp / "junk.jsonl").write_text("this is not JSON Lines\n")
    rows = (REPO / "samples/apps_sample.jsonl").read_bytes().splitlines()
    (tmp / "broken.jsonl").write_bytes(
        b"\n".join([rows[0], rows[1][:300], rows[2], b"\xff\xfe{}", rows[3]]) + b"\n"
    )
    program = {"code": "print(int(input()) * 2)", "tests": {"inputs": ["3"], "outputs": ["6"]}}
    wrong = {"code": "print(0)", "tests": {"inputs": [""], "outputs": ["1"]}}
    (tmp / "programs.jsonl").write_bytes(
        json.dumps({"id": "double", **program}).encode()
        + b'\n{"id": "bad", "code": "print(\xff)"}\n'
        + json.dumps({"id": "wrong", **wrong}).encode()
        + b"\n"
    )


def one_line(output: str, pattern: str) -> None:
    """The output has no traceback and ends in exactly one `error:` line matching `pattern`."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], output
    assert re.search(pattern, errors[0]), errors[0]


def last_task_runs(flow_name: str) -> dict[str, tuple[str, int]]:
    """Task run name -> (state, times run) of the newest run of the flow `flow_name`."""
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
    return {t.name: (t.state.name, t.run_count) for t in tasks}


@pytest.mark.parametrize("row", [r for _, r in ROWS], ids=[i for i, _ in ROWS])
def test_every_user_error_is_one_line(
    row: Row, tmp_path: Path, capfd, request: pytest.FixtureRequest
) -> None:
    write_inputs(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in row.argv]
    if row.command == "sandbox":
        proc = subprocess.run(
            [sys.executable, "-m", "sandbox", "judge", *argv, "--backend", "namespace", "-q"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COBALT_SANDBOX_SOCKET": "off"},
        )
        code, output = proc.returncode, proc.stdout + proc.stderr
    else:
        if row.harness:
            request.getfixturevalue("prefect_harness")
        storage = ["--storage", str(tmp_path / "runs")]
        if row.before is not None:
            assert trajectories.main([*row.before, *storage]) == 0
            capfd.readouterr()
        logs = io.StringIO()  # what Prefect logs of the run (its handler bypasses capfd)
        handler = logging.StreamHandler(logs)
        for name in RUN_LOGGERS:
            logging.getLogger(name).addHandler(handler)
        try:
            code = FLOWS[row.command].main([*argv, *storage])
        finally:
            for name in RUN_LOGGERS:
                logging.getLogger(name).removeHandler(handler)
        out, err = capfd.readouterr()
        output = out + err
        assert "Traceback" not in logs.getvalue(), logs.getvalue()
        if row.harness and row.code:
            assert "Finished in state Failed" in logs.getvalue()  # the log was captured
    assert code == row.code, output
    if row.line is None:
        assert "Traceback" not in output and "error: " not in output, output
    else:
        one_line(output, row.line)
    if row.kept is not None:
        row.kept(tmp_path, output)
    if row.command == "data" and row.harness and row.code == 2:  # a user error is not retried
        tasks = last_task_runs("data")
        assert tasks["load-junk"] == ("Failed", 1), tasks
    if row.line is None and row.command == "data":  # the table says where each bad line was
        total = output.split("| total |")[0]
        assert "invalid_json 1 (line 2), not_utf8 1 (line 4)" in total, output


# --- units ------------------------------------------------------------------------------------


def test_a_partial_config_object_keeps_the_defaults_it_leaves_out(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"collect": {"turns": 3}}))
    p = trajectories.parse_params(["--config", str(config), "--n", "2"])
    assert (p.collect.turns, p.collect.sampling.n, p.collect.sampling.seed) == (3, 2, 0)
    config.write_text(json.dumps({"collect": {"sampling": {"temperature": 0.2}}}))
    p = trajectories.parse_params(["--config", str(config)])
    assert (p.collect.sampling.n, p.collect.sampling.temperature) == (16, 0.2)
    # the embedded analysis keeps the pipeline's embedded sampling (8 samples, 128 tokens: one
    # copy, presets.tiny_collect) and its judge's 48 tokens
    config.write_text(
        json.dumps({"collect": {"turns": 3}, "judge": {"sampling": {"temperature": 0.5}}})
    )
    h = reward_hacking.parse_params(["--config", str(config)])
    assert (h.collect.turns, h.collect.sampling.n, h.collect.sampling.max_new_tokens) == (
        3,
        8,
        128,
    )
    assert (h.judge.sampling.temperature, h.judge.sampling.max_new_tokens) == (0.5, 48)


def test_read_config_and_deep_merge() -> None:
    assert read_config(None) == {}
    base = {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
    assert deep_merge(base, {"a": {"c": {"x": 4}}, "e": None}) == {
        "a": {"b": 1, "c": {"d": 2, "x": 4}},
        "e": None,
    }
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "e": 3}  # the defaults are not changed
    with pytest.raises(ConfigError, match=r"config field a\.c: a JSON object expected, not \[1\]"):
        deep_merge(base, {"a": {"c": [1]}})
    assert issubclass(ConfigError, UserError)


def test_a_user_error_is_not_retried_unless_transient() -> None:
    def state(exc: BaseException) -> Failed:
        return Failed(data=exc)

    assert not transient(None, None, state(SourceError("bad file")))
    assert not transient(None, None, state(EmptyStageError("nothing")))
    try:  # chained: found through the cause
        try:
            raise EmptyStageError("empty")
        except EmptyStageError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert not transient(None, None, state(outer))
        assert isinstance(user_error(outer), EmptyStageError)
    assert transient(None, None, state(RuntimeError("connection reset")))
    assert transient(None, None, state(JudgeFailures([("e1", "endpoint down")])))


@pytest.mark.slow
def test_a_killed_flow_leaves_no_process_and_logs_no_telemetry(tmp_path: Path) -> None:
    """`python -m flows.trajectories` killed with SIGKILL while its temporary Prefect server and
    sandbox workers run: none of its descendants outlives it. The analytics switch of the test
    session is taken out of its environment: the command itself turns telemetry off."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK", "PREFECT_API_URL")
    }
    log = tmp_path / "flow.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.trajectories", *WATCHED_RUN, "--storage", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            now = descendants(proc.pid)
            seen.update(now)
            commands = [_command(p) for p in now]
            if any("uvicorn" in c for c in commands) and any(" -I -S -c " in c for c in commands):
                break
            time.sleep(0.1)
        assert proc.poll() is None, log.read_text()
        assert any("uvicorn" in _command(p) for p in seen) and len(seen) >= 3, seen
        time.sleep(3 * TICK_S)  # the watchdog sees what runs at its next tick
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while any(alive(p, t) for p, t in seen.items()) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {p: _command(p)[:80] for p, t in seen.items() if alive(p, t)}
        assert left == {}
        assert "telemetry" not in log.read_text()
    finally:
        for pid, started in seen.items():
            if alive(pid, started):
                os.kill(pid, signal.SIGKILL)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
