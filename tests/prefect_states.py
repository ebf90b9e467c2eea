"""Task run states of a flow run, read back from the Prefect API (shared by the flow tests)."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId


def task_run_states(flow_run_id: Any) -> dict[str, str]:
    """Task run name -> state name, once every task run of the flow run is final."""
    flow_runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        for attempt in range(50):  # task run states reach the API asynchronously
            runs = client.read_task_runs(flow_run_filter=flow_runs)
            if (runs or attempt >= 5) and all(r.state and r.state.is_final() for r in runs):
                break
            time.sleep(0.2)
    return {r.name: r.state.name for r in runs}
