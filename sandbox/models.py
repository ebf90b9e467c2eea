"""Typed contracts of the sandbox: what goes in (tests, limits, requests) and what comes out."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_IMAGE = "cobalt-sandbox:bookworm"

TestStatus = Literal[
    "passed",  # output matched and the process exited 0
    "wrong_answer",  # exited 0, output differs
    "runtime_error",  # non-zero exit, uncaught exception or killed by a signal
    "timeout",  # wall or CPU time over the per-test limit (or the suite's deadline)
    "memory_limit",  # MemoryError or killed by the memory limit
    "output_limit",  # printed more than `output_bytes`
    "syntax_error",  # the program does not compile: every test fails
    "skipped",  # not run: the suite's time was up, or fail_fast stopped after a failure
    "sandbox_error",  # the sandbox itself failed (the worker was replaced); never a pass
]
VerdictStatus = Literal["accepted", "invalid_request"] | TestStatus


class Limits(BaseModel):
    """Resource limits for one program. Defaults follow the paper's evaluator (METHOD §1.5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(4.0, gt=0, le=600, description="Wall and CPU seconds per test.")
    suite_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds for all tests of a program; later tests fail."
    )
    memory_mb: int = Field(
        1024,
        ge=64,
        le=65536,
        description="Address space per test process; with the scratch dir and the runner's "
        "share (`worker_memory_mb`), the memory of the whole sandbox.",
    )
    max_processes: int = Field(
        32, ge=1, le=4096, description="Processes and threads a test may have at once."
    )
    output_bytes: int = Field(
        8 << 20, ge=1024, le=1 << 30, description="Bytes of stdout read; more is a failure."
    )
    scratch_mb: int = Field(64, ge=1, le=4096, description="Size of the writable /tmp scratch.")

    @property
    def worker_memory_mb(self) -> int:
        """What one sandbox worker may hold in all (its cgroup's limit, no swap): a test's
        processes, its scratch files, the runner."""
        return self.memory_mb + self.scratch_mb + 128

    def for_runner(self) -> dict:
        return {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "output_bytes": self.output_bytes,
        }


class SandboxConfig(BaseModel):
    """How programs are isolated and how many run at once."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["auto", "docker", "namespace"] = Field(
        "auto", description="docker where an engine is reachable, else namespace; or force one."
    )
    concurrency: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=1024,
        description="Programs judged at once (one sandbox worker each).",
    )
    image: str = Field(
        default_factory=lambda: os.environ.get("COBALT_SANDBOX_IMAGE", DEFAULT_IMAGE),
        description="Docker image with python3 (env COBALT_SANDBOX_IMAGE).",
    )
    cpus_per_worker: float = Field(1.0, gt=0, le=64, description="CPU quota of a Docker worker.")
    pin_cpus: bool = Field(
        True,
        description="Keep each worker, and its tests, on one CPU (see sandbox/backends/cpus.py); "
        "not with cpus_per_worker > 1.",
    )
    recycle_after: int = Field(
        500, ge=1, description="Replace a worker after this many programs, even if healthy."
    )
    limits: Limits = Field(default_factory=Limits)
    use_server: bool = Field(
        True,
        description="Judge through a running `python -m sandbox serve` when one answers (its warm "
        "workers, its concurrency); else, or when it goes away, with workers of our own.",
    )
    server: str | None = Field(
        None,
        description="The server's address (unix:/path); default: env COBALT_SANDBOX_SOCKET "
        "('off': none), else a per-user socket (sandbox.transport.default_address).",
    )


class TestSuite(BaseModel):
    """Tests of one problem. Call-based when `fn_name` is set: each input holds one JSON value per
    line (one per argument) and each output one JSON value."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None

    @model_validator(mode="after")
    def _same_length(self) -> TestSuite:
        if len(self.inputs) != len(self.outputs):
            raise ValueError(
                f"tests.inputs has {len(self.inputs)} items but tests.outputs has "
                f"{len(self.outputs)}: give one expected output per input"
            )
        if self.fn_name is not None and not self.fn_name.isidentifier():
            raise ValueError(f"tests.fn_name {self.fn_name!r} is not a Python identifier")
        return self


class JudgeRequest(BaseModel):
    """One program to judge against one test suite."""

    model_config = ConfigDict(extra="forbid")

    id: str
    code: str = Field(max_length=1 << 20)
    tests: TestSuite


class Verdict(BaseModel):
    """The judgement of one program: the `python -m sandbox judge` output row (a stable contract)."""

    id: str
    passed: list[bool]
    pass_rate: float
    status: VerdictStatus
    feedback: list[str] = Field(
        description="Per test: '' if it passed, else a report for the model."
    )
    seconds: float
    outcomes: list[TestStatus] = Field(default_factory=list, description="Per test status.")
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"
