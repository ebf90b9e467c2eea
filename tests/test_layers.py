"""The layering rule (docs/ARCHITECTURE.md): dependencies point one way,

    flows -> tasks -> cobalt (the method) -> engines, sandbox

`sandbox/`, `engines/` and `cobalt/` never import Prefect or a layer above them, so the method can
be used from a notebook or a script without Prefect. Checked two ways: every import statement in
the source (function-level ones included), and a fresh interpreter that imports every library
module and must not have loaded Prefect (a dependency could pull it in). Inside `cobalt/`, the
pipeline's order (`COBALT_ORDER`): a module imports only from its own unit or an earlier one, and
no import cycle anywhere. Also: no module over LONG lines without a reason written at its top, and
experiments/, benchmarks/ and scripts/ use no private member (the library's public functions only).
"""

from __future__ import annotations

import ast
import itertools
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
# cobalt's units in pipeline order (docs/ARCHITECTURE.md): a module imports only from its own unit
# and the units before it. A unit is a module or a sub-package; every module of cobalt/ belongs to
# one (the longest name it starts with; `cobalt` alone is the package's __init__). Within a unit
# any direction goes, but no cycle does.
COBALT_ORDER = (
    # shared by every stage
    "cobalt.errors",
    "cobalt.params",
    "cobalt.tables",
    "cobalt.plots",
    "cobalt.problems",
    "cobalt.storage",
    "cobalt.judging",
    "cobalt.run_settings",
    "cobalt.models",
    # the stages
    "cobalt.data",
    "cobalt.trajectories",
    "cobalt.bandit",
    # training, its rooms in order: the method (rewards, objectives, rollouts, rows, presets), the
    # decisions (GPU count, numerics, sharding, batch), the settings, the machinery that runs it,
    # the reporting, then the trainers, the launch and the stage (cobalt/training/__init__.py)
    "cobalt.training.method",
    "cobalt.training.decisions",
    "cobalt.training.settings",
    "cobalt.training.machinery",
    "cobalt.training.reporting",
    "cobalt.training",
    "cobalt.reference",
    "cobalt.presets",
    "cobalt.analysis",
    "cobalt.seed_spread",
    "cobalt.pipeline",
    "cobalt.settings_reference",  # the settings page: every flow's parameters
    # the package itself: wires the reference fit into model naming (cobalt/__init__.py)
    "cobalt",
)
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


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cobalt_imports(root: Path) -> list[tuple[str, str, str]]:
    """(importer, 'file:line', imported module) of every import of a cobalt module in
    `root`/cobalt: top-level, in functions, under TYPE_CHECKING; absolute and relative. `from
    package import name` counts as the module `package.name` when there is one."""
    paths = {module_name(root, p): p for p in sorted((root / "cobalt").rglob("*.py"))}
    found = []
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                if target.split(".")[0] != "cobalt":
                    continue
                while target not in paths and "." in target:
                    target = target.rpartition(".")[0]
                edge = (name, f"{path.relative_to(root)}:{node.lineno}", target)
                if target != name and edge not in found:
                    found.append(edge)
    return found


def unit_of(module: str, order: tuple[str, ...]) -> str | None:
    """The longest unit of `order` that `module` is or lies in (the top package, `cobalt`, holds
    only its __init__)."""
    units = [u for u in order if module == u or ("." in u and module.startswith(u + "."))]
    return max(units, key=len, default=None)


