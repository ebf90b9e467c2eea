"""The training options are defined once (flows/training_options.py): flows.pipeline and
flows.training show one help text per shared flag, each made of its setting's description, and
the same flags give the same training settings in both flows."""

from __future__ import annotations

import pytest

from cobalt.training.settings import LoraSettings, OfflineSettings, TrainingConfig
from flows import pipeline, training
from flows.training_options import FLOWS, OPTIONS, description, field_of, option_help


def helps(parser) -> dict[str, str]:
    return {flag: a.help for a in parser._actions for flag in a.option_strings}


def test_the_two_flows_shared_flags_have_one_help() -> None:
    """Every flag both flows take reads the same in both `--help`s (--config names each flow's
    own parameters)."""
    ours, theirs = helps(pipeline.build_parser()), helps(training.build_parser())
    shared = sorted((set(ours) & set(theirs)) - {"--config"})
    assert len(shared) >= 25, shared
    differ = [flag for flag in shared if ours[flag] != theirs[flag]]
    assert differ == [], {flag: (ours[flag], theirs[flag]) for flag in differ}


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.flag)
def test_every_option_is_its_settings_description(option) -> None:
    """Each flag's help holds the description of the field it sets in each flow (a missing
    description fails here, naming the field)."""
    text = option_help(option)
    for flow in option.to:
        assert description(flow, option) in text
    fields = {field_of(flow_root, option.to[flow]) for flow, flow_root in _roots(option)}
    if len(fields) > 1:  # one name, two meanings: the help says which flow means what
        assert all(f"flows.{flow}: " in text for flow in option.to), text


def _roots(option):
    from flows.training_options import ROOTS

    return [(flow, ROOTS[flow]) for flow in FLOWS if flow in option.to]


@pytest.mark.parametrize("model", [TrainingConfig, OfflineSettings, LoraSettings])
def test_every_training_setting_is_described(model) -> None:
    missing = [name for name, f in model.model_fields.items() if not f.description]
    assert missing == [], f"{model.__name__}: fields without a description: {missing}"


def test_a_flag_with_two_meanings_says_so() -> None:
    by_flag = {o.flag: option_help(o) for o in OPTIONS}
    for flag in ("--model", "--preset", "--turns"):
        assert "flows.pipeline: " in by_flag[flag] and "flows.training: " in by_flag[flag]
    assert "Its evaluations: --eval-turns" in by_flag["--turns"]
    assert "vLLM on N" in by_flag["--gpus"]  # the pipeline's generating stages too


@pytest.mark.parametrize(
    ("argv", "fields"),
    [
        (["--mode", "single_turn", "--max-steps", "3"], ["mode", "max_steps"]),
        (["--reward", "dense", "--precision", "fp32"], ["reward", "precision"]),
        (["--lora", "--report-to", "none"], ["lora", "report_to"]),
        (["--gpus", "2", "--sharding", "ddp"], ["num_processes", "sharding"]),
        (["--fsdp-gather", "bf16-linear", "--gradient-sync", "step"], ["fsdp_gather"]),
        (["--share-prompts", "--async"], ["packing", "share_prompts", "async_generation"]),
        (["--nodes", "2", "--rdzv-endpoint", "h:1"], ["nodes", "rdzv_endpoint"]),
    ],
)
def test_the_same_flags_give_the_same_training_in_both_flows(argv, fields) -> None:
    """What a shared flag sets, it sets alike in both flows."""
    ours, theirs = pipeline.parse_params(argv).training, training.parse_params(argv).training
    for name in fields:
        assert getattr(ours, name) == getattr(theirs, name), name
        assert name in theirs.model_fields_set, name  # set by the flag, not a default


def test_the_same_key_json_and_nested_flags_in_both_flows() -> None:
    argv = ["--set", "learning_rate=2e-6", "--set", "beta=0", "--perturbed-ratio", "0.25"]
    ours, theirs = pipeline.parse_params(argv), training.parse_params(argv)
    assert theirs.training.overrides == {"learning_rate": 2e-6, "beta": 0}
    assert ours.training.overrides.items() >= theirs.training.overrides.items()
    assert ours.bandit.perturbed_ratio == theirs.bandit.perturbed_ratio == 0.25
    offline = ["--mode", "offline", "--objective", "reinforce_loo"]
    assert pipeline.parse_params(offline).training.offline.objective == "reinforce_loo"
    assert training.parse_params(offline).training.offline.objective == "reinforce_loo"


def test_key_json_flags_refuse_a_pair_without_a_key() -> None:
    with pytest.raises(SystemExit):
        training.parse_params(["--set", "learning_rate"])
    with pytest.raises(SystemExit):
        pipeline.parse_params(["--set", "=1"])
    offline = training.parse_params(["--mode", "offline", "--offline", "awr_beta=0.25"])
    assert offline.training.offline.awr_beta == 0.25


def test_a_flag_over_a_config_files_non_object_names_the_field(tmp_path) -> None:
    from cobalt.params import ConfigError

    config = tmp_path / "c.json"
    config.write_text('{"training": [1]}')
    with pytest.raises(ConfigError, match="config field training: a JSON object expected"):
        training.parse_params(["--config", str(config), "--mode", "cobalt"])
