"""docs/CONFIGURATION.md is what `cobalt.settings_reference` generates from the flows' parameter
models: a setting added, renamed or described anew without regenerating the page fails here."""

from __future__ import annotations

from pydantic import BaseModel

from cobalt.settings_reference import COMMAND, PAGE, _models_in, flows, render


def test_the_configuration_page_is_the_one_the_settings_generate() -> None:
    assert PAGE.read_text() == render(), f"docs/CONFIGURATION.md is stale: run `{COMMAND}`"


def test_every_field_of_every_settings_model_a_flow_reaches_has_a_row() -> None:
    """The walk misses no nested model: each field of each model reachable from a flow's
    parameters (through `X | None`, `list[X]`, ...) is a row of its model's section, or a flow's
    field an earlier flow's table holds with the same description."""
    page = render()
    sections = {part.split("\n", 1)[0]: part for part in page.split("\n## ")[1:]}
    queue: list[type[BaseModel]] = [model for _, model in flows()]
    seen: set[type[BaseModel]] = set()
    while queue:
        model = queue.pop()
        if model in seen:
            continue
        seen.add(model)
        section = next(
            text for title, text in sections.items()
            if title == model.__name__ or title.endswith(f": {model.__name__}")
        )  # fmt: skip
        for name, field in model.model_fields.items():
            # a row, or named as listed by an earlier flow ("Also `a`, `b`: as in flows.x.")
            row = f"| `{name}` |" in section
            also = any(
                f"`{name}`" in line for line in section.splitlines() if line.startswith("Also ")
            )
            assert row or also, f"{model.__name__}.{name} is not on the page"
            queue += _models_in(field.annotation)
    assert {"TrainingConfig", "CollectConfig", "EngineConfig", "CleanRules"} <= {
        m.__name__ for m in seen
    }
