"""Parameters assembled from several places: a preset's or a flow's defaults, a --config file's
partial objects, flags. `deep_merge` is the one rule (nested objects merge key by key), used by the
flows' command lines and by `cobalt.pipeline`'s presets; `ConfigError` names the field when a
partial object is not one. The command lines (the flows', the learning check's) declare a flag
with its former names through `add_option`, and a setting's description as help through
`help_text`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cobalt.errors import UserError


class ConfigError(UserError):
    """A --config file cannot be read or is not a JSON object; the message says where."""


def deep_merge(base: dict[str, Any], over: Any, where: str = "") -> dict[str, Any]:
    """`over` (a --config file's object) merged into a copy of `base` (the defaults): nested
    objects key by key, so a partial object keeps the defaults it leaves out; other values
    replaced. `where`: the field's dotted name, for the ConfigError of a non-object."""
    if not isinstance(over, dict):
        raise ConfigError(
            f"config field {where or '(top level)'}: a JSON object expected, not "
            f'{json.dumps(over)[:60]}: write {{"field": value, ...}}'
        )
    merged = dict(base)
    for key, value in over.items():
        if isinstance(merged.get(key), dict) and value is not None:
            merged[key] = deep_merge(merged[key], value, f"{where}.{key}" if where else key)
        else:
            merged[key] = value
    return merged


def check_objects(given: dict[str, Any], shape: dict[str, Any], where: str = "") -> None:
    """`given` (a --config file's object) holds an object, or nothing, wherever `shape` (the
    flags merged over it) holds one: a flag must not silently replace a mistake in the file."""
    for key, value in shape.items():
        name = f"{where}.{key}" if where else key
        if not isinstance(value, dict) or given.get(key) is None:
            continue
        if not isinstance(given[key], dict):
            deep_merge({}, given[key], name)  # raises the ConfigError that names the field
        check_objects(given[key], value, name)


def help_text(text: str) -> str:
    """`text` as an argparse help string: one line of words, '%' kept literal (argparse formats
    help with %-style fields)."""
    return " ".join(text.split()).replace("%", "%%")


def add_option(
    container: Any, *flags: str, aliases: tuple[str, ...] = (), **kwargs: Any
) -> argparse.Action:
    """`container.add_argument(*flags, **kwargs)`, and each of `aliases` (a former spelling of
    the first flag) as the same option left out of --help: it still works, and says on stderr
    which name replaced it."""
    action = container.add_argument(*flags, **kwargs)
    for old in aliases:
        hidden = {**kwargs, "dest": action.dest, "help": argparse.SUPPRESS}
        hidden["default"] = argparse.SUPPRESS  # the new flag's default stands
        renamed = container.add_argument(old, **hidden)
        renamed.__class__ = _renamed(type(renamed), flags[0])
    return action


def _renamed(base: type[argparse.Action], new: str) -> type[argparse.Action]:
    """`base`, warning on stderr that the option used is now spelled `new`."""

    class Renamed(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser, namespace, values, option_string=None):
            print(
                f"warning: {option_string} is now {new} (the old name goes in a later release)",
                file=sys.stderr,
            )
            super().__call__(parser, namespace, values, option_string)

    return Renamed
