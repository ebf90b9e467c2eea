"""The reward-hacking flow with `--cluster` on a real Dask cluster (scheduler + 2 worker processes
started by the `dask_cluster` fixture, prefect-dask's DaskTaskRunner): the inference and the
judge's shards run on the workers, each worker opening its own judge engine, and the judged
records, errors and report equal those of a run in the flow's own process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from analysis_helpers import lure_problems
from prefect_states import task_run_states

from cobalt.analysis.stages import HackingParams
from flows.reward_hacking import reward_hacking_flow

VOLATILE = {"created_at", "seconds", "wall_s"}  # when and how long: not what was computed


def params(tmp_path: Path, storage: Path, fitted: Path, **overrides: Any) -> HackingParams:
    problems = tmp_path / "lure.jsonl"
    if not problems.exists():
        problems.write_text("".join(p.model_dump_json() + "\n" for p in lure_problems()))
    return HackingParams.model_validate(
        {
            "problems": str(problems),
            "engine": {"kind": "transformers", "model": str(fitted)},
            "judge": {  # the fitted model, loaded by each worker (a config of its own)
                "engine": {"kind": "transformers", "model": str(fitted), "batch_size": 8},
                "sampling": {"n": 1, "temperature": 0.0, "max_new_tokens": 12, "seed": 0},
                "max_attempts": 2,
            },
            "judge_chunk": 1,
            "judge_shard_size": 1,  # a shard per problem with errors
            "sandbox": {"backend": "namespace", "concurrency": 1},
            "storage": {"url": str(storage)},
            **overrides,
        }
    )


def content(path: Path) -> list[Any]:
    """The records of a JSONL, in order, without the fields that say when or how long."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return [strip(json.loads(line)) for line in path.read_text().splitlines()]


def what_workers_did(address: str) -> dict[str, tuple[int, list[str]]]:
    """Worker -> (tasks it executed, models of the engines its process still holds)."""
    from distributed import Client

    def report(dask_worker) -> tuple[int, list[str]]:
        from cobalt.trajectories.stages import _ENGINES

        return dask_worker.state.executed_count, [json.loads(k)["model"] for k in _ENGINES]

    with Client(address, timeout=60) as client:
        return client.run(report)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_judge_fans_out_on_a_cluster_with_the_records_of_a_local_run(
    tmp_path, fitted_model, dask_cluster
):
    """The reward-hacking analysis run here and on a Dask cluster: the same records. Over 60 s: the
    analysis twice, the second on the cluster's worker processes."""
    import torch

    fitted = fitted_model["path"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' setting: same arithmetic, same samples and replies
    try:
        local = reward_hacking_flow(params(tmp_path, tmp_path / "local", fitted))
    finally:
        torch.set_num_threads(threads)

    address = dask_cluster["address"]
    state = reward_hacking_flow(
        params(tmp_path, tmp_path / "cluster", fitted, cluster=address), return_state=True
    )
    assert state.is_completed(), state.message
    remote = state.result()

    shards = sorted(Path(remote.uri).glob("shards/*/MANIFEST.json"))
    assert len(shards) >= 2, remote.line  # the lure set has errors in several problems
    assert remote.judged.key == local.judged.key  # same errors, same judge
    for step in ("errors", "judged"):
        mine, theirs = getattr(remote, step), getattr(local, step)
        name = f"{step}.jsonl"
        assert content(Path(mine.uri) / name) == content(Path(theirs.uri) / name), step
    assert remote.judged.stats == local.judged.stats and remote.judged.rows == len(shards)
    assert (remote.per_turn, remote.categories, remote.agreement) == (
        local.per_turn,
        local.categories,
        local.agreement,
    )

    # the shards ran on the workers, and the stage closed the judge engines they opened there
    done = what_workers_did(address)
    assert sum(executed for executed, _ in done.values()) >= len(shards), done
    assert all(models == [] for _, models in done.values()), done
    states = task_run_states(state.state_details.flow_run_id)
    judge_runs = {n: s for n, s in states.items() if n.startswith(f"judge-{remote.judged.key}-")}
    assert len(judge_runs) == len(shards) and set(judge_runs.values()) == {"Completed"}, states
    assert states[f"judge-merge-{remote.judged.key}"] == "Completed"
