"""The pipeline's GPU plan: one decision, at the preflight, for every stage of a run on
this machine, printed with the settings.

- The generating stages (trajectories, both evaluations, the reward-hacking analysis) share the
  run's engine: `engines.plan` decides its kind for the reference model (auto: the transformers
  engine for a tiny model, on one GPU; vLLM on `--gpus N` GPUs for a real one, served and reached
  through LiteLLM when N > 1) and the clients it needs, which must be installed before anything
  starts.
- Training: `cobalt.training.machinery.plan` (processes, sharding, numerics, the GPU memory every
  process plans against, vLLM's share, host memory).

`--gpus N` thus works for any model and engine the run can pick: each stage uses what its engine
can use of the N GPUs, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from cobalt.pipeline.params import PipelineParams
from cobalt.training.machinery.plan import TrainingPlan, plan_training
from engines.machine import Machine, detect
from engines.plan import EnginePlan, check_clients, plan_engine


@dataclass(frozen=True)
class RunPlan:
    machine: Machine
    generation: EnginePlan
    training: TrainingPlan
    judge: EnginePlan | None = None

    def lines(self) -> list[str]:
        out = [
            f"GPU plan on {self.machine.describe()}:",
            f"  trajectories and evaluations: {self.generation.describe()}",
            f"  training: {self.training.describe()}",
        ]
        if self.judge is not None:
            out.append(f"  reward-hacking judge: {self.judge.describe()}")
        return out


def plan_generation(
    params: PipelineParams, model: str | None, machine: Machine
) -> tuple[EnginePlan, int | None]:
    """The generating stages' plan (and the embedded model's planned size) for the reference at
    `model` (None: not resolved yet: the embedded model by its size, else by its name). Raises
    GPUCountError or MissingClientError."""
    from cobalt.reference import planned_parameters

    size = planned_parameters(params.reference) if model is None else None
    engine = params.engine.model_copy(update={"model": model or params.reference})
    generation = plan_engine(engine, gpus=machine.gpus, parameters=size)
    check_clients(generation, "engine")
    return generation, size


def plan_run(params: PipelineParams, model: str | None, machine: Machine | None = None) -> RunPlan:
    """The plan of `params` with the reference model at `model` (None: the embedded model the
    flow fits or builds, planned by its size). Raises the engines' and training's one-line
    errors (a GPU count, a missing client, memory)."""
    machine = machine or detect()
    generation, size = plan_generation(params, model, machine)
    training = plan_training(params.training, model, machine, size)
    judge = None
    if params.reward_hacking and params.judge is not None:
        judge = plan_engine(params.judge.engine, gpus=machine.gpus)
        check_clients(judge, "judge.engine")
    return RunPlan(machine, generation, training, judge)
