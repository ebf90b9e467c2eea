"""The training-nodes flow's checks before it places any job (flows/training_nodes.py): one
node, local storage (unless declared shared), a per-node deployment the server does not have."""

from __future__ import annotations

import pytest

from cobalt.storage import StorageError
from cobalt.training.decisions import ShardingError
from cobalt.training.settings import TrainingConfig
from cobalt.training.stages import TrainingParams
from flows.training_nodes import (
    MissingDeploymentError,
    check_node_deployment,
    check_nodes,
    node_params,
)

TWO = {"nodes": 2, "rdzv_endpoint": "10.0.0.1:29500"}


def test_one_node_and_local_storage_are_refused_naming_the_fix(tmp_path) -> None:
    with pytest.raises(
        ShardingError, match=r"training\.nodes 1: this flow places one job per node"
    ):
        check_nodes(TrainingParams(training=TrainingConfig()))
    local = TrainingParams(training=TrainingConfig(**TWO), storage={"url": str(tmp_path)})
    with pytest.raises(
        StorageError,
        match=r"needs storage every node shares: pass --storage s3://.*--shared-storage",
    ):
        check_nodes(local)
    mounted = TrainingParams(
        training=TrainingConfig(**TWO), storage={"url": str(tmp_path), "shared": True}
    )
    check_nodes(mounted)  # a directory every node mounts (checked again when training starts)
    shared = TrainingParams(training=TrainingConfig(**TWO), storage={"url": "s3://b/runs"})
    check_nodes(shared)
    ranks = [node_params(shared, r).training.node_rank for r in range(2)]
    assert ranks == [0, 1] and node_params(shared, 1).storage == shared.storage


@pytest.mark.usefixtures("prefect_harness")
def test_a_per_node_deployment_that_is_not_deployed_is_named() -> None:
    with pytest.raises(MissingDeploymentError, match=r"'training/nope' is not deployed on .*prefect "
                       r"deploy -n training-node"):  # fmt: skip
        check_node_deployment("training/nope")


def test_the_pipeline_takes_nodes_and_refuses_local_storage_before_any_work(tmp_path) -> None:
    from flows.pipeline import parse_params, preflight

    argv = ["--model", "tiny", "--nodes", "2", "--rdzv-endpoint", "10.0.0.1:29500"]
    params = parse_params([*argv, "--storage", str(tmp_path / "runs")])
    assert (params.training.nodes, params.training.rdzv_endpoint) == (2, "10.0.0.1:29500")
    with pytest.raises(
        StorageError, match=r"training on 2 nodes needs storage every node shares: pass --storage"
    ):
        preflight(params)
    assert not (tmp_path / "runs" / "datasets").exists()  # nothing ran
    mounted = parse_params([*argv, "--storage", str(tmp_path / "runs"), "--shared-storage"])
    assert mounted.storage.shared and not params.storage.shared


@pytest.mark.usefixtures("prefect_harness")
def test_the_pipeline_on_nodes_needs_the_per_node_deployment_before_any_work(
    s3_endpoint, s3_bucket
) -> None:
    from flows.pipeline import parse_params, preflight

    params = parse_params(["--model", "tiny", "--nodes", "2", "--rdzv-endpoint", "10.0.0.1:29500",
                           "--storage", f"s3://{s3_bucket}/nodes", "--endpoint-url", s3_endpoint])  # fmt: skip
    with pytest.raises(MissingDeploymentError, match=r"'training/training-node' is not deployed"):
        preflight(params)
