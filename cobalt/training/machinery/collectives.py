"""What a training process puts through torch.distributed's collectives, step by step: the
traffic a step sends between GPUs, and across nodes' links, measured rather than modelled.

torch's flight recorder keeps the last N collectives of every process group (NCCL and gloo: the
FSDP gathers and reduce-scatters, DDP's gradient all-reduce, the weight sync's gathers), with
their tensors' sizes and dtypes. It is on when `TORCH_FR_BUFFER_SIZE` (torch >= 2.13;
`TORCH_NCCL_TRACE_BUFFER_SIZE` before) is a number of entries above what one step enqueues (an
8B model under FSDP at verl's shape: a few thousand; 20000 is ample). `CollectiveMeter.read()`
returns what was recorded since its last call: each collective's size is its whole tensor (an
all-gather's output, a reduce-scatter's input, an all-reduce's or broadcast's tensor), summed by
collective in GB, with `complete` False when the recorder's ring dropped entries between two
reads (a larger buffer is needed). Off (None) without the variable or outside a process group.
Plain Python, no Prefect.
"""

from __future__ import annotations

import math
import os
import pickle
from collections import defaultdict
from typing import Any

BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMPS = ("_dump_fr_trace", "_dump_nccl_trace")  # one recorder a backend kind, as torch has them
DTYPE_BYTES = {
    "Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}  # fmt: skip


def recording() -> bool:
    """Whether the flight recorder is on in this process and a process group exists."""
    import torch.distributed as dist

    on = any(os.environ.get(v, "0").strip() not in ("", "0") for v in BUFFER_VARIABLES)
    return on and dist.is_available() and dist.is_initialized()


def entry_bytes(entry: dict[str, Any]) -> int:
    """One recorded collective's size: the larger of its input and output tensors."""

    def size(shapes: list[list[int]], dtypes: list[str]) -> int:
        return sum(
            math.prod(s) * DTYPE_BYTES.get(d, 4) for s, d in zip(shapes, dtypes, strict=False)
        )

    inputs = size(entry.get("input_sizes") or [], entry.get("input_dtypes") or [])
    outputs = size(entry.get("output_sizes") or [], entry.get("output_dtypes") or [])
    return max(inputs, outputs)


class CollectiveMeter:
    """The collectives recorded since the last `read()`; see the module docstring."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # recorder -> last record id read

    def read(self) -> dict[str, Any] | None:
        if not recording():
            return None
        import torch._C._distributed_c10d as c10d

        moved: dict[str, int] = defaultdict(int)  # bytes
        calls: dict[str, int] = defaultdict(int)
        complete = True
        seen: set[tuple[Any, ...]] = set()  # where both dumps read one recorder: counted once
        for name in DUMPS:
            dump = getattr(c10d, name, None)
            if dump is None:
                continue
            try:
                entries = pickle.loads(dump(includeStackTraces=False))["entries"]
            except Exception:  # no recorder of this kind in this process
                continue
            last = self._last.get(name, -1)
            new = [e for e in entries if e["record_id"] > last]
            if new:
                complete &= new[0]["record_id"] == last + 1
                self._last[name] = new[-1]["record_id"]
            for entry in new:
                key = (entry.get("pg_id"), entry["record_id"], entry.get("time_created_ns"))
                if entry.get("is_p2p") or key in seen:
                    continue
                seen.add(key)
                op = str(entry.get("profiling_name", "?")).split(":")[-1]
                moved[op] += entry_bytes(entry)
                calls[op] += 1
        gb = {op: size / 1e9 for op, size in moved.items()}
        return {"gb": gb, "calls": dict(calls), "complete": complete}
