"""The training options of `flows.pipeline` and `flows.training`, defined once (`OPTIONS`) and
added to either flow's parser by `add_training_args`. Each option's help is the description of
the setting it sets (a field of `TrainingConfig`, `BanditConfig`, ...: the settings and --help
say one thing); a flag the two flows read differently (--model, --preset, --turns) says, in its
one help text, what each flow does with it. `training_values` puts the flags given into a flow's
parameter values."""

from __future__ import annotations

import argparse
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from cobalt.params import add_option, deep_merge, help_text
from cobalt.pipeline.params import PipelineParams
from cobalt.training.decisions import PRECISIONS, SHARDINGS
from cobalt.training.settings import MODES, OBJECTIVES
from cobalt.training.stages import TrainingParams

Flow = Literal["pipeline", "training"]
FLOWS: tuple[Flow, ...] = ("pipeline", "training")
ROOTS: dict[Flow, type[BaseModel]] = {"pipeline": PipelineParams, "training": TrainingParams}


@dataclass(frozen=True)
class Option:
    """One flag: the field it sets in each flow that takes it (a dotted path in the flow's
    parameters), how argparse reads it, and what the help adds to the field's description."""

    flag: str
    to: dict[Flow, str]  # flow -> the field's dotted path in its parameters
    kwargs: dict[str, Any] = field(default_factory=dict)  # argparse's, help excepted
    note: str = ""  # what the flag does besides setting the field, in every flow
    notes: dict[Flow, str] = field(default_factory=dict)  # ... in one flow
    aliases: dict[Flow, tuple[str, ...]] = field(default_factory=dict)  # hidden former names
    read: Literal["value", "true", "lora", "names", "pairs"] = "value"  # the flag -> the value

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.flag.removeprefix("--").replace("-", "_")


def both(path: str) -> dict[Flow, str]:
    """The same field in both flows."""
    return {"pipeline": path, "training": path}


def alone(path: str) -> dict[Flow, str]:
    """A field only flows.training sets from its command line."""
    return {"training": path}


OPTIONS: tuple[Option, ...] = (
    Option("--trajectories", alone("trajectories"), {"metavar": "WHERE"}),
    Option(
        "--perturbed-trajectories",
        alone("perturbed"),
        {"metavar": "DIR"},
        aliases={"training": ("--perturbed",)},
    ),
    Option(
        "--model",
        {"pipeline": "reference", "training": "model"},
        {"metavar": "NAME"},
        aliases={"pipeline": ("--reference",)},
    ),
    Option(
        "--preset",
        {"pipeline": "preset", "training": "training.preset"},
        {"choices": ["tiny", "paper"]},
        notes={
            "training": "Unset, the one flows.pipeline picks for the policy: tiny for the "
            "embedded models (fitted, tiny, a directory the tiny fit made), paper for any other."
        },
    ),
    Option("--mode", both("training.mode"), {"choices": MODES}),
    Option("--objective", both("training.offline.objective"), {"choices": OBJECTIVES}),
    Option("--reward", both("training.reward"), {"choices": ["correctness", "dense"]}),
    Option(
        "--turns",
        {"pipeline": "collect.turns", "training": "training.turns"},
        {"type": int, "metavar": "N"},
        notes={"pipeline": "(Its evaluations: --eval-turns.)"},
    ),
    Option("--max-steps", both("training.max_steps"), {"type": int, "metavar": "N"}),
    Option("--save-steps", alone("training.save_steps"), {"type": int, "metavar": "N"}),
    Option("--precision", both("training.precision"), {"choices": PRECISIONS}),
    Option("--lora", both("training.lora"), {"action": "store_true"}, read="lora"),
    Option(
        "--format-reward",
        alone("training.use_format_reward"),
        {"action": "store_true"},
        note="The flag turns it on.",
        read="true",
    ),
    Option(
        "--gpus",
        both("training.num_processes"),
        {"type": int, "metavar": "N"},
        notes={
            "pipeline": "The generating stages' GPUs too: vLLM on N, one engine each (default: "
            "every visible GPU)."
        },
        aliases={"training": ("--num-processes",)},
    ),
    Option("--sharding", both("training.sharding"), {"choices": SHARDINGS}),
    Option(
        "--fsdp-gather",
        both("training.fsdp_gather"),
        {"choices": ["float32", "bf16-linear", "bfloat16"]},
    ),
    Option(
        "--gradient-sync",
        both("training.gradient_sync"),
        {"choices": ["auto", "step", "micro_batch"]},
    ),
    Option("--packing", both("training.packing"), {"action": "store_true"}, read="true"),
    Option(
        "--share-prompts",
        both("training.share_prompts"),
        {"action": "store_true"},
        note="Implies --packing.",
        read="true",
    ),
    Option(
        "--async",
        both("training.async_generation"),
        {"action": "store_true", "dest": "async_generation"},
        read="true",
    ),
    Option("--vllm-server-gpus", both("training.vllm_server_gpus"), {"type": int, "metavar": "K"}),
    Option(
        "--fp8-generation", both("training.fp8_generation"), {"action": "store_true"}, read="true"
    ),
    Option("--fp8-kv-cache", both("training.fp8_kv_cache"), {"action": "store_true"}, read="true"),
    Option("--accelerate-config", alone("training.accelerate_config"), {"metavar": "FILE"}),
    Option(
        "--nodes",
        both("training.nodes"),
        {"type": int, "metavar": "N"},
        notes={
            "pipeline": "It places one job a node through the training-node deployment, on the "
            "GPU pool's queues node-0, node-1, ... (docs/DEPLOYMENT.md 7d).",
            "training": "Run the same command on every node, each with its --node-rank.",
        },
    ),
    Option("--node-rank", alone("training.node_rank"), {"type": int, "metavar": "R"}),
    Option("--rdzv-endpoint", both("training.rdzv_endpoint"), {"metavar": "HOST:PORT"}),
    Option(
        "--report-to",
        both("training.report_to"),
        {"action": "append", "metavar": "NAME"},
        note="Repeatable; none: off.",
        read="names",
    ),
    Option(
        "--set",
        both("training.overrides"),
        {"action": "append", "metavar": "KEY=JSON"},
        note="Repeatable.",
        read="pairs",
    ),
    Option(
        "--offline",
        alone("training.offline"),
        {"action": "append", "metavar": "KEY=JSON"},
        note="Any of its fields as KEY=JSON, repeatable, e.g. --offline awr_beta=0.5.",
        read="pairs",
    ),
    Option("--max-prompt-tokens", alone("bandit.max_prompt_tokens"), {"type": int, "metavar": "N"}),
    Option("--bandit-mode", alone("bandit.mode"), {"choices": ["train", "validation"]}),
    Option(
        "--perturbed-ratio",
        both("bandit.perturbed_ratio"),
        {"type": float, "metavar": "SHARE"},
        notes={
            "pipeline": "It collects those trajectories itself.",
            "training": "They come from --perturbed-trajectories.",
        },
    ),
)


