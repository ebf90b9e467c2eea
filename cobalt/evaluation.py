"""The old path of `cobalt.trajectories.evaluation` (the evaluation moved in with the trajectories):
kept only while the learning check imports it from here; import from there."""

from cobalt.trajectories.evaluation import (
    EvalRecord,
    ProgramResult,
    evaluate,
    pass_at_k,
    plot_before_after,
    plot_pass_at_1,
    problem_scores,
    stop_on_public_pass,
    turn_table,
)

__all__ = [
    "EvalRecord",
    "ProgramResult",
    "evaluate",
    "pass_at_k",
    "plot_before_after",
    "plot_pass_at_1",
    "problem_scores",
    "stop_on_public_pass",
    "turn_table",
]
