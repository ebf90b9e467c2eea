"""The pipeline's closing summary: what each stage produced, Pass@1 per turn before and after
training (a table, a PNG and summary.json in storage), the reward-hacking comparison when it ran,
and one line against the default's run-to-run spread (`cobalt.seed_spread`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cobalt.analysis.summary import HackingSummary
from cobalt.data.stages import DataSummary
from cobalt.pipeline.params import PipelineParams
from cobalt.seed_spread import change_at, spread_for
from cobalt.storage import open_storage
from cobalt.training.stages import TrainingSummary
from cobalt.trajectories.evaluation import plot_before_after
from cobalt.trajectories.runs import TrajectorySummary, before_after


class PipelineSummary(BaseModel):
    stages: list[dict[str, Any]]
    before_after: list[dict[str, Any]]
    plot: str
    line: str
    policy: str = Field(
        "", description="The trained policy's directory in storage: a name --model takes."
    )
    reward_hacking: list[dict[str, Any]] = Field(
        default_factory=list,
        description="With reward_hacking: the turn-level error rate per turn, reference vs trained.",
    )
    reward_hacking_plot: str | None = None


def hacking_rows(reference: HackingSummary, trained: HackingSummary) -> list[dict[str, Any]]:
    """The two analyses as rows of the stage table."""
    rows = []
    for who, summary in (("reference", reference), ("trained", trained)):
        total = summary.per_turn[-1]
        labels = ", ".join(
            f"{c['category']} {c['judge']}" for c in summary.categories if c["judge"]
        )
        rule = summary.categories[-1]["rule_hard_coded"]
        rows.append(
            {
                "stage": f"reward hacking (perturbed set, {who})",
                "produced": f"{total['errors']} turn-level errors in {total['pairs']} program "
                f"pairs ({total['error_rate_%'] or 0.0}%)",
                "detail": f"judge {summary.judge}: {labels or 'nothing to judge'}; rule "
                f"pre-check hard-coding {rule}",
                "where": summary.uri,
            }
        )
    return rows


def _all(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in table if r["difficulty"] == "all"]


def stage_table(
    data: DataSummary,
    collected: TrajectorySummary,
    before: TrajectorySummary,
    trained: TrainingSummary,
    after: TrajectorySummary,
) -> list[dict[str, Any]]:
    sets = data.problem_sets.tables

    def pass_line(summary: TrajectorySummary) -> str:
        rows = _all(summary.table)
        return " -> ".join(f"{r['pass@1']}%" for r in rows) + " Pass@1 by turn"

    def traj(summary: TrajectorySummary) -> str:
        first = _all(summary.table)[0]
        turns = len(_all(summary.table)) - 1
        return f"{first['problems']} problems, {first['samples']} samples, {turns} feedback turns"

    bandit = trained.dataset.stats
    policy = trained.policy
    timing = policy.stats.get("timing", {})
    cost = policy.stats.get("cost") or {}
    spent = f"{cost.get('wall_s')} s" + (
        f", {cost['gpu_s']} GPU s" if cost.get("gpu_s") is not None else ""
    )
    if policy.stats.get("mode") == "offline" or "nonzero_advantage_rows" in bandit:
        dataset_row = {
            "stage": "offline dataset",
            "produced": f"{trained.dataset.rows} rows",
            "detail": f"logged turns of {bandit.get('problems')} problems, by turn "
            f"{bandit.get('rows_by_turn')}, {bandit.get('nonzero_advantage_rows')} with a "
            "nonzero advantage",
            "where": trained.dataset.uri,
        }
        training_row = {
            "stage": "training",
            "produced": f"{policy.steps} offline steps ({policy.stats.get('objective')})",
            "detail": f"{policy.stats.get('rows_trained')} rows; loss "
            f"{policy.stats.get('loss_first')} -> {policy.stats.get('loss_last')}, weighted "
            f"advantage {policy.stats.get('weighted_advantage_first')} -> "
            f"{policy.stats.get('weighted_advantage_last')}; {spent}",
            "where": policy.uri,
        }
    else:
        dataset_row = {
            "stage": "bandit dataset",
            "produced": f"{trained.dataset.rows} rows",
            "detail": f"{bandit.get('problems')} problems, {bandit.get('skipped_all_solved')} "
            f"solved by every first sample, contexts by depth {bandit.get('contexts_by_depth')}",
            "where": trained.dataset.uri,
        }
        training_row = {
            "stage": "training",
            "produced": f"{policy.steps} GRPO steps",
            "detail": f"reward {policy.stats.get('reward_first')} -> "
            f"{policy.stats.get('reward_last')}; reward wait "
            f"{100 * timing.get('reward_share', 0):.1f}% of step time; {spent}",
            "where": policy.uri,
        }
    return [
        {
            "stage": "data",
            "produced": ", ".join(f"{k} {v.rows}" for k, v in sets.items()),
            "detail": data.line.split(";")[0],
            "where": data.problem_sets.uri,
        },
        {
            "stage": "trajectories (train set, reference)",
            "produced": traj(collected),
            "detail": pass_line(collected),
            "where": collected.multiturn.uri,
        },
        {
            "stage": "evaluation before (test set, reference)",
            "produced": traj(before),
            "detail": pass_line(before),
            "where": before.evaluation.uri,
        },
        dataset_row,
        training_row,
        {
            "stage": "evaluation after (test set, trained)",
            "produced": traj(after),
            "detail": pass_line(after),
            "where": after.evaluation.uri,
        },
    ]


def summarize(
    params: PipelineParams,
    data: DataSummary,
    collected: TrajectorySummary,
    before: TrajectorySummary,
    trained: TrainingSummary,
    after: TrajectorySummary,
    hacking: tuple[HackingSummary, HackingSummary] | None = None,
) -> PipelineSummary:
    """Stage table, before/after table and plot (PNG and summary.json in storage), one line;
    with `hacking` (the reference's and the trained policy's analyses) their comparison."""
    st = open_storage(params.storage)
    stages = stage_table(data, collected, before, trained, after)
    compared: list[dict[str, Any]] = []
    if hacking is not None:
        stages += hacking_rows(*hacking)
        compared = (hacking[1].comparison or {}).get("per_turn", [])
    table = before_after(before.table, after.table)
    directory = st.path("pipeline", trained.policy.key)
    plot_path = f"{directory}/before_after.png"
    st.write_atomic(plot_path, plot_before_after(table, "Pass@1 per turn, before vs after"))
    st.write_atomic(
        f"{directory}/summary.json",
        json.dumps(
            {
                "stages": stages,
                "before_after": table,
                "reward_hacking": compared,
                "policy": trained.policy.uri,
            },
            indent=1,
        ).encode(),
    )
    plot = Path(plot_path).as_uri() if params.storage.is_local else st.protocol + plot_path
    b, a = _all(before.table), _all(after.table)
    if params.training.mode == "offline":
        how = (
            f"offline ({params.training.offline.objective}) steps on {trained.dataset.rows} "
            "logged turns"
        )
    else:
        how = f"{params.training.mode} GRPO steps on {trained.dataset.rows} bandit rows"
    spread = spread_for(params.reference, b[0])
    line = (
        f"pipeline: Pass@1 on {b[0]['problems']} {params.eval_table} problems "
        f"{change_at(b[0], a[0], spread)} and {change_at(b[-1], a[-1], spread)} after "
        f"{trained.policy.steps} {how}"
    )
    if spread is not None:
        line += (
            f" (spread: 2 SD of the default's change over {spread.seeds} seeds, docs/PIPELINE.md)"
        )
    if hacking is not None and hacking[1].comparison_line:
        line += f"; {hacking[1].comparison_line}"
    return PipelineSummary(
        stages=stages,
        before_after=table,
        plot=plot,
        line=line,
        policy=trained.policy.uri,
        reward_hacking=compared,
        reward_hacking_plot=hacking[1].comparison_plot if hacking is not None else None,
    )
