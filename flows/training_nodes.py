"""Training on several machines from Prefect: one flow run of the `training-node`
deployment per node, each placed on that node's work queue of the GPU pool, meeting at the
rendezvous; this flow waits for all of them and fails as soon as one does.

    prefect deployment run training-nodes/training-nodes --params '{"params": {"storage":
        {"url": "s3://bucket/runs"}, "training": {"preset": "paper", "num_processes": 4,
        "nodes": 2, "rdzv_endpoint": "10.0.0.1:29500"}}}'

Each host runs a worker of the GPU pool on its own queue; node 0's host is the rendezvous
endpoint (docs/DEPLOYMENT.md, "7d. Training on several machines"):

    prefect worker start --pool gpu-pool --work-queue node-0     # on 10.0.0.1
    prefect worker start --pool gpu-pool --work-queue node-1     # on the second host

From a shell, `python -m flows.training_nodes` takes flows.training's options and places the same
run (see --help); the Prefect server it talks to (PREFECT_API_URL) must have the per-node
deployment.

Every node's run is `flows.training` with its own `training.node_rank` (the same parameters
otherwise): node 0 commits the trained policy to the shared storage and writes the run's
summary where this flow reads it back (`summary_uri`: the pipeline's `--nodes` evaluates the
policy it names), the others wait for the commit and end with the same summary. A node's run
that fails, crashes or is cancelled cancels the others (they would otherwise wait at the
rendezvous or in a collective until their timeout); this flow's run stopped (cancelled, Ctrl-C,
SIGTERM) cancels every node's run it placed that is still going.
"""

from __future__ import annotations

import argparse
import sys
import time

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling
from pydantic import BaseModel

from cobalt.errors import UserError
from cobalt.storage import open_storage
from cobalt.training.decisions import ShardingError
from cobalt.training.stages import TrainingParams, TrainingSummary, check_shared_storage
from flows.cli import run_flow_cli
from flows.training import build_parser as training_parser
from flows.training import params_from

NODE_DEPLOYMENT = "training/training-node"
BAD = (StateType.FAILED, StateType.CRASHED, StateType.CANCELLED, StateType.CANCELLING)


class NodeRun(BaseModel):
    """One node's flow run, as this flow last saw it."""

    node_rank: int
    flow_run_id: str
    name: str
    state: str
    message: str | None = None


def node_params(params: TrainingParams, rank: int) -> TrainingParams:
    """The parameters of node `rank`'s run: the same, with its rank."""
    training = params.training.model_copy(update={"node_rank": rank})
    return params.model_copy(update={"training": training})


def check_nodes(params: TrainingParams) -> None:
    """Before any job is placed: several nodes, their rendezvous (checked by TrainingConfig) and
    storage every node shares."""
    if params.training.nodes < 2:
        raise ShardingError(
            f"training.nodes {params.training.nodes}: this flow places one job per node; set "
            "training.nodes to the machines (2 or more), or run the training / "
            "training-multi-gpu deployment on one machine"
        )
    check_shared_storage(params.training, params.storage)


class MissingDeploymentError(UserError):
    """The per-node deployment is not on this Prefect server."""


def check_node_deployment(name: str) -> None:
    """`name` (flow/deployment) is registered on the server this flow talks to: else one line
    saying how to deploy it."""
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise MissingDeploymentError(
                f"node_deployment {name!r} is not deployed on {client.api_url}: run `prefect "
                "deploy -n training-node` (prefect.yaml), or pass the name of your own"
            ) from None


class NodesResult(BaseModel):
    """Every node's run, and the training's summary as node 0 wrote it (its `model` is node 0's
    local directory: `policy.uri`, in the shared storage, names the policy anywhere)."""

    nodes: list[NodeRun]
    summary: TrainingSummary


@flow(name="training-nodes", log_prints=True)
def training_nodes_flow(
    params: TrainingParams,
    node_deployment: str = NODE_DEPLOYMENT,
    queue_prefix: str = "node-",
    poll_s: float = 5.0,
) -> NodesResult:
    """Place node i's training run on the work queue `{queue_prefix}{i}` of `node_deployment`'s
    pool, wait until every run is final; raises RuntimeError naming the first node whose run
    did not complete (the others are cancelled)."""
    check_nodes(params)
    check_node_deployment(node_deployment)
    logger = get_run_logger()
    st = open_storage(params.storage)
    # node 0 writes the summary here (a place of this flow run's own in the shared storage)
    summary_at = st.path("training-nodes", str(flow_run.id), "summary.json")
    params = params.model_copy(update={"summary_uri": summary_at})
    runs = []
    try:
        for rank in range(params.training.nodes):
            run = run_deployment(
                node_deployment,
                parameters={"params": node_params(params, rank).model_dump(mode="json")},
                work_queue_name=f"{queue_prefix}{rank}",
                flow_run_name=f"node-{rank}-of-{params.training.nodes}",
                timeout=0,  # placed, not awaited: the nodes must run at the same time
            )
            runs.append(run.id)
            logger.info("node %d: flow run %s on work queue %s%d", rank, run.id, queue_prefix, rank)
        seen = wait_for_nodes(runs, poll_s)
    except BaseException:  # stopped (Ctrl-C, SIGTERM: a cancelled run) or failed placing a node
        stopped = cancel_nodes(runs, "the run that placed it stopped")
        if stopped:
            logger.warning("cancelled the nodes' runs still going: %s", ", ".join(stopped))
        raise
    failed = next((n for n in seen if n.state in {s.value for s in BAD}), None)
    failed = failed or next((n for n in seen if n.state != StateType.COMPLETED.value), None)
    if failed is not None:
        raise RuntimeError(
            f"node {failed.node_rank}'s training run {failed.name} ended {failed.state}: "
            f"{failed.message or 'see its logs'}; the other nodes' runs were cancelled"
        )
    print(f"training on {len(seen)} nodes completed: " + ", ".join(n.name for n in seen))
    st.fs.invalidate_cache()
    if not st.fs.exists(summary_at):
        raise RuntimeError(
            f"every node's run completed but node 0 wrote no summary at {summary_at}: is the "
            f"{node_deployment} deployment's code older than this flow's? Redeploy it"
        )
    return NodesResult(nodes=seen, summary=TrainingSummary.model_validate(st.read_json(summary_at)))


