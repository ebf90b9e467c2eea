"""Errors a user can fix. `UserError` is the base of every error whose message says what is wrong,
where (a file and line, a field, a flag) and the fix. The flows' command lines print one as a
single line and exit 2, wherever in a run it is raised (flows/cli.py), and Prefect does not retry
a task that raised one unless it is `transient`: the same input fails the same way
(tasks/retry.py). Each module raises its own beside it (`StorageError`, `SourceError`,
`ProblemSetError`, `ModelNameError`, `JudgeError`, `EmptyStageError` below); the engines'
`MissingAPIKeyError`, `InsufficientMemoryError`, `GPUCountError`, `MissingClientError` and
`ThreadSettingError` (a layer below: no base of ours) count too: `USER_ERRORS`."""

from __future__ import annotations

from engines import (
    GPUCountError,
    InsufficientMemoryError,
    MissingAPIKeyError,
    ThreadSettingError,
)
from engines.plan import MissingClientError


class UserError(RuntimeError):
    """An error the user can fix; the message says what, where and how. `transient`: another
    try may clear it (an endpoint that was down), so a task that raised it is retried."""

    transient = False


class EmptyStageError(UserError):
    """A stage produced nothing to pass on; the message says why and what to change."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    MissingAPIKeyError,
    InsufficientMemoryError,
    GPUCountError,
    MissingClientError,
    ThreadSettingError,
)


def user_error(exc: BaseException | None) -> BaseException | None:
    """`exc` if it is a user error, else the first one it was raised from or during (a task's
    error can reach the flow chained to another); None when there is none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, USER_ERRORS):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
