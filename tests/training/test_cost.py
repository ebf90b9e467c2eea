"""What a run costs (cobalt.training.reporting.cost): the GPU fields come from NVML's samples. NVML
itself needs a GPU; here torch.cuda's readers are replaced by scripted ones, so the sampling and the
summary are what is tested."""

from __future__ import annotations

import itertools
import time

import torch

from cobalt.training.reporting.cost import CostMeter

GIB = 2**30


def test_the_peak_memory_is_what_the_devices_held_not_torchs_counter(monkeypatch) -> None:
    """torch's counter of this process (a colocated vLLM's pool included) read 157 GiB on a
    141 GiB H200; the devices' own figure is sampled beside it, the most any device held."""
    held = itertools.cycle([(10 * GIB, 20 * GIB), (30 * GIB, 5 * GIB)])
    current = {"pair": next(held)}

    def memory_used(device: int) -> int:
        if device == 1:
            current["pair"] = next(held)
        return current["pair"][device]

    cuda = torch.cuda
    for name, value in {
        "is_available": lambda: True, "device_count": lambda: 2, "synchronize": lambda: None,
        "reset_peak_memory_stats": lambda device=None: None,
        "max_memory_allocated": lambda device=None: 157 * GIB,
        "utilization": lambda device=None: 50, "device_memory_used": memory_used,
    }.items():  # fmt: skip
        monkeypatch.setattr(cuda, name, value)
    with CostMeter(sample_s=0.005) as cost:
        time.sleep(0.2)
    summary = cost.summary()
    assert summary["gpus"] == 2 and summary["gpu_peak_memory_gib"] == 157
    assert summary["gpu_peak_used_gib"] == 30  # device 0 at its most
    assert summary["gpu_busy_s"] > 0


def test_without_nvml_the_device_figures_are_none(monkeypatch) -> None:
    def unreadable(device=None):
        raise RuntimeError("NVML not found")

    cuda = torch.cuda
    for name, value in {
        "is_available": lambda: True, "device_count": lambda: 1, "synchronize": lambda: None,
        "reset_peak_memory_stats": lambda device=None: None,
        "max_memory_allocated": lambda device=None: GIB, "utilization": unreadable,
        "device_memory_used": unreadable,
    }.items():  # fmt: skip
        monkeypatch.setattr(cuda, name, value)
    with CostMeter(sample_s=0.005) as cost:
        time.sleep(0.05)
    summary = cost.summary()
    assert summary["gpu_peak_used_gib"] is None and summary["gpu_busy_s"] is None
    assert summary["gpu_peak_memory_gib"] == 1
