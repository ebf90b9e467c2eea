"""What a GRPO run's summary says of its two phases, generation and optimisation: how many
generation batches an --async run overlapped (`overlap_phrase`), and, for a synchronous run with
vLLM colocated, which split of its GPUs between training and a vLLM server of the stage's own
(`--gpus N-K --vllm-server-gpus K --async`) balances the phases it measured (`split_phrase`).

The stage does not pick K before it runs: the balance depends on the responses' lengths, known
once sampled. A synchronous run with vLLM colocated on its N GPUs (every GPU generating, then
every GPU training) measures both phases at its own per-GPU rates; the split whose two sides take
about as long at those rates is what its summary names (a server alone on its GPUs and training
without vLLM's share usually do better than the colocated rates: on 4x H200 at verl's shape the
named 3 + 1 was predicted at 33.2 s a step and measured 30.2 s, docs/RESULTS.md).
"""

from __future__ import annotations

import statistics
from typing import Any


def split_balance(generation_s: float, optimisation_s: float, gpus: int) -> dict[str, Any] | None:
    """For a synchronous step on `gpus` GPUs that all generate (`generation_s`) and all train
    (`optimisation_s`): the K whose sides (generation on K, optimisation on gpus - K) take about
    as long, and their times. None for one GPU or a phase not measured."""
    if gpus < 2 or not generation_s or not optimisation_s:
        return None
    generating, training = generation_s * gpus, optimisation_s * gpus  # GPU-seconds a step

    def sides(k: int) -> tuple[float, float]:
        return generating / k, training / (gpus - k)

    best = min(range(1, gpus), key=lambda k: max(sides(k)))
    generation_k, training_k = sides(best)
    return {
        "vllm_server_gpus": best,
        "training_gpus": gpus - best,
        "generation_s": round(generation_k, 1),
        "optimisation_s": round(training_k, 1),
        "step_s": round(max(generation_k, training_k), 1),
    }


def settled(values: list[float] | None) -> float | None:
    """The median of a run's per-step values after its first step (compile, warm-up)."""
    values = list(values or [])
    values = values[1:] if len(values) > 1 else values
    return statistics.median(values) if values else None


def split_phrase(stats: dict[str, Any]) -> str:
    """'phases balance at --gpus 3 --vllm-server-gpus 1 --async (...); ' for a synchronous GRPO
    run with vLLM colocated on 2+ GPUs of one node (its stats' plan and timing), else ''."""
    plan, timing = stats.get("plan") or {}, stats.get("timing") or {}
    if (
        plan.get("generation") != "vllm_colocate"
        or plan.get("one_step_off")
        or plan.get("server_gpus")
        or plan.get("nodes", 1) != 1
    ):
        return ""
    gpus = int(plan.get("processes") or 0)
    generation = settled(timing.get("generation_step_s"))
    optimisation = settled(timing.get("optimisation_step_s"))
    balance = split_balance(generation or 0, optimisation or 0, gpus)
    step = settled(timing.get("step_s"))
    if balance is None or step is None:
        return ""
    return (
        f"phases balance at --gpus {balance['training_gpus']} --vllm-server-gpus "
        f"{balance['vllm_server_gpus']} --async (generation ~{balance['generation_s']} s beside "
        f"optimisation ~{balance['optimisation_s']} s a step at this run's rates, against "
        f"{step:.1f} s); "
    )


def overlap_phrase(overlap: dict[str, Any] | None) -> str:
    """'one step off: 7 of 8 generation batches overlapped, 7 judged ahead; ' for an --async
    run (the rewards' programs run in the background for the batches judged ahead), else ''."""
    if not overlap:
        return ""
    done = overlap.get("overlapped_batches", 0)
    total = done + overlap.get("fresh_batches", 0)
    judged = overlap.get("prejudged_batches", 0)
    ahead = f", {judged} judged ahead" if judged else ""
    return f"one step off: {done} of {total} generation batches overlapped{ahead}; "
