"""What a pipeline run will use, printed before it starts: the preset's choices and the user's,
the engine `auto` picks for the reference model, the training's settings."""

from __future__ import annotations

from cobalt.pipeline.params import PipelineParams


def settings_text(params: PipelineParams, plan: list[str] | None = None) -> str:
    """What the run will use, printed before it starts (the preset's choices and the user's),
    and its GPU plan's lines (`cobalt.pipeline.gpu_plan.RunPlan.lines`) when given."""
    import torch

    from cobalt.reference import planned_parameters
    from engines import choose, resolve_data_parallel

    c, s, t = params.collect, params.collect.sampling, params.training
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
        + ("the SPEC's system prompt" if c.system_prompt else "no system prompt"),
        f"evaluation: {params.eval_samples or s.n} samples x {params.eval_turns} feedback turns "
        f"on '{params.eval_table}'"
        + (f" (first {params.eval_limit})" if params.eval_limit else ""),
        f"bandit contexts up to {params.bandit.max_prompt_tokens} tokens; cleaning: statements "
        f"of {params.rules.min_statement_alnum}+ alphanumerics, {params.rules.min_tests}+ tests",
    ]
    if t.mode == "offline":
        lines.append(
            f"training: offline {t.offline.objective}, {t.preset} preset, precision "
            f"{t.precision} -> {t.resolved_precision()}" + (", LoRA" if t.lora else "")
        )
    else:
        kw = t.grpo_kwargs("out")
        generation, why = t.generation_choice(torch.cuda.is_available(), params.reference, size)
        lines.append(
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
    return "\n".join("  " + line for line in ["settings:", *lines, *(plan or [])]).lstrip()
