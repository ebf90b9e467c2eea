"""How many threads torch's CPU work uses: one place decides, for every process of a run.

torch's default is one thread per core the process may use. The embedded default's models have
about 1M parameters: their matrix products are far too small to share among dozens of threads,
and on a 64-core GPU host the reference fit spent 6 min 9 s with torch's 64 threads against
about 1 min 50 s with 2; several runs side by side each took every core. So CPU work
on tiny models takes at most `CAP` threads, whatever the host:

    threads = COBALT_THREADS, else OMP_NUM_THREADS, else min(CAP, cores this process may use)

(cores from `os.sched_getaffinity`, so `taskset` and a container's CPU set count). An explicit
setting is used as given; the cap only ever lowers torch's count (a caller's own
`torch.set_num_threads(1)` stays). `cap_cpu_threads()` applies it: the reference fit, the
transformers engine on CPU and the training processes call it as they start (docs/PIPELINE.md,
"Embedded default"; measured: docs/RESULTS.md, the fitted reference model).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

CAP = 4  # threads for tiny-model CPU work unless set (docs/RESULTS.md, the fitted reference model)
ENV = "COBALT_THREADS"
EXPLICIT = (ENV, "OMP_NUM_THREADS")  # the first set wins


class ThreadSettingError(ValueError):
    """COBALT_THREADS / OMP_NUM_THREADS is not a whole number >= 1; the message names it."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def decide_threads(
    env: Mapping[str, str] | None = None, cores: int | None = None
) -> tuple[int, str]:
    """(threads, why): the explicit setting if one is set, else min(CAP, cores)."""
    env = os.environ if env is None else env
    for name in EXPLICIT:
        value = env.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ThreadSettingError(
                f"{name}={value!r}: give a whole number of CPU threads >= 1, or unset it "
                f"(default: min({CAP}, the cores this process may use))"
            )
        return int(value), name
    cores = usable_cores() if cores is None else cores
    return max(1, min(CAP, cores)), f"cap {CAP} of {cores} cores"


def cap_cpu_threads() -> int:
    """Set torch's CPU threads in this process by `decide_threads`; returns the count in use.
    Without an explicit setting it only lowers torch's count, never raises it."""
    import torch

    threads, why = decide_threads()
    current = torch.get_num_threads()
    if why not in EXPLICIT:
        threads = min(threads, current)
    if threads != current:
        torch.set_num_threads(threads)
        log.info("torch CPU threads: %d (%s; was %d)", threads, why, current)
    return threads
