"""The pipeline flow end to end on its embedded default (smaller): the synthetic problems, the
tiny model fitted on CPU, the real sandbox, TRL's GRPOTrainer, a real Prefect API. Then a rerun
with one training parameter changed redoes only training and the evaluation after it; a random
model that repairs nothing fails the run at the bandit stage with a message that says why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)
from prefect_states import task_run_states

from cobalt.pipeline import PipelineParams
from cobalt.presets import tiny_collect
from cobalt.training.settings import DEFAULT_OBJECTIVE
from flows.pipeline import main, pipeline_flow

pytestmark = pytest.mark.slow
NAMESPACE = {"backend": "namespace", "concurrency": 2}


def params(storage: Path, **overrides: Any) -> PipelineParams:
    """The embedded default, smaller: 8 training problems, 6 test problems (the first 6 hold
    both difficulty groups) evaluated with 4 samples each, 2 GRPO steps."""
    values: dict[str, Any] = {
        "train_limit": 8,
        "eval_limit": 6,
        "eval_samples": 4,
        "sandbox": NAMESPACE,
        "storage": {"url": str(storage)},
        **overrides,
    }
    training = PipelineParams().training.model_dump()
    training.update(max_steps=2, save_steps=1)
    values.setdefault("training", training)
    return PipelineParams.model_validate(values)


def child_runs(flow_run_id: Any) -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )


def all_task_states(flow_run_id: Any) -> dict[str, str]:
    """'<flow run>/<task>' -> state name over the pipeline run and its subflow runs (the
    pipeline's own task runs that stand for its subflow runs are left out)."""
    own = task_run_states(flow_run_id)
    states = {
        f"pipeline/{k.rsplit('-', 1)[0]}": v for k, v in own.items() if k.startswith("reference-")
    }
    for run in child_runs(flow_run_id):
        for name, state in task_run_states(run.id).items():
            states[f"{run.name}/{name.split('-')[0] if '-' in name else name}"] = state
    return states


def artifact_keys(flow_run_id: Any) -> set[str]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key for a in found if a.key}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(900)
def test_pipeline_runs_every_stage_and_reruns_only_what_changed(tmp_path, fitted_model):
    """Every stage of the pipeline with the fitted model, the reward-hacking analysis of both
    policies, then a rerun that trains one more step: over 60 s (about 10 generating stages)."""
    storage = tmp_path / "runs"
    reference = str(fitted_model["path"])  # what the default's reference-model task fits
    bandit = {"max_prompt_tokens": 1024, "perturbed_ratio": 0.2}  # + METHOD §1.7's mitigation
    # + METHOD §1.7's analysis of the reference and the trained policy (its first run is the
    # perturbed trajectories' own, so cached)
    first = params(storage, reference=reference, bandit=bandit, reward_hacking=True)
    state = pipeline_flow(first, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    run_id = state.state_details.flow_run_id

    # every stage produced something, in order
    stages = [row["stage"] for row in summary.stages]
    assert stages[0] == "data" and stages[3] == "bandit dataset" and stages[4] == "training"
    assert "test 60" in summary.stages[0]["produced"]
    assert int(summary.stages[3]["produced"].split()[0]) > 0  # bandit rows
    assert summary.stages[4]["produced"] == "2 GRPO steps"
    # the before/after table covers every turn of every difficulty group
    groups = {(r["difficulty"], r["turn"]) for r in summary.before_after}
    assert {("all", 0), ("all", 2), ("seen", 0), ("held_out", 2)} <= groups
    for row in summary.before_after:
        assert row["change_points"] == pytest.approx(row["after_pass@1"] - row["before_pass@1"])
    # the fitted model solves some problems before training (else nothing could be learned)
    assert summary.before_after[0]["before_pass@1"] > 0

    # files in storage: model, checkpoints, curves, the bandit dataset, the summary
    training = next(storage.glob("training/*/MANIFEST.json")).parent
    assert (training / "config.json").exists() and (training / "rewards.png").exists()
    assert (training / "checkpoint-2").is_dir()
    history = json.loads((training / "log_history.json").read_text())
    assert [h["step"] for h in history if "loss" in h] == [1, 2]
    assert next(storage.glob("bandit/*/data.parquet")).stat().st_size > 0
    bandit_stats = json.loads(next(storage.glob("bandit/*/MANIFEST.json")).read_text())["stats"]
    assert bandit_stats["perturbed_contexts"] >= 0
    assert bandit_stats["rows"] == int(summary.stages[3]["produced"].split()[0])
    assert Path(summary.plot.removeprefix("file://")).read_bytes()[:4] == b"\x89PNG"
    names = {run.name for run in child_runs(run_id)}
    assert names == {
        "data",
        "trajectories",
        "trajectories-perturbed",
        "evaluation-before",
        "training",
        "evaluation-after",
        "reward-hacking-reference",
        "reward-hacking-trained",
    }
    keys = {"pipeline-stages", "pipeline-before-after", "pipeline-summary"}
    assert keys | {"pipeline-reward-hacking"} <= artifact_keys(run_id)
    # the reward-hacking analyses: one stage row each, the same judge, their comparison; the
    # reference's inference is the perturbed trajectories the bandit dataset mixed in
    multiturn = {p.parent.name for p in storage.glob("trajectories/multiturn/*/MANIFEST.json")}
    hacking = [row for row in summary.stages if row["stage"].startswith("reward hacking")]
    assert [row["stage"].rsplit(", ", 1)[1] for row in hacking] == ["reference)", "trained)"]
    assert all("turn-level errors in" in row["produced"] for row in hacking)
    assert [r["turn"] for r in summary.reward_hacking] == [1, 2, "all"]
    reference_report = json.loads((Path(hacking[0]["where"]) / "report.json").read_text())
    trained_report = json.loads((Path(hacking[1]["where"]) / "report.json").read_text())
    assert reference_report["judge"] == trained_report["judge"] == Path(reference).name
    assert trained_report["policy_engine"]["model"] != reference_report["policy_engine"]["model"]
    # train, perturbed train (shared with the reference's analysis), test before and after,
    # the trained policy's analysis
    assert len(multiturn) == 5
    assert Path(reference_report["trajectories"]["multiturn"]).name in multiturn

    # one more training step: data, trajectories, evaluation before and the bandit dataset are
    # cache hits; training and the evaluation of the new policy run
    more = params(storage).training.model_copy(update={"max_steps": 3})
    changed = params(storage, reference=reference, bandit=bandit, training=more.model_dump())
    state = pipeline_flow(changed, return_state=True)
    assert state.is_completed(), state.message
    states = all_task_states(state.state_details.flow_run_id)
    ran = {name for name, s in states.items() if s != "Cached"}
    assert ran == {
        "pipeline/reference-model",
        "training/training",
        "evaluation-after/initial",
        "evaluation-after/multiturn",
        "evaluation-after/evaluation",
    }, states
    assert state.result().stages[4]["produced"] == "3 GRPO steps"


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(600)
def test_a_model_that_repairs_nothing_fails_the_run_before_training(tmp_path):
    collect = PipelineParams().collect.model_dump()
    collect["sampling"]["max_new_tokens"] = 12
    p = params(tmp_path / "runs", reference="tiny", train_limit=4, eval_limit=2, collect=collect)
    state = pipeline_flow(p, return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception, match="no repair contexts: of 4 problems") as caught:
        state.result()
    assert "--n" in str(caught.value)  # says what to change
    assert not list((tmp_path / "runs").glob("training/*"))  # nothing trained


def test_cli_rejects_a_missing_reference_before_any_work(tmp_path, capsys):
    storage = tmp_path / "runs"
    assert main(["--reference", str(tmp_path / "nope"), "--storage", str(storage)]) == 2
    err = capsys.readouterr().err
    assert f"--model {tmp_path / 'nope'}: no such directory" in err
    assert not (storage / "datasets").exists()
    assert main(["--max-steps", "0", "--storage", str(storage)]) == 2
    assert "max_steps" in capsys.readouterr().err
    # a GRPO batch that does not split into groups fails here, not after fitting and sampling
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"training": {"overrides": {"num_generations": 3}}}))
    assert main(["--config", str(config), "--storage", str(storage)]) == 2
    assert "divisible by num_generations" in capsys.readouterr().err
    assert not (storage / "datasets").exists()


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--mode {single_turn,cobalt,multi_turn,offline}" in out and "synthetic" in out
    assert "--model NAME" in out and "--preset {tiny,paper}" in out and "--report-to" in out
    assert "--objective {reinforce_loo,awr,clipped_ratio}" in out


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(600)
def test_training_flow_on_its_own(tmp_path, fitted_model, capsys):
    """`python -m flows.training` after a trajectories run: latest trajectories, their model,
    single-turn GRPO; a directory that is not an evaluation stage is refused before any work."""
    from flows.training import main as training_main
    from flows.trajectories import main as trajectories_main

    storage = str(tmp_path / "runs")
    common = ["--storage", storage, "--backend", "namespace", "--sandbox-concurrency", "2"]
    assert training_main(common) == 2
    assert "no trajectories" in capsys.readouterr().err
    code = trajectories_main(
        [
            "--problems",
            "samples/synthetic_train.jsonl:taco",
            "--limit",
            "6",
            "--model",
            str(fitted_model["path"]),
            "--n",
            "4",
            "--turns",
            "1",
            "--max-new-tokens",
            "96",
            "--system-prompt",
            "",  # the fitted model knows no system prompt
            *common,
        ]
    )
    assert code == 0
    capsys.readouterr()
    assert training_main([*common, "--trajectories", storage]) == 2
    assert "not a finished evaluation stage" in capsys.readouterr().err
    args = ["--mode", "single_turn", "--max-steps", "1", "--set", "max_completion_length=64"]
    assert training_main([*common, *args]) == 0
    out = capsys.readouterr().out
    assert "single_turn GRPO, 1 steps" in out
    policy = out.split("policy (--model): ")[1].split()[0]  # the name a later run takes
    assert Path(policy, "config.json").exists() and Path(policy).parent.name == "training"


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(900)
def test_offline_mode_end_to_end(tmp_path, fitted_model, capsys):
    """`python -m flows.pipeline --mode offline` on the embedded default (fewer problems, the
    session's fitted model): the offline dataset replaces the bandit dataset, training generates
    nothing, and the run ends with the before/after table, curves, checkpoints and its cost."""
    storage = tmp_path / "runs"
    argv = ["--mode", "offline", "--reference", str(fitted_model["path"]), "--storage"]
    argv += [str(storage), "--train-limit", "8", "--eval-limit", "6", "--max-steps", "3"]
    argv += ["--eval-samples", "4"]
    assert main([*argv, "--backend", "namespace", "--sandbox-concurrency", "2"]) == 0
    out = capsys.readouterr().out
    # the objective nobody named: the project's default, one constant
    assert f"after 3 offline ({DEFAULT_OBJECTIVE}) steps on" in out
    assert "| offline dataset |" in out and f"| 3 offline steps ({DEFAULT_OBJECTIVE}) |" in out
    assert "| all | 2 |" in out  # the before/after table, to the last evaluation turn

    # the offline dataset: every logged turn of the 8 training problems (n samples, 3 turns)
    manifest = json.loads(next(storage.glob("offline/*/MANIFEST.json")).read_text())
    stats = manifest["stats"]
    n = tiny_collect().sampling.n
    assert stats["problems"] == 8 and 0 < stats["rows"] <= 8 * n * 3
    assert set(stats["rows_by_turn"]) == {"0", "1", "2"}
    assert stats["nonzero_advantage_rows"] > 0
    assert not list(storage.glob("bandit/*"))  # no bandit dataset in this mode

    training = next(storage.glob("training/*/MANIFEST.json")).parent
    policy = json.loads((training / "MANIFEST.json").read_text())
    assert policy["steps"] == 3 and policy["stats"]["mode"] == "offline"
    assert (
        policy["stats"]["rows_trained"]
        + policy["stats"]["dropped_zero_advantage"]
        + (policy["stats"]["dropped_too_long"])
        == stats["rows"]
    )
    cost = policy["stats"]["cost"]
    assert cost["wall_s"] > 0 and (cost["gpus"] == 0) == (cost["gpu_s"] is None)
    assert policy["stats"]["timing"]["generation_s"] == 0  # nothing generated in training
    assert (training / "config.json").exists() and (training / "checkpoint-3").is_dir()
    assert (training / "curves.png").read_bytes()[:4] == b"\x89PNG"
    history = json.loads((training / "log_history.json").read_text())
    steps = [h for h in history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2, 3]
    assert all("weighted_advantage" in h and "advantage" in h for h in steps)
    summary = json.loads(next(storage.glob("pipeline/*/summary.json")).read_text())
    rows = summary["before_after"]
    assert {(r["difficulty"], r["turn"]) for r in rows} >= {("all", 0), ("all", 2)}
    assert summary["stages"][3]["stage"] == "offline dataset"