def cycles(edges: list[tuple[str, str, str]]) -> list[str]:
    """One import cycle of each strongly connected set of modules (Tarjan), the shortest through
    its first module, as its edges: 'file:line -> module, file:line -> module, ...'."""
    graph: dict[str, dict[str, str]] = {}
    for importer, where, imported in edges:
        graph.setdefault(importer, {}).setdefault(imported, where)
        graph.setdefault(imported, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for component in components:  # breadth first from its first module back to it
        start = min(component)
        paths, frontier, cycle = {start: [start]}, [start], None
        while cycle is None:
            step = []
            for node in frontier:
                for nxt in sorted(n for n in graph[node] if n in component):
                    if nxt == start:
                        cycle = cycle or [*paths[node], start]
                    elif nxt not in paths:
                        paths[nxt] = [*paths[node], nxt]
                        step.append(nxt)
            frontier = step
        found.append(", ".join(f"{graph[a][b]} -> {b}" for a, b in itertools.pairwise(cycle)))
    return found


def order_violations(root: Path, order: tuple[str, ...] = COBALT_ORDER) -> list[str]:
    """Every cobalt module outside the declared units, every import against `order` and every
    import cycle, each naming the file, the line and the module imported."""
    edges = cobalt_imports(root)
    modules = {module_name(root, p) for p in (root / "cobalt").rglob("*.py")}
    bad = [f"{m}: in no unit of the order" for m in sorted(modules) if unit_of(m, order) is None]
    rank = {unit: i for i, unit in enumerate(order)}
    for importer, where, imported in edges:
        units = unit_of(importer, order), unit_of(imported, order)
        if None not in units and rank[units[1]] > rank[units[0]]:
            bad.append(f"{where} -> {imported} (against the order: {units[0]} before {units[1]})")
    bad += [f"import cycle: {cycle}" for cycle in cycles(edges)]
    return bad


def test_cobalt_follows_the_pipeline_order_without_cycles() -> None:
    assert order_violations(ROOT) == []


def test_the_order_check_catches_a_violation_and_a_cycle(tmp_path: Path) -> None:
    """An import against the order in a function, one under TYPE_CHECKING, a relative cycle
    inside a unit and a module in no unit are each named; an import down the order is not."""
    files = {
        "cobalt/__init__.py": "",
        "cobalt/errors.py": "def f():\n    from cobalt.data.a import A\n",
        "cobalt/data/__init__.py": "",
        "cobalt/data/a.py": "from typing import TYPE_CHECKING\nfrom . import b\n"
        "if TYPE_CHECKING:\n    from cobalt.training import grpo\n",
        "cobalt/data/b.py": "import cobalt.errors\nfrom .a import A\n",
        "cobalt/training/__init__.py": "",
        "cobalt/training/grpo.py": "from cobalt.data import a\nfrom cobalt.errors import f\n",
        "cobalt/stray.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    order = ("cobalt.errors", "cobalt.data", "cobalt.training", "cobalt")
    assert order_violations(tmp_path, order) == [
        "cobalt.stray: in no unit of the order",
        "cobalt/data/a.py:4 -> cobalt.training.grpo (against the order: cobalt.data before "
        "cobalt.training)",
        "cobalt/errors.py:2 -> cobalt.data.a (against the order: cobalt.errors before cobalt.data)",
        "import cycle: cobalt/data/a.py:2 -> cobalt.data.b, cobalt/data/b.py:2 -> cobalt.data.a",
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


@pytest.mark.parametrize(
    "layer", ["sandbox", "engines", "cobalt", "tasks", "flows", "scripts", "experiments"]
)
def test_long_modules_say_why_at_their_top(layer: str) -> None:
    long = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > LONG and not any(REASON in line for line in lines[:20]):
            long.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert long == [], f"split them, or say why at the top ('{REASON} ...')"


LIBRARIES = ("cobalt", "engines", "sandbox")


def private_uses(root: Path) -> list[str]:
    """Every private name (one leading underscore) that a module of experiments/, benchmarks/ or
    scripts/ imports from the library or reads off an object other than its own `self`/`cls`, as
    'file:line name': they are to use the library's public functions only."""
    found = []
    for folder in ("experiments", "benchmarks", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if (
                    isinstance(node, ast.ImportFrom)
                    and (node.module or "").split(".")[0] in LIBRARIES
                ):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Attribute):
                    base = node.value
                    while isinstance(base, ast.Attribute):
                        base = base.value
                    if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                        names = [node.attr]
                names = [n for n in names if n.startswith("_") and not n.startswith("__")]
                found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names]
    return found


def test_experiments_benchmarks_and_scripts_use_public_functions_only(tmp_path: Path) -> None:
    assert private_uses(ROOT) == []
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bad.py").write_text(
        "from cobalt.training.offline import _private\nengine._vllm.x\nself._own = 1\n"
    )
    assert private_uses(tmp_path) == ["benchmarks/bad.py:1 _private", "benchmarks/bad.py:2 _vllm"]
