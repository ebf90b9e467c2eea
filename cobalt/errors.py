"""The error a stage raises when it produces nothing to pass on. Each module raises its own
user-facing error beside it (`StorageError`, `SourceError`, `ProblemSetError`,
`ReferenceModelError`, `engines.MissingAPIKeyError`); the flows' command lines print any of them
without a traceback (flows/cli.py)."""


class EmptyStageError(RuntimeError):
    """A stage produced nothing to pass on; the message says why and what to change."""
