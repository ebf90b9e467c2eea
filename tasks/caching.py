"""Content-based task caching shared by every flow.

A task's cache key is the hash of its inputs (minus the storage location and runtime knobs),
its own source (`TASK_SOURCE`) and the source of the modules holding its logic (`CodeVersion`):
`TASK_SOURCE` alone only sees the thin `@task` wrapper, so a changed rule in a plain function
would otherwise be served from cache. No run id is involved, so reruns hit the cache.

`bind` points a task's results and cache records at the run's storage and applies `--refresh`.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from typing import Any

from prefect import Task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy

from tasks.storage import Storage

RUNTIME_INPUTS = ("storage", "sandbox")  # where/how a task runs, never what it computes


@cache
def code_version(*names: str) -> str:
    """Hash of the source of modules or functions given by dotted name."""
    digest = hashlib.sha256()
    for name in names:
        try:
            obj: Any = importlib.import_module(name)
        except ModuleNotFoundError:
            module, _, attr = name.rpartition(".")
            obj = getattr(importlib.import_module(module), attr)
        digest.update(inspect.getsource(obj).encode())
    return digest.hexdigest()[:16]


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


def stage_policy(*code: str) -> CachePolicy:
    """The cache policy of a stage task called as `task(key, spec, runtime)`: the stage key (the
    content address: everything that decides the content) and the code; not the spec's other
    fields (an initial stage is shared by runs that differ only in feedback tests) nor the
    runtime (engine endpoint, sandbox, storage)."""
    return INPUTS - "spec" - "runtime" + TASK_SOURCE + CodeVersion(tuple(code))


def from_manifest(manifest: dict[str, Any], model: type[Any]) -> Any:
    """The ref model (`model`) of a finished stage, from the fields of its manifest."""
    return model.model_validate({k: v for k, v in manifest.items() if k in model.model_fields})


def bind(
    task: Task, storage: Storage, refresh: bool = False, expires: timedelta | None = None
) -> Task:
    """The task with results and cache records in `storage`, `--refresh` and an expiry applied."""
    options: dict[str, Any] = {
        "cache_policy": task.cache_policy.configure(key_storage=storage.key_storage()),
        "result_storage": storage.prefect_result_storage,
        "persist_result": True,
    }
    if refresh:
        options["refresh_cache"] = True
    if expires is not None:
        options["cache_expiration"] = expires
    return task.with_options(**options)
