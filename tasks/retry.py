"""When Prefect retries a task: not after an error the user can fix (`cobalt.errors.UserError`,
unless transient), which the same input raises again; a retry then only doubles the log and the
wait before the one line that says what to change."""

from __future__ import annotations

from typing import Any

from cobalt.errors import user_error


def transient(task: Any, task_run: Any, state: Any) -> bool:
    """`retry_condition_fn` of the tasks that retry: True unless the failure is a user error
    (a transient one excepted)."""
    found = user_error(state.data if isinstance(state.data, BaseException) else None)
    return found is None or getattr(found, "transient", False)
