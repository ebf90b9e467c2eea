"""Content-based task caching shared by every flow.

A task's cache key is the hash of its inputs (minus the storage location and runtime knobs),
its own source (`TASK_SOURCE`) and the source of the library modules holding its logic
(`CodeVersion`, through `cobalt.storage.code_version`):
`TASK_SOURCE` alone only sees the thin `@task` wrapper, so a changed rule in a plain function
would otherwise be served from cache. No run id is involved, so reruns hit the cache.

`bind` points a task's results and cache records at the run's storage and applies `--refresh`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from prefect import Task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy

from cobalt.storage import Storage, code_version
from tasks.storage import key_storage, result_storage

RUNTIME_INPUTS = ("storage", "sandbox")  # where/how a task runs, never what it computes


@dataclass
class CodeVersion(CachePolicy):
    """Cache key part: the source of the modules/functions a task's logic lives in."""

    names: tuple[str, ...] = field(default_factory=tuple)

    def compute_key(self, task_ctx: Any, inputs: Any, flow_parameters: Any, **kwargs: Any) -> str:
        return code_version(*self.names)


def content_policy(*code: str) -> CachePolicy:
    """INPUTS (without runtime inputs) + TASK_SOURCE + CodeVersion(code)."""
    policy = INPUTS
    for name in RUNTIME_INPUTS:
        policy = policy - name
    return policy + TASK_SOURCE + CodeVersion(tuple(code))


def stage_policy(*code: str, ignore: tuple[str, ...] = ()) -> CachePolicy:
    """The cache policy of a stage task called as `task(key, spec, runtime)`: the stage key (the
    content address: everything that decides the content) and the code; not the spec's other
    fields (an initial stage is shared by runs that differ only in feedback tests) nor the
    runtime (engine endpoint, sandbox, storage), nor the inputs named in `ignore` (what the key
    already decides)."""
    policy = INPUTS - "spec" - "runtime"
    for name in ignore:
        policy = policy - name
    return policy + TASK_SOURCE + CodeVersion(tuple(code))


def bind(
    task: Task, storage: Storage, refresh: bool = False, expires: timedelta | None = None
) -> Task:
    """The task with results and cache records in `storage`, `--refresh` and an expiry applied."""
    options: dict[str, Any] = {
        "cache_policy": task.cache_policy.configure(key_storage=key_storage(storage)),
        "result_storage": result_storage(storage),
        "persist_result": True,
    }
    if refresh:
        options["refresh_cache"] = True
    if expires is not None:
        options["cache_expiration"] = expires
    return task.with_options(**options)
