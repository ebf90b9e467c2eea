"""Where fanned-out tasks run: in the flow's own process, one after another (the default), or on
a Dask cluster through prefect-dask's `DaskTaskRunner`, so each task runs on a worker process
that may live on another host. Prefect tracks every task run either way; Dask reschedules the
task of a worker that dies, and the task resumes from what it had committed (docs/SCALING.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from prefect import Task
from prefect.task_runners import TaskRunner

log = logging.getLogger(__name__)


@contextmanager
def task_runner(cluster: str | None) -> Iterator[TaskRunner | None]:
    """None without a cluster; else a started DaskTaskRunner: 'local:N' starts N single-threaded
    worker processes on this machine, not daemonic (`WORKER_DAEMON`), reporting to this
    process's Prefect API; any other value is a scheduler address."""
    if not cluster:
        yield None
        return
    import dask
    from prefect_dask import DaskTaskRunner

    if cluster.startswith("local:"):
        workers = int(cluster.removeprefix("local:"))
        kwargs: dict[str, Any] = {"n_workers": workers, "threads_per_worker": 1, "processes": True}
        if (api := _temporary_api_url()) is not None:
            kwargs["env"] = {"PREFECT_API_URL": api}  # else each worker starts its own server
        runner = DaskTaskRunner(cluster_kwargs=kwargs)
    else:
        runner = DaskTaskRunner(address=cluster)
    with dask.config.set(WORKER_DAEMON), runner:
        yield runner


def _temporary_api_url() -> str | None:
    """The API of the temporary server this process started (no PREFECT_API_URL set), else
    None: local workers given it report their task runs to it instead of each starting one."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    return str(get_client(sync_client=True).api_url)


# Dask's nanny starts worker processes daemonic by default, and a daemonic process may not start
# child processes: vLLM's in-process engine starts its engine core as one, so a GPU worker must
# not be daemonic (`dask worker` on other hosts: DASK_DISTRIBUTED__WORKER__DAEMON=False).
WORKER_DAEMON = {"distributed.worker.daemon": False}


def on_every_worker(runner: TaskRunner | None, fn: Callable[[], Any]) -> dict[str, Any]:
    """`fn()` in every worker process of the cluster (nothing without one), each worker's result
    by its address; a worker whose call fails is left out, and a cluster that cannot be reached
    is logged (a stage that finished stays finished). For what a stage
    leaves in its workers' processes: an engine that would keep a node's GPUs after the stage
    (`close_engines`), when the next stage (training) wants them."""
    if runner is None:
        return {}
    try:
        return runner.client.run(fn, on_error="ignore")
    except Exception as exc:  # cleanup: a stage that finished stays finished
        log.warning("%s on the cluster's workers: %s", fn.__name__, exc)
        return {}


def run_all(
    task: Task,
    calls: Sequence[dict[str, Any]],
    runner: TaskRunner | None,
    catch: tuple[type[Exception], ...] = (),
) -> list:
    """`task(**call)` for every call: in order here, or all submitted to the cluster at once;
    the results in the order of `calls`. A call that fails with an exception of a `catch` type
    has the exception as its result, and the other calls still run."""

    def outcome(get: Callable[[], Any]) -> Any:
        try:
            return get()
        except catch as exc:
            return exc

    if runner is None:
        return [outcome(lambda call=call: task(**call)) for call in calls]
    futures = [runner.submit(task, call) for call in calls]
    return [outcome(future.result) for future in futures]
