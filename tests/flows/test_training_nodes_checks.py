"""The training-nodes flow's checks before it places any job (flows/training_nodes.py): one
node, local storage, a per-node deployment the server does not have."""

from __future__ import annotations

import pytest

from cobalt.storage import StorageError
from cobalt.training.config import TrainingConfig
from cobalt.training.sharding import ShardingError
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
        StorageError, match=r"needs storage every node shares: pass --storage s3://"
    ):
        check_nodes(local)
    shared = TrainingParams(training=TrainingConfig(**TWO), storage={"url": "s3://b/runs"})
    check_nodes(shared)
    ranks = [node_params(shared, r).training.node_rank for r in range(2)]
    assert ranks == [0, 1] and node_params(shared, 1).storage == shared.storage


@pytest.mark.usefixtures("prefect_harness")
def test_a_per_node_deployment_that_is_not_deployed_is_named() -> None:
    with pytest.raises(MissingDeploymentError, match=r"'training/nope' is not deployed on .*prefect "
                       r"deploy -n training-node"):  # fmt: skip
        check_node_deployment("training/nope")
