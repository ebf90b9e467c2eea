"""`python -m sandbox judge` over JSONL files, run as people and scripts run it (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]

ROWS = [
    json.dumps(
        {
            "id": "double",
            "code": "print(int(input()) * 2)",
            "tests": {"inputs": ["3\n", "5\n"], "outputs": ["6", "10"]},
        }
    ),
    "{this is not json",
    json.dumps({"id": "no-code", "tests": {"inputs": ["1"], "outputs": ["1"]}}),
    json.dumps(
        {"id": "mismatch", "code": "print(1)", "tests": {"inputs": ["1"], "outputs": ["1", "2"]}}
    ),
    json.dumps({"id": "int-input", "code": "print(1)", "tests": {"inputs": [5], "outputs": ["1"]}}),
    json.dumps({"id": "wrong", "code": "print(0)", "tests": {"inputs": [""], "outputs": ["1"]}}),
    "",  # blank lines are not rows
    json.dumps(
        {
            "id": "call",
            "code": "def add(a, b):\n    return a + b\n",
            "tests": {"inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"], "fn_name": "add"},
        }
    ),
    json.dumps([1, 2]),
]
IDS = ["double", "line-2", "no-code", "mismatch", "int-input", "wrong", "call", "line-9"]


def sandbox_cli(
    *args: str, stdin: str | None = None, server: str = "off"
) -> subprocess.CompletedProcess:
    """Run `python -m sandbox`; with no sandbox server unless `server` names one."""
    return subprocess.run(
        [sys.executable, "-m", "sandbox", *args],
        cwd=PROJECT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COBALT_SANDBOX_SOCKET": server},
    )


def judge_cli(
    input_path: Path | str, output: Path | str, *extra: str, backend: str = "namespace"
) -> subprocess.CompletedProcess:
    return sandbox_cli(
        "judge",
        "--input",
        str(input_path),
        "--output",
        str(output),
        "--backend",
        backend,
        "--concurrency",
        "2",
        "--timeout",
        "2",
        *extra,
    )


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    path = tmp_path / "programs.jsonl"
    path.write_text("\n".join(ROWS) + "\n")
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_verdicts(rows: list[dict]) -> None:
    assert [r["id"] for r in rows] == IDS
    by_id = {r["id"]: r for r in rows}
    assert by_id["double"]["status"] == "accepted" and by_id["double"]["passed"] == [True, True]
    assert by_id["double"]["pass_rate"] == 1.0 and by_id["double"]["outcomes"] == ["passed"] * 2
    assert by_id["wrong"]["status"] == "wrong_answer" and by_id["wrong"]["feedback"][0]
    assert by_id["call"]["status"] == "accepted"
    invalid = {i: by_id[i] for i in ("line-2", "no-code", "mismatch", "int-input", "line-9")}
    for row in invalid.values():
        assert row["status"] == "invalid_request" and row["passed"] == [] and row["error"]
    assert "line 2: not JSON" in invalid["line-2"]["error"]
    assert "code" in invalid["no-code"]["error"] and "Field required" in invalid["no-code"]["error"]
    assert "tests.outputs" in invalid["mismatch"]["error"]
    assert "tests.inputs.0" in invalid["int-input"]["error"]
    assert "row:" in invalid["line-9"]["error"]
    for row in rows:
        if row["status"] != "invalid_request":
            assert row["error"] is None
            assert set(row) >= {
                "id",
                "passed",
                "pass_rate",
                "status",
                "feedback",
                "seconds",
                "outcomes",
            }


def test_judges_valid_rows_and_reports_invalid_ones_in_input_order(backend, programs, tmp_path):
    out = tmp_path / "verdicts.jsonl"
    proc = judge_cli(programs, out, "--quiet", backend=backend)
    assert proc.returncode == 0, proc.stderr
    check_verdicts(read_rows(out))
    assert not Path(f"{out}.partial").exists()
    assert "judged 3 programs (5 tests, 5 invalid rows)" in proc.stderr


def test_output_to_stdout_holds_only_json_lines_and_progress_goes_to_stderr(programs):
    proc = judge_cli(programs, "-")
    assert proc.returncode == 0, proc.stderr
    check_verdicts([json.loads(line) for line in proc.stdout.splitlines()])
    assert "prog" in proc.stderr  # the progress bar's unit
    assert "judged 3 programs" in proc.stderr


def test_input_from_stdin(tmp_path):
    out = tmp_path / "verdicts.jsonl"
    proc = sandbox_cli(
        "judge", "-i", "-", "-o", str(out), "--backend", "namespace", "-q", stdin=ROWS[0] + "\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["status"] for r in read_rows(out)] == ["accepted"]


def test_resume_keeps_complete_rows_and_drops_a_torn_line(programs, tmp_path):
    out = tmp_path / "verdicts.jsonl"
    kept = {
        "id": "double",
        "passed": [True, True],
        "pass_rate": 1.0,
        "status": "accepted",
        "feedback": ["kept from the interrupted run", ""],
        "seconds": 123.0,
        "outcomes": ["passed", "passed"],
        "error": None,
    }
    Path(f"{out}.partial").write_text(json.dumps(kept) + "\n" + '{"id": "line-2", "pas')
    proc = judge_cli(programs, out, "--resume", "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(out)
    check_verdicts(rows)
    assert rows[0] == kept
    assert not Path(f"{out}.partial").exists()
    assert "judged 2 programs" in proc.stderr  # the first row was not judged again


def test_without_resume_a_partial_file_is_overwritten(programs, tmp_path):
    out = tmp_path / "verdicts.jsonl"
    Path(f"{out}.partial").write_text('{"id": "stale"}\n')
    proc = judge_cli(programs, out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    check_verdicts(read_rows(out))


def test_help_explains_the_row_formats():
    proc = sandbox_cli("judge", "--help")
    assert proc.returncode == 0
    for words in (
        '"id": str, "code": str',
        '"fn_name": str|null',
        '"outcomes"',
        "invalid_request",
        "--resume",
        "--backend",
        "--fail-fast",
    ):
        assert words in proc.stdout
    top = sandbox_cli("--help")
    assert top.returncode == 0 and "judge" in top.stdout


def test_invalid_limits_exit_with_an_error(programs, tmp_path):
    proc = judge_cli(programs, tmp_path / "out.jsonl", "--timeout", "0")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:") and "timeout_s" in proc.stderr
