"""In a `--cluster local:1` Dask worker, start the vLLM engine the trajectory stage starts, with
vLLM's engine core forked (its default) or spawned (the engine's setting): which one starts?

    python scripts/gpu/worker_fork_check.py /root/tiny-random fork spawn
"""

from __future__ import annotations

import sys


def start(model: str, method: str) -> str:
    import os

    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = method
    import torch

    from engines import EngineConfig, make_engine

    before = torch.cuda.is_initialized()
    try:
        engine = make_engine(EngineConfig(kind="vllm", model=model, gpu_memory_utilization=0.3))
        engine.close()
        outcome = "started"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {str(exc)[:160]}"
    return f"{method}: CUDA initialised before {before}; {outcome}"


if __name__ == "__main__":
    sys.path.insert(0, ".")
    from tasks.cluster import on_every_worker, task_runner

    model, *methods = sys.argv[1:]
    for method in methods:
        with task_runner("local:1") as runner:
            print(*on_every_worker(runner, lambda m=method: start(model, m)).values(), flush=True)
