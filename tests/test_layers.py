"""The layering rule (docs/ARCHITECTURE.md): dependencies point one way,

    flows -> tasks -> cobalt (the method) -> engines, sandbox

`sandbox/`, `engines/` and `cobalt/` never import Prefect or a layer above them, so the method can
be used from a notebook or a script without Prefect. Checked two ways: every import statement in
the source (function-level ones included), and a fresh interpreter that imports every library
module and must not have loaded Prefect (a dependency could pull it in). Also: no module over
LONG lines without a reason written at its top.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PREFECT = ("prefect", "prefect_dask", "prefect_ray", "prefect_docker", "prefect_kubernetes")
FORBIDDEN = {
    "sandbox": {"engines", "cobalt", "tasks", "flows", *PREFECT},
    "engines": {"cobalt", "tasks", "flows", *PREFECT},
    "cobalt": {"tasks", "flows", *PREFECT},
    "tasks": {"flows"},
    "experiments": {"tasks", "flows", *PREFECT},  # python -m experiments.<name>, on the library
}
for _layer in ("sandbox", "engines", "cobalt", "tasks", "flows"):  # and nothing imports one
    FORBIDDEN.setdefault(_layer, set()).add("experiments")
LONG = 520  # "about 500 lines"
REASON = "Long module:"  # how a module over LONG lines says why, in its docstring


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in a Python file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(root: Path) -> list[str]:
    """Every import in `root`'s layers that points at a forbidden package, as 'file:line -> pkg'."""
    bad = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((root / layer).rglob("*.py")):
            for line, package in imported_packages(path):
                if package in forbidden:
                    bad.append(f"{path.relative_to(root)}:{line} -> {package}")
    return bad


def test_no_layer_imports_prefect_or_a_layer_above_it() -> None:
    assert violations(ROOT) == []


def test_the_check_catches_a_violation(tmp_path: Path) -> None:
    """The rule above can fail: a library module importing Prefect in a function, an engine
    importing the library, a sandbox module importing an engine."""
    for layer in FORBIDDEN:
        (tmp_path / layer).mkdir()
    (tmp_path / "cobalt" / "bad.py").write_text("def f():\n    from prefect import task\n")
    (tmp_path / "engines" / "bad.py").write_text("import cobalt.storage\n")
    (tmp_path / "sandbox" / "ok.py").write_text("import json\nfrom . import models\n")
    (tmp_path / "sandbox" / "bad.py").write_text("from engines import Engine\n")
    (tmp_path / "tasks" / "ok.py").write_text("import prefect\nimport cobalt\n")
    assert violations(tmp_path) == [
        "sandbox/bad.py:1 -> engines",
        "engines/bad.py:1 -> cobalt",
        "cobalt/bad.py:2 -> prefect",
    ]


def test_no_package_imports_an_experiment(tmp_path: Path) -> None:
    for layer in FORBIDDEN:
        (tmp_path / layer).mkdir()
    (tmp_path / "flows" / "bad.py").write_text("from experiments.learning_check import kinds\n")
    (tmp_path / "experiments" / "ok.py").write_text("import cobalt, engines, sandbox\n")
    (tmp_path / "experiments" / "bad.py").write_text("import json\nimport prefect\n")
    assert violations(tmp_path) == [
        "experiments/bad.py:2 -> prefect",
        "flows/bad.py:1 -> experiments",
    ]


def library_modules() -> list[str]:
    names = []
    for layer in ("sandbox", "engines", "cobalt"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_library_loads_without_prefect() -> None:
    modules = library_modules()
    assert "cobalt.training.grpo" in modules and "sandbox.judge" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{PREFECT!r} or m.split('.')[0] in ('tasks', 'flows'))\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("layer", ["sandbox", "engines", "cobalt", "tasks", "flows", "experiments"])
def test_long_modules_say_why_at_their_top(layer: str) -> None:
    long = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > LONG and not any(REASON in line for line in lines[:20]):
            long.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert long == [], f"split them, or say why at the top ('{REASON} ...')"
