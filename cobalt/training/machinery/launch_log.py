"""What a failed training launch's output says, as the first line of its error: the nodes that
never met at the rendezvous, a collective that timed out, the process that failed first (not the
ones that died of it), else the last Python error. Plain Python, no Prefect."""

from __future__ import annotations

import re
from pathlib import Path

from cobalt.training.machinery.plan import TrainingPlan


def why_it_failed(output: str, plan: TrainingPlan, timeout_s: int, log_path: Path) -> str:
    """The first line a user reads for a failed launch whose output (every process's) is
    `output`, written to `log_path`; `timeout_s` the collectives' wait."""
    return (
        rendezvous_failed(output, plan)
        or timed_out(output, timeout_s, log_path)
        or first_failure(output, log_path)
        or last_error(output[-4000:])
    )


# a collective that outlived `ddp_timeout`: NCCL's watchdog, gloo's transport, torch's own
_TIMEOUTS = (
    re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(.*?OpType=(\w+)"),
    re.compile(r"Timed out waiting \d+ms for (\w+) operation"),
    re.compile(r"(\w+)\S* timed out after \d+"),
)


def rendezvous_failed(output: str, plan: TrainingPlan) -> str | None:
    """A clear first line when the nodes never met: node 0 waited for nodes that did not join,
    or a node could not reach node 0's endpoint."""
    if plan.nodes == 1:
        return None
    waited = re.search(r"waiting for clients\. (\d+)/(\d+) clients joined", output)
    if waited:
        return (
            f"only {waited.group(1)} of {waited.group(2)} nodes joined at the rendezvous "
            f"{plan.rdzv_endpoint} within {plan.rendezvous_timeout_s} s: start the same job on "
            f"every node (--node-rank 0 to {plan.nodes - 1}, the same --rdzv-endpoint), or raise "
            "training.rendezvous_timeout_s"
        )
    if "trying to connect to" in output or "failed to connect" in output:
        return (
            f"node {plan.node_rank} could not reach the rendezvous {plan.rdzv_endpoint} within "
            f"{plan.rendezvous_timeout_s} s: start node 0 (--node-rank 0) with the same "
            "--rdzv-endpoint, and check that this machine reaches that host and port"
        )
    return None


def timed_out(output: str, timeout_s: int, log_path: Path) -> str | None:
    """A clear first line when a process gave up waiting for another in a collective."""
    for pattern in _TIMEOUTS:
        found = pattern.search(output)
        if found:
            return (
                f"a training process waited {timeout_s} s in a collective ({found.group(1)}) for "
                "another process that never joined it: one process hung or died (each "
                f"process's output: {log_path}); training.collective_timeout_s sets the wait"
            )
    return None


# torch's elastic agent names the process that failed first; each process's traceback lines
# carry its rank once the process group exists
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S
)
_ERROR = r"(?:[\w.]+\.)?(\w*(?:Error|Exception): .+)$"


def first_failure(output: str, log_path: Path) -> str | None:
    """The error of the process that failed first, not of one that died of it: when a process
    dies, the others' collectives fail too ("Connection closed by peer") and their tracebacks
    come last in the log. None when the launcher named no first failure."""
    found = _ROOT_CAUSE.search(output)
    if not found:
        return None
    rank, code = found.groups()
    own = re.findall(rf"^\[rank{rank}\]: {_ERROR}", output, re.MULTILINE)
    # lines without a rank prefix cannot be told apart; other ranks' are the consequences
    plain = re.findall(rf"^{_ERROR}", output, re.MULTILINE)
    if own or plain:
        return f"{(own or plain)[-1]} (process {rank} failed first)"
    return (
        f"process {rank} failed first (exit code {code}) without a Python error in the output; "
        f"each process's output: {log_path}"
    )


def last_error(output: str) -> str:
    """The last `SomeError: message` line of a traceback in the output (first in the message, so
    a clear error such as the memory plan's is the line a user reads), or a pointer to the log."""
    found = re.findall(
        r"^(?:\[rank\d+\]: )?(?:[\w.]+\.)?(\w*(?:Error|Exception): .+)$", output, re.MULTILINE
    )
    return found[-1] if found else "see the output below"
