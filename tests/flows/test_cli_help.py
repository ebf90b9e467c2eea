"""Every command line's `--help` (the flows', the learning check's) runs as `python -m` runs it,
exits 0 and gives every option it lists a help text; a renamed option's former name is hidden
from it and still works, saying which name replaced it."""

from __future__ import annotations

import argparse
import re
import runpy
import warnings

import pytest

from experiments.learning_check import config as learning_check
from flows import data, pipeline, reward_hacking, training, training_nodes, trajectories

PARSERS = {
    "flows.data": data.build_parser,
    "flows.trajectories": trajectories.build_parser,
    "flows.training": training.build_parser,
    "flows.training_nodes": training_nodes.build_parser,
    "flows.pipeline": pipeline.build_parser,
    "flows.reward_hacking": reward_hacking.build_parser,
    "experiments.learning_check": learning_check.build_parser,
}


@pytest.mark.parametrize("module", sorted(PARSERS))
def test_help_runs_and_every_option_listed_has_help(module, capsys, monkeypatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)  # the learning check sets them: undone after
    monkeypatch.setattr("sys.argv", [module, "--help"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        with pytest.raises(SystemExit) as done:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m " + module), out[:200]
    parser = PARSERS[module]()
    listed = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    missing = [a.option_strings[0] for a in listed if not (a.help or "").strip()]
    assert missing == [], f"{module}: options without help: {missing}"
    for action in listed:
        assert action.option_strings[0] in out, action.option_strings[0]


def listed_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings --help shows."""
    return {
        flag for a in parser._actions if a.help != argparse.SUPPRESS for flag in a.option_strings
    }


RENAMED = [
    ("flows.data", "--concurrency", "--sandbox-concurrency", "3", lambda p: p.sandbox.concurrency),
    ("flows.data", "--seed", "--split-seed", "5", lambda p: (p.load.seed, p.split.seed)),
    ("flows.training", "--perturbed", "--perturbed-trajectories", "/runs/x", lambda p: p.perturbed),
    ("flows.training", "--num-processes", "--gpus", "2", lambda p: p.training.num_processes),
    ("flows.pipeline", "--reference", "--model", "tiny", lambda p: p.reference),
    ("flows.reward_hacking", "--compare", "--baseline", "latest", lambda p: p.compare),
    ("flows.reward_hacking", "--judge-chunk", "--judge-chunk-size", "8", lambda p: p.judge_chunk),
]  # fmt: skip
MODULES = {
    "flows.data": data,
    "flows.training": training,
    "flows.pipeline": pipeline,
    "flows.reward_hacking": reward_hacking,
}


@pytest.mark.parametrize(
    ("module", "old", "new", "value", "read"), RENAMED, ids=[f"{r[0]} {r[1]}" for r in RENAMED]
)
def test_a_former_name_still_works_hidden_and_says_the_new_one(
    module, old, new, value, read, capsys
) -> None:
    parse = MODULES[module].parse_params
    assert read(parse([old, value])) == read(parse([new, value]))
    assert f"warning: {old} is now {new}" in capsys.readouterr().err
    assert listed_flags(PARSERS[module]()) >= {new} and old not in listed_flags(PARSERS[module]())


@pytest.mark.parametrize(
    ("old", "new", "value", "dest"),
    [
        ("--eval-n", "--eval-samples", "3", "eval_n"),
        ("--offline-objective", "--objective", "reinforce_loo", "offline_objective"),
    ],
)
def test_the_learning_checks_former_names_still_work(old, new, value, dest, capsys) -> None:
    parser = learning_check.build_parser()
    before = getattr(parser.parse_args(["--out", "x", old, value]), dest)
    assert before == getattr(parser.parse_args(["--out", "x", new, value]), dest)
    assert str(before) == value
    assert f"warning: {old} is now {new}" in capsys.readouterr().err
    assert new in listed_flags(parser) and old not in listed_flags(parser)
    assert not re.search(rf"(?<![\w-]){old}(?![\w-])", parser.format_help())  # nowhere


def test_a_former_name_keeps_the_new_ones_default() -> None:
    """The hidden alias adds no default of its own: left out, the option keeps its default."""
    args = learning_check.build_parser().parse_args(["--out", "x"])
    assert (args.eval_n, args.offline_objective) == (4, "awr")
    assert data.parse_params([]).split.seed == 0
