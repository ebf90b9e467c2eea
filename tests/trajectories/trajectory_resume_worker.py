# ruff: noqa: E402
"""A trajectory run in its own process, for the kill-and-resume test:

    python trajectory_resume_worker.py OUT_DIR N_PROBLEMS DELAY_S

Initial then multi-turn collection of N hand problems, one problem per chunk, with a scripted
LLM that sleeps DELAY_S per call (so a kill lands mid-run), on the real sandbox. Prints the
stats of both stages as one JSON line at the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # the helpers, and the repo's packages

from trajectory_helpers import ScriptedEngine, doubling, repairing_script

from cobalt.trajectories.collect import (
    BatchConfig,
    CollectConfig,
    collect_initial,
    collect_multiturn,
)
from engines import SamplingConfig
from sandbox import SandboxConfig, SyncJudge


def main() -> None:
    out, count, delay = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    problems = [doubling(f"p{i}") for i in range(count)]

    def slow(conversation, sample):
        time.sleep(delay / 4)
        return repairing_script(conversation, sample)

    engine = ScriptedEngine(slow)
    config = CollectConfig(sampling=SamplingConfig(n=2, seed=0), turns=2)
    batch = BatchConfig(chunk_size=1)
    initial, first = collect_initial(problems, engine, config, out / "initial.jsonl", batch)
    with SyncJudge(SandboxConfig(backend="namespace", concurrency=2)) as judge:
        _, second = collect_multiturn(
            problems, initial, engine, judge, config, out / "multiturn.jsonl", batch
        )
    print(json.dumps({"initial": first.as_dict(), "multiturn": second.as_dict()}), flush=True)


if __name__ == "__main__":
    main()
