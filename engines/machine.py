"""The machine a run plans for: its visible GPUs (the smallest one's memory: what every process
plans against), host memory and cores. Read once, at a flow's preflight and where a stage runs.
Reading it opens no CUDA context (device properties only)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class Machine:
    gpus: int  # visible to this process (CUDA_VISIBLE_DEVICES applies)
    gpu_bytes: int  # the smallest visible GPU's memory (0 without GPUs)
    gpu_name: str
    host_bytes: int  # host memory available now (MemAvailable)
    cpus: int
    gpu_capability: tuple[int, int] = (0, 0)  # the lowest visible GPU's compute capability

    def describe(self) -> str:
        gpus = (
            f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} ({self.gpu_name}, "
            f"{self.gpu_bytes / GIB:.0f} GiB{' each' if self.gpus > 1 else ''})"
            if self.gpus
            else "no GPU"
        )
        return f"{gpus}, {self.host_bytes / GIB:.0f} GiB of host memory free, {self.cpus} cores"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def visible_gpus() -> int:
    """The GPU count, decided here for every layer: the GPUs this process can use
    (CUDA_VISIBLE_DEVICES applies); 0 without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def detect() -> Machine:
    """This machine as the current process sees it."""
    gpus, smallest, name, capability = 0, 0, "", (0, 0)
    try:
        import torch

        gpus = visible_gpus()
        if gpus:
            props = [torch.cuda.get_device_properties(i) for i in range(gpus)]
            smallest = min(p.total_memory for p in props)
            name = props[0].name
            capability = min((p.major, p.minor) for p in props)
    except ImportError:
        pass
    return Machine(gpus, smallest, name, host_available_bytes(), os.cpu_count() or 1, capability)


def host_available_bytes() -> int:
    """MemAvailable of /proc/meminfo (Linux), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