def field_of(root: type[BaseModel], path: str) -> tuple[type[BaseModel], str]:
    """The model class holding the field at the dotted `path` of `root`, and its name."""
    model = root
    *parents, name = path.split(".")
    for part in parents:
        model = _model_in(model.model_fields[part].annotation)
    if name not in model.model_fields:
        raise KeyError(f"{root.__name__}.{path}: no such field")
    return model, name


def _model_in(annotation: Any) -> type[BaseModel]:
    """The pydantic model in a field's annotation (`X`, `X | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    raise TypeError(f"{annotation!r} holds no settings model")


def description(flow: Flow, option: Option) -> str:
    """The description of the field `option` sets in `flow`; ValueError when it has none."""
    model, name = field_of(ROOTS[flow], option.to[flow])
    text = model.model_fields[name].description
    if not text:
        raise ValueError(
            f"{option.flag}: {model.__name__}.{name} has no description (its --help): add one"
        )
    return " ".join(text.split())


def option_help(option: Option) -> str:
    """The one help text of `option`, the same in every flow that takes it: the field's
    description (each flow's, named, where the flows set different fields), what the flag adds,
    and what it does in one flow only."""
    flows = [f for f in FLOWS if f in option.to]
    texts = {f: description(f, option) for f in flows}
    same = len({field_of(ROOTS[f], option.to[f]) for f in flows}) == 1
    parts: list[str] = []
    if same:
        parts.append(texts[flows[0]])
    if option.note:
        parts.append(option.note)
    for flow in flows:
        own = [texts[flow]] if not same else []
        if flow in option.notes:
            own.append(option.notes[flow])
        if own:
            parts.append(" ".join(own) if len(flows) == 1 else f"flows.{flow}: " + " ".join(own))
    return " ".join(parts)


def add_training_args(parser: argparse.ArgumentParser, flow: Flow) -> None:
    """The training options `flow` takes, each with its help (`option_help`) and its hidden
    former names."""
    for option in OPTIONS:
        if flow in option.to:
            add_option(
                parser,
                option.flag,
                aliases=option.aliases.get(flow, ()),
                help=help_text(option_help(option)),
                **option.kwargs,
            )


def training_values(
    args: argparse.Namespace,
    values: dict[str, Any],
    flow: Flow,
    error: Any = None,
) -> None:
    """Put the training options given on the command line into `values` (the flow's parameters,
    over a --config file's: merged later), at each option's field; `error(message)` (the
    parser's) for a KEY=JSON that is not one."""
    for option in OPTIONS:
        if flow not in option.to:
            continue
        given = getattr(args, option.dest, None)
        if given is None or given is False or given == []:
            continue
        *parents, name = option.to[flow].split(".")
        place = values
        for depth, part in enumerate(parents, 1):
            place = place.setdefault(part, {})
            if not isinstance(place, dict):  # a --config file's mistake: ConfigError names it
                deep_merge({}, place, ".".join(parents[:depth]))
        if option.read == "value":
            place[name] = given
        elif option.read == "true":
            place[name] = True
        elif option.read == "lora":
            place[name] = place.get(name) or {}  # a --config file's LoRA settings stay
        elif option.read == "names":
            place[name] = [n for n in given if n != "none"]
        elif option.read == "pairs":
            place.setdefault(name, {}).update(pairs(option.flag, given, error))
    if getattr(args, "share_prompts", False):
        values["training"]["packing"] = True


EXAMPLES = {"--set": "max_completion_length=256", "--offline": "awr_beta=0.5"}


def pairs(flag: str, items: list[str], error: Any = None) -> dict[str, Any]:
    """`KEY=JSON` items as a dict (a value that is not JSON: the text itself)."""
    found: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            message = f"{flag} {item!r}: use KEY=JSON, e.g. {flag} {EXAMPLES.get(flag, 'key=1')}"
            if error is None:
                raise ValueError(message)
            error(message)
        try:
            found[key] = json.loads(text)
        except json.JSONDecodeError:
            found[key] = text
    return found
