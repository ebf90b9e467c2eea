"""What a training run costs: wall seconds and, where CUDA is present, GPU seconds, for every mode
(GRPO and offline alike), so modes can be compared at equal data.

`with CostMeter() as cost: train(...)`, then `cost.summary()`:

- `wall_s`: wall seconds of the block (model loading, reference log-probabilities, every step,
  saving);
- `gpus`: the CUDA devices the block could use (a Trainer in one process uses every visible GPU);
- `gpu_s`: wall_s x gpus, the GPU time held by the block: what it costs on a rented machine;
- `gpu_busy_s`: the GPU time actually busy, integrated from NVML's utilization samples (every
  0.2 s, `torch.cuda.utilization`, summed over the devices) when NVML can be read, else None;
- `gpu_peak_memory_gib`: torch's peak allocated memory on device 0 of this process (with vLLM
  colocated in it, its memory pool counts whole even while asleep: the figure can exceed the
  card);
- `gpu_peak_used_gib`: the most memory any one device held, from NVML's samples (every process
  on it, launched training processes included: what nvidia-smi shows), or None without NVML.

On a machine without CUDA the GPU fields are None. Plain Python, no Prefect.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from engines import visible_gpus

SAMPLE_S = 0.2


class CostMeter:
    """Wall and GPU seconds of a block; see the module docstring."""

    def __init__(self, sample_s: float = SAMPLE_S):
        self.sample_s = sample_s
        self.wall_s = 0.0
        self.gpus = 0
        self.busy_s: float | None = None
        self.peak_bytes: int | None = None
        self.peak_used_bytes: int | None = None
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CostMeter:
        import torch

        self.gpus = visible_gpus()
        if self.gpus:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(0)
            if _utilization(torch, 0) is not None:
                self.busy_s = 0.0
                self._thread = threading.Thread(target=self._sample, daemon=True)
                self._thread.start()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.gpus:
            torch.cuda.synchronize()
            self.peak_bytes = int(torch.cuda.max_memory_allocated(0))
        self.wall_s = time.perf_counter() - self._started
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _sample(self) -> None:
        import torch

        last = time.perf_counter()
        while not self._stop.wait(self.sample_s):
            now = time.perf_counter()
            used = [_utilization(torch, d) for d in range(self.gpus)]
            self.busy_s = (self.busy_s or 0.0) + sum(u or 0 for u in used) / 100 * (now - last)
            last = now
            held = [b for b in (_memory_used(torch, d) for d in range(self.gpus)) if b is not None]
            if held:
                self.peak_used_bytes = max(self.peak_used_bytes or 0, *held)

    def summary(self) -> dict[str, Any]:
        gpu = self.gpus > 0
        return {
            "wall_s": round(self.wall_s, 3),
            "gpus": self.gpus,
            "gpu_s": round(self.wall_s * self.gpus, 3) if gpu else None,
            "gpu_busy_s": None if self.busy_s is None else round(self.busy_s, 3),
            "gpu_peak_memory_gib": None
            if self.peak_bytes is None
            else round(self.peak_bytes / 2**30, 3),
            "gpu_peak_used_gib": None
            if self.peak_used_bytes is None
            else round(self.peak_used_bytes / 2**30, 3),
        }


def _utilization(torch: Any, device: int) -> int | None:
    """NVML's GPU utilization (%) of one device, or None when NVML cannot be read."""
    try:
        return int(torch.cuda.utilization(device))
    except Exception:  # no pynvml / no NVML library / not permitted
        return None


def _memory_used(torch: Any, device: int) -> int | None:
    """NVML's memory in use on one device (bytes, every process), or None when it cannot be read."""
    try:
        return int(torch.cuda.device_memory_used(device))
    except Exception:  # no NVML library / not permitted / an older torch
        return None
