"""docs/CONFIGURATION.md, generated from the flows' parameter models so that it cannot drift from
them: each flow's parameters (what the Prefect UI shows and a --config file holds), then every
nested settings model once, each field with its type, default and description.

    python -m cobalt.settings_reference          # print the page
    python -m cobalt.settings_reference --write  # write docs/CONFIGURATION.md

tests/test_settings_reference.py fails when the page is stale."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any
from unittest import mock

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

PAGE = Path(__file__).resolve().parents[1] / "docs" / "CONFIGURATION.md"
COMMAND = "python -m cobalt.settings_reference --write"


def flows() -> list[tuple[str, type[BaseModel]]]:
    """Each flow (its command line) and the model of its parameters."""
    from cobalt.analysis.stages import HackingParams
    from cobalt.data.stages import DataParams
    from cobalt.pipeline.params import PipelineParams
    from cobalt.training.stages import TrainingParams
    from cobalt.trajectories.stages import TrajectoryParams

    return [
        ("flows.pipeline", PipelineParams),
        ("flows.data", DataParams),
        ("flows.trajectories", TrajectoryParams),
        ("flows.training, flows.training_nodes", TrainingParams),
        ("flows.reward_hacking", HackingParams),
    ]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models an annotation holds (`X`, `X | None`, `list[X]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type(annotation: Any) -> str:
    """A short spelling of a field's type: `int | None`, `'a' | 'b'`, `list[SourceSpec]`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    """The field's default as JSON (a nested model's: what differs from that model's own
    defaults); one that depends on the machine (its CPUs, a home directory) named, not computed
    here; one a COBALT_* variable can set computed without it."""
    factory = field.default_factory
    if field.default is PydanticUndefined and factory is None:
        return "required"
    if "cpu_count" in getattr(getattr(factory, "__code__", None), "co_names", ()):
        return "CPUs of the machine"
    named = getattr(factory, "__name__", "<lambda>") != "<lambda>"
    if factory is not None and named and not isinstance(factory, type):
        value = factory()
        if not isinstance(value, BaseModel):
            return f"`{factory.__name__}()`"
    with mock.patch.dict(os.environ):
        for name in [n for n in os.environ if n.startswith("COBALT_")]:
            del os.environ[name]
        value = field.get_default(call_default_factory=True, validated_data={})
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_defaults=True)
        if not value:
            return "its defaults"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return f"{len(value)} × {type(value[0]).__name__}"
    text = json.dumps(value, default=str, separators=(",", ":"))
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _table(model: type[BaseModel], skip: set[str] = frozenset()) -> list[str]:
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        kind = _type(field.annotation)
        for nested in _models_in(field.annotation):
            link = f"[{nested.__name__}](#{nested.__name__.lower()})"
            kind = kind.replace(nested.__name__, link, 1)
        rows.append(f"| `{name}` | {kind} | {_default(field)} | {_cell(field.description)} |")
    return rows


def _section(title: str, model: type[BaseModel], shared: dict[str, list[str]]) -> list[str]:
    """A model's section: its docstring, the fields an earlier flow listed (`shared`: that flow
    -> the names), then the table of the rest."""
    lines = [f"## {title}", ""]
    if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
        lines += [_cell(model.__doc__), ""]
    for earlier, names in shared.items():
        lines += [f"Also {', '.join(f'`{n}`' for n in names)}: as in {earlier}.", ""]
    skip = {n for names in shared.values() for n in names}
    return [*lines, *_table(model, skip), ""]


def render() -> str:
    """The page: the flows' parameters (a field another flow listed before with the same
    description named, not repeated), then each nested model once, in the order first met."""
    intro = (
        f"Every setting of the flows, generated from their parameter models (`{COMMAND}`; a "
        "test fails when this page is stale): what the Prefect UI shows, what `--config FILE` "
        "holds (partial JSON, merged into the defaults) and what the flags set. The pipeline's "
        "preset fills what is left unset ([METHOD](METHOD.md))."
    )
    lines = ["# Configuration", "", textwrap.fill(intro, 100, break_on_hyphens=False), ""]
    queue: list[type[BaseModel]] = []
    first: dict[tuple[str, str], str] = {}  # (field, description) -> the flow that listed it
    for flow, model in flows():
        shared: dict[str, list[str]] = {}  # an earlier flow -> this flow's fields it listed
        for name, field in model.model_fields.items():
            listed = first.setdefault((name, _cell(field.description)), flow)
            if listed != flow:
                shared.setdefault(listed, []).append(name)
            queue += _models_in(field.annotation)
        lines += _section(f"{flow}: {model.__name__}", model, shared)
    seen: list[type[BaseModel]] = [model for _, model in flows()]
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.append(model)
        lines += _section(model.__name__, model, {})
        for field in model.model_fields.values():
            queue += _models_in(field.annotation)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cobalt.settings_reference", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true", help=f"write {PAGE.name} under docs/")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        PAGE.write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
