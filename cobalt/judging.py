"""How the stages reach the sandbox: `SandboxRuntime` (isolation backend and concurrency: how a
stage judges, never what it computes, so never part of a cache key) and `open_judge`, the one
place a stage opens a judge. Where judging fans out over several hosts, each worker process opens
its own judge here (its own warm pool)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox import Limits, SandboxConfig, SyncJudge


class SandboxRuntime(BaseModel):
    """How programs are judged (not part of any cache key: it does not change results)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the sandbox's own settings, described there once
    backend: Literal["auto", "docker", "namespace"] = Field(
        "auto", description=SandboxConfig.model_fields["backend"].description
    )
    concurrency: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=1024,
        description=SandboxConfig.model_fields["concurrency"].description,
    )

    def config(self, limits: Limits | None = None) -> SandboxConfig:
        return SandboxConfig(
            backend=self.backend, concurrency=self.concurrency, limits=limits or Limits()
        )


def open_judge(runtime: SandboxRuntime, limits: Limits | None = None) -> SyncJudge:
    """A judge with `runtime`'s backend and concurrency and the given per-test limits (use it as
    a context manager: the warm pool starts on enter and stops on exit)."""
    return SyncJudge(runtime.config(limits))
