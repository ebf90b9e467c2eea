"""What a run will use, printed before it starts: a pipeline run's (the preset's choices and the
user's, the engine `auto` picks for the reference model, the training's settings) and a training
run's (`training_settings_text`: its policy, trajectories, bandit contexts and training)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cobalt.pipeline.params import PipelineParams

if TYPE_CHECKING:
    from cobalt.training.settings import TrainingConfig
    from cobalt.training.stages import TrainingParams


def settings_text(params: PipelineParams, plan: list[str] | None = None) -> str:
    """What the run will use, printed before it starts (the preset's choices and the user's),
    and its GPU plan's lines (`cobalt.pipeline.gpu_plan.RunPlan.lines`) when given."""
    from cobalt.reference import planned_parameters
    from engines import choose, resolve_data_parallel

    c, s = params.collect, params.collect.sampling
    # what `auto` picks for the reference (a name: the size it is built with; engines.auto)
    size = planned_parameters(params.reference)
    kind = params.engine.kind
    engine = kind
    if kind == "auto":
        choice = choose(params.reference, parameters=size)
        kind, engine = choice.kind, f"auto -> {choice}"
    if kind == "vllm":
        gpus = resolve_data_parallel(params.engine) * params.engine.tensor_parallel_size
        engine += f" on {gpus} GPU{'s' if gpus > 1 else ''}"
    lines = [
        f"preset {params.preset}: reference and policy {params.reference}; engine {engine}",
        f"trajectories: {s.n} samples x {c.turns} feedback turns, {s.max_new_tokens} new "
        f"tokens, T {s.temperature} top-p {s.top_p}, "
        + ("METHOD §1.2's system prompt" if c.system_prompt else "no system prompt"),
        f"evaluation: {params.eval_samples or s.n} samples x {params.eval_turns} feedback turns "
        f"on '{params.eval_table}'"
        + (f" (first {params.eval_limit})" if params.eval_limit else ""),
        f"bandit contexts up to {params.bandit.max_prompt_tokens} tokens; cleaning: statements "
        f"of {params.rules.min_statement_alnum}+ alphanumerics, {params.rules.min_tests}+ tests",
        training_line(params.training, params.reference, size),
    ]
    return _block([*lines, *(plan or [])])


def training_settings_text(
    params: TrainingParams,
    model: str,
    plan: list[str] | None = None,
    trajectories: str | None = None,
) -> str:
    """What a training run (flows.training) will use, printed before it starts: its policy
    (`model`, resolved), trajectories (`trajectories`: the evaluation stage found, else as
    named), bandit contexts and training settings, and its plan's lines when given."""
    b = params.bandit
    lines = [
        f"preset {params.training.preset}: policy {model}",
        f"trajectories {trajectories or params.trajectories}"
        + (
            f"; perturbed {params.perturbed} ({b.perturbed_ratio:g} of the repair contexts)"
            if b.perturbed_ratio > 0
            else ""
        ),
        f"bandit contexts up to {b.max_prompt_tokens} tokens ({b.mode} selection)",
        training_line(params.training, model),
    ]
    return _block([*lines, *(plan or [])])


def training_line(t: TrainingConfig, model: str, size: int | None = None) -> str:
    """One line of the training's settings: mode, preset, what the preset and the user decide,
    the numerics and the generation `auto` picks for `model` (`size`: the parameters of a model
    not built yet)."""
    import torch

    if t.mode == "offline":
        return (
            f"training: offline {t.offline.objective}, {t.preset} preset, precision "
            f"{t.precision} -> {t.resolved_precision()}" + (", LoRA" if t.lora else "")
        )
    kw = t.grpo_kwargs("out")
    generation, why = t.generation_choice(torch.cuda.is_available(), model, size)
    return (
        f"training: {t.mode} GRPO, {t.preset} preset: lr {kw['learning_rate']}, "
        f"{kw['num_generations']} samples per prompt at T {kw.get('temperature', 1.0)}, "
        f"{kw['max_completion_length']} completion tokens, {kw.get('max_steps') or str(kw.get('num_train_epochs')) + ' epochs'}"
        f"{' steps' if kw.get('max_steps') else ''}, reward {t.reward}, KL {t.kl()} "
        f"{kw['beta']}, precision {t.precision} -> {t.resolved_precision()}, generation "
        + (f"auto -> {generation} ({why})" if why else generation)
        + (", LoRA" if t.lora else "")
        + (
            f", {t.num_processes} processes ({t.resolved_sharding()})"
            if t.num_processes > 1
            else ""
        )
    )


def _block(lines: list[str]) -> str:
    """`settings:` and the lines under it, indented."""
    return "\n".join("  " + line for line in ["settings:", *lines]).lstrip()