def wait_for_nodes(run_ids: list, poll_s: float, grace_s: float = 180.0) -> list[NodeRun]:
    """Every node's run once all are final; the first that fails cancels the ones still going
    (a running one through Cancelling: its worker stops it; a queued one at once), and after
    `grace_s` more the states are returned as they are."""
    deadline = None
    with get_client(sync_client=True) as client:
        while True:
            runs = [client.read_flow_run(i) for i in run_ids]
            final = [r.state is not None and r.state.is_final() for r in runs]
            if all(final) or (deadline is not None and time.monotonic() > deadline):
                return [
                    NodeRun(node_rank=rank, flow_run_id=str(r.id), name=r.name,
                            state=r.state.type.value if r.state else "UNKNOWN",
                            message=r.state.message if r.state else None)
                    for rank, r in enumerate(runs)
                ]  # fmt: skip
            if deadline is None and any(r.state and r.state.type in BAD for r in runs):
                deadline = time.monotonic() + grace_s
                cancel(client, [r for r, done in zip(runs, final, strict=True) if not done],
                       "another node failed")  # fmt: skip
            time.sleep(poll_s)


def cancel(client, runs: list, reason: str) -> list[str]:
    """Cancel `runs` (flow runs as the client read them): a running one through Cancelling (its
    worker stops its process), one not started yet at once; the names of those cancelled."""
    for r in runs:
        running = r.state is not None and r.state.type == StateType.RUNNING
        state = Cancelling(message=reason) if running else Cancelled(message=reason)
        client.set_flow_run_state(r.id, state, force=True)
    return [r.name for r in runs]


def cancel_nodes(run_ids: list, reason: str) -> list[str]:
    """Cancel the runs of `run_ids` that are not final yet (the nodes of a coordinating run that
    is stopping: they would otherwise train on, or wait at the rendezvous until its timeout);
    the names of those cancelled. Best effort: an API that does not answer is logged, not
    raised, so the reason the coordinator stopped is the one the user sees."""
    if not run_ids:
        return []
    try:
        with get_client(sync_client=True) as client:
            runs = [client.read_flow_run(i) for i in run_ids]
            going = [r for r in runs if r.state is None or not r.state.is_final()]
            return cancel(client, going, reason)
    except Exception as exc:  # noqa: BLE001 - the original exception is the one to raise
        get_run_logger().error("could not cancel the nodes' runs %s: %s", run_ids, exc)
        return []


# --- CLI ------------------------------------------------------------------------------------------

EPILOG = """\
Places one run of the per-node deployment (--node-deployment, default training/training-node)
per node on the GPU pool's work queues node-0, node-1, ... (--queue-prefix), each flows.training
with its own --node-rank, and waits for them all; a node that fails cancels the others. Needs a
Prefect server with that deployment (PREFECT_API_URL; `prefect deploy -n training-node`), a
worker on each node's queue, --nodes N (2 or more), --rdzv-endpoint (node 0's host:port) and
storage every node reaches (--storage s3://..., or --shared-storage). docs/DEPLOYMENT.md 7d.
The training options are flows.training's (python -m flows.training --help has the details).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = training_parser(prog="python -m flows.training_nodes")
    parser.description = (
        "Train on several machines from Prefect: one run of the per-node training deployment "
        "per node, placed on that node's work queue, waited for together."
    )
    parser.epilog = EPILOG
    parser.add_argument(
        "--node-deployment",
        default=NODE_DEPLOYMENT,
        metavar="FLOW/DEPLOYMENT",
        help=f"the per-node deployment each node's run is placed through ({NODE_DEPLOYMENT})",
    )
    parser.add_argument(
        "--queue-prefix",
        default="node-",
        metavar="PREFIX",
        help="node i's run goes to the work queue PREFIX<i> (node-)",
    )
    return parser


def parse_args(
    argv: list[str] | None = None, *, find_model: bool = False
) -> tuple[TrainingParams, argparse.Namespace]:
    """The training parameters every node's run takes, and the placing flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return params_from(args, parser, find_model=find_model), args


def main(argv: list[str] | None = None) -> int:
    def preflight(parsed: tuple[TrainingParams, argparse.Namespace]) -> None:
        check_nodes(parsed[0])
        check_node_deployment(parsed[1].node_deployment)

    def run(parsed: tuple[TrainingParams, argparse.Namespace]) -> NodesResult:
        params, args = parsed
        return training_nodes_flow(params, args.node_deployment, args.queue_prefix)

    return run_flow_cli(
        lambda: parse_args(argv, find_model=True),
        preflight,
        run,
        lambda r: (
            f"\n{r.summary.line}\n\npolicy (--model): {r.summary.policy.uri}\n"
            + "nodes: "
            + ", ".join(f"{n.name} {n.state}" for n in r.nodes)
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
