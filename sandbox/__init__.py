"""Safe, fast execution of untrusted Python programs against tests.

A library of its own (no Prefect here): `Judge` (async) and `SyncJudge` judge `JudgeRequest`s and
return `Verdict`s; `python -m sandbox judge` does the same over JSONL files, and
`python -m sandbox serve` keeps workers warm for all of them (docs/SANDBOX.md).
"""

from sandbox.judge import Judge, SyncJudge
from sandbox.models import JudgeRequest, Limits, SandboxConfig, TestSuite, Verdict
from sandbox.pool import SandboxUnavailable

__all__ = [
    "Judge",
    "JudgeRequest",
    "Limits",
    "SandboxConfig",
    "SandboxUnavailable",
    "SyncJudge",
    "TestSuite",
    "Verdict",
]
