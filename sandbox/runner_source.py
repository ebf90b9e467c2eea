"""The runner's source text, sent to each sandbox as `python3 -c` (no project code in the image):
`confine.py`'s source, run as a module of its own, then `runner.py`'s in place of its import."""

from pathlib import Path

HERE = Path(__file__).parent
IMPORT = "from sandbox import confine"


def _source() -> str:
    runner = (HERE / "runner.py").read_text()
    confine = (HERE / "confine.py").read_text()
    lines = runner.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(IMPORT))
    inline = (
        "import types as _types\n"
        "confine = _types.ModuleType('confine')\n"
        f"exec(compile({confine!r}, 'confine.py', 'exec'), confine.__dict__)\n"
    )
    return "".join(lines[:at]) + inline + "".join(lines[at + 1 :])


RUNNER_SOURCE = _source()
