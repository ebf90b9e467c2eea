"""The offline dataset as a stage in storage (parquet, MANIFEST.json last, read back with
`datasets`) and its failure paths: no logged turn at all, no row with a nonzero advantage, the
offline mode with perturbed mixing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import cobalt.training.method.offline_rows as offline_data
from cobalt.bandit.dataset import BanditConfig, read_bandit_rows
from cobalt.errors import EmptyStageError
from cobalt.storage import StorageConfig
from cobalt.training.method.offline_rows import offline_data_spec, offline_data_stage, offline_rows
from cobalt.training.settings import TrainingConfig
from cobalt.training.stages import TrainingParams, check_dataset
from cobalt.trajectories.problemsets import ProblemSource
from cobalt.trajectories.runs import Trajectories
from cobalt.trajectories.stages import TrajectoryRef

sys.path.insert(0, str(Path(__file__).parent))
from test_offline import hand_made, problem  # noqa: E402


def trajectories() -> Trajectories:
    def ref(stage: str) -> TrajectoryRef:
        return TrajectoryRef(stage=stage, key=stage, uri=f"/x/{stage}", rows=3, fingerprint=stage)

    return Trajectories(
        evaluation=ref("evaluation"),
        multiturn=ref("multiturn"),
        problems=ProblemSource(
            kind="file", uri="p.jsonl", count=3, fingerprint="f", instructions="i"
        ),
        engine={"kind": "transformers", "model": "/m"},
    )


def test_the_offline_dataset_round_trips_through_storage(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(offline_data, "problem_data", lambda found, storage: hand_made())
    storage = StorageConfig(url=str(tmp_path / "runs"))
    spec = offline_data_spec(trajectories())
    ref = offline_data_stage(spec, storage)
    directory = tmp_path / "runs" / "offline" / spec.key
    assert (directory / "data.parquet").exists() and ref.uri == str(directory)
    manifest = json.loads((directory / "MANIFEST.json").read_text())
    assert manifest["spec"]["key"] == spec.key and manifest["rows"] == ref.rows == 11
    stats = ref.stats
    assert stats["rows_by_turn"] == {"0": 6, "1": 5}
    assert stats["nonzero_advantage_rows"] == 8  # 11 less p/2 turn 0 (2 rows) and p/3 (1)
    assert stats["baseline_groups"] == {"context": 7, "none": 1, "turn": 3}
    back = read_bandit_rows(ref, storage)
    expected = offline_rows(hand_made())
    assert len(back) == len(expected)
    for got, want in zip(back, expected, strict=True):
        assert got["prompt"] == want["prompt"] and got["completion"] == want["completion"]
        assert got["pass_rate"] == want["pass_rate"]  # None (no code block) survives parquet
        assert got["advantage"] == pytest.approx(want["advantage"])
    # finished: a second call reads the manifest and builds nothing
    monkeypatch.setattr(offline_data, "problem_data", lambda *a: pytest.fail("rebuilt"))
    assert offline_data_stage(spec, storage) == ref


def test_the_dataset_reads_back_from_s3_with_the_hub_offline(
    tmp_path, monkeypatch, s3_endpoint, s3_bucket
) -> None:
    """A training job on S3 storage reads its rows under HF_HUB_OFFLINE=1 (an air-gapped
    cluster's setting; `datasets`' own loader refused the s3:// file there)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(offline_data, "problem_data", lambda found, storage: hand_made())
    storage = StorageConfig(url=f"s3://{s3_bucket}/runs", endpoint_url=s3_endpoint)
    ref = offline_data_stage(offline_data_spec(trajectories()), storage)
    back = read_bandit_rows(ref, storage)
    assert ref.uri.startswith("s3://") and len(back) == ref.rows == 11
    assert [r["completion"] for r in back] == [r["completion"] for r in offline_rows(hand_made())]


def test_no_logged_turn_fails_the_stage_and_says_why(tmp_path, monkeypatch) -> None:
    from cobalt.trajectories.records import Turn

    ended = problem("p/9", [[Turn(turn=0, outcome="engine_error", error="down")]], [[0.0]])
    monkeypatch.setattr(offline_data, "problem_data", lambda found, storage: [ended])
    storage = StorageConfig(url=str(tmp_path / "runs"))
    with pytest.raises(EmptyStageError, match=r"offline dataset is empty: .* 1 problems"):
        offline_data_stage(offline_data_spec(trajectories()), storage)
    assert not list((tmp_path / "runs").glob("offline/*/MANIFEST.json"))


def test_nothing_to_learn_stops_before_training(tmp_path, monkeypatch) -> None:
    from cobalt.trajectories.records import Turn

    def no_code(t: int) -> Turn:
        return Turn(turn=t, response="hm", answer="hm", outcome="no_code", feedback="none")

    # a model that writes no program: every reward -1, every advantage 0
    mute = problem("p/1", [[no_code(0), no_code(1)], [no_code(0), no_code(1)]], [[0, 0]] * 2)
    monkeypatch.setattr(offline_data, "problem_data", lambda found, storage: [mute])
    storage = StorageConfig(url=str(tmp_path / "runs"))
    ref = offline_data_stage(offline_data_spec(trajectories()), storage)
    assert ref.rows == 4 and ref.stats["nonzero_advantage_rows"] == 0
    params = TrainingParams(training=TrainingConfig(mode="offline"), storage=storage)
    with pytest.raises(EmptyStageError, match="no row with a nonzero advantage") as caught:
        check_dataset(params, ref)
    assert "--n" in str(caught.value)  # says what to change
    single = TrainingConfig(mode="single_turn")  # the check is the offline mode's own
    check_dataset(params.model_copy(update={"training": single}), ref)


def test_offline_refuses_perturbed_mixing() -> None:
    from pydantic import ValidationError

    from cobalt.pipeline import PipelineParams
    from cobalt.presets import tiny_training

    bandit = BanditConfig(perturbed_ratio=0.2)
    with pytest.raises(ValidationError, match=r"bandit\.perturbed_ratio: the offline mode"):
        TrainingParams(training=TrainingConfig(mode="offline"), bandit=bandit)
    with pytest.raises(ValidationError, match="set it to 0"):
        PipelineParams(training=tiny_training("offline"), bandit=bandit)
    assert PipelineParams(training=tiny_training("offline")).training.mode == "offline"


def test_the_process_count_is_part_of_every_modes_training_key() -> None:
    """Offline training on 2 processes is not read back as the 1-process run (its key used to
    leave the count out, while the step's rows doubled with it)."""
    from types import SimpleNamespace

    from cobalt.bandit.dataset import BanditRef
    from cobalt.training.settings import TrainingConfig
    from cobalt.training.stages import TrainingParams, training_spec

    def key(mode: str, processes: int) -> str:
        params = TrainingParams(training=TrainingConfig(mode=mode, num_processes=processes))
        ready = SimpleNamespace(model_identity="sha256:m", trajectories=None)
        dataset = BanditRef(key="d", uri="/d", rows=1, fingerprint="f")
        return training_spec(params, ready, dataset).key

    for mode in ("offline", "cobalt"):
        assert key(mode, 1) != key(mode, 2)
