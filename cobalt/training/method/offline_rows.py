"""The offline dataset (METHOD §2): every logged turn of a finished trajectories run as a training
row with its reward and leave-one-out advantage; no generation and no sandbox are needed to build
it or to train on it (`cobalt/training/offline.py`). Written as parquet under
`<storage>/offline/<key>/data.parquet` (MANIFEST.json last), read back with `datasets`.
`offline_rows` is the notebook entry point (no writes).

One row per (problem, sample, turn t) of the multi-turn records:

- `prompt`: the conversation before turn t's answer, as the bandit contexts are built
  (`Record.first_messages()` at t = 0, `Record.conversation(sample, t - 1)` after: the earlier
  answers and their feedback turns);
- `completion`: what the model generated at turn t (`Turn.response`, thinking included; the
  answer when no response was kept) and `stopped` (it ended with the end-of-turn token; False
  when cut by the token limit, so no end token is trained);
- `pass_rate`: turn t's program on all tests, combined as METHOD §1.4 combines them
  (`ProblemData.combined()`); None when the answer had no fenced code block;
- `prev_best_pass_rate`: the best combined pass rate of that sample's earlier turns (0 at t = 0);
- `reward`: `correctness_reward(pass_rate, prev_best_pass_rate, training=True)` (METHOD §1.5
  without the format term; -1 without a code block);
- `advantage` = reward - `baseline`, the leave-one-out baseline: the mean reward of the *other*
  rows of its group. Group = the rows sharing the same context (same problem and identical
  prompt: at turn 0 all n samples of a problem); a row alone in its context (the usual case after
  turn 0, where a context holds the sample's own earlier answers) falls back to the other samples
  of the same problem and turn. A row alone in both groups (one sample per problem) has no
  baseline: advantage 0 (`baseline_group` says which group was used: context / turn / none).

Choices: every sample and every turn is kept (no dynamic sampling, no max-variance
down-sampling, no stop rules: a turn that breaks a correct program is a useful negative); turns
that ended the sample without generating (`engine_error`, `context_overflow`) are left out;
problems solved by every first sample are kept (their turn-0 rows have advantage 0, their later
turns need not). Row order: problem, sample, turn (the trainer shuffles).
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from cobalt.bandit.dataset import BanditRef, commit_rows, problem_data
from cobalt.bandit.selection import ProblemData
from cobalt.errors import EmptyStageError
from cobalt.storage import (
    MANIFEST,
    Logger,
    StorageConfig,
    code_version,
    from_manifest,
    open_storage,
    recipe_key,
)
from cobalt.training.method.cobalt_reward import correctness_reward
from cobalt.trajectories.records import ENDING_OUTCOMES
from cobalt.trajectories.runs import Trajectories

log = logging.getLogger(__name__)
DATA = "data.parquet"
OFFLINE_DATA_CODE = ("cobalt.training.method.offline_rows", "cobalt.training.method.cobalt_reward")


# --- rows ----------------------------------------------------------------------------------------


def loo_baselines(rewards: Sequence[float]) -> list[float | None]:
    """The leave-one-out baseline of each reward: the mean of the others (None when alone)."""
    n, total = len(rewards), sum(rewards)
    if n < 2:
        return [None] * n
    return [(total - r) / (n - 1) for r in rewards]


def problem_offline_rows(data: ProblemData) -> list[dict[str, Any]]:
    """The logged turns of one problem, with rewards (advantages: `assign_advantages`)."""
    rec = data.record
    rates = data.combined()
    rows = []
    for s, sample in enumerate(rec.samples):
        sample_rates = rates[s] if s < len(rates) else []
        for t, turn in enumerate(sample.turns):
            if turn.outcome in ENDING_OUTCOMES:
                break
            rate = sample_rates[t] if t < len(sample_rates) else 0.0
            pass_rate = None if turn.code is None else rate
            prev_best = max(sample_rates[:t], default=0.0) if t else 0.0
            prompt = rec.first_messages() if t == 0 else rec.conversation(s, t - 1)
            rows.append(
                {
                    "prompt": prompt,
                    "completion": turn.response or turn.answer,
                    "stopped": turn.finish_reason != "length",
                    "pass_rate": pass_rate,
                    "prev_best_pass_rate": float(prev_best),
                    "reward": correctness_reward(pass_rate, float(prev_best), training=True),
                    "turn": t,
                    "sample": s,
                    "example_id": rec.problem_id,
                    "difficulty": rec.difficulty,
                }
            )
    return rows


def assign_advantages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add `baseline`, `baseline_group` and `advantage` to each row (in place; returns rows)."""
    by_context: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_turn: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        context = json.dumps(row["prompt"], sort_keys=True)
        by_context[(row["example_id"], context)].append(i)
        by_turn[(row["example_id"], row["turn"])].append(i)
    for i, row in enumerate(rows):
        context = json.dumps(row["prompt"], sort_keys=True)
        group, name = by_context[(row["example_id"], context)], "context"
        if len(group) < 2:
            group, name = by_turn[(row["example_id"], row["turn"])], "turn"
        if len(group) < 2:
            row |= {"baseline": None, "baseline_group": "none", "advantage": 0.0}
            continue
        baseline = loo_baselines([rows[j]["reward"] for j in group])[group.index(i)]
        row |= {
            "baseline": baseline,
            "baseline_group": name,
            "advantage": row["reward"] - baseline,
        }
    return rows


def offline_rows(problems: Sequence[ProblemData]) -> list[dict[str, Any]]:
    """Every logged turn of every problem, with reward, baseline and advantage."""
    rows = [r for p in problems for r in problem_offline_rows(p)]
    return assign_advantages(rows)


def offline_stats(problems: Sequence[ProblemData], rows: Sequence[dict[str, Any]]) -> dict:
    """Rows per turn, rewards and advantages per turn, baseline groups, zero advantages."""
    by_turn: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_turn[r["turn"]].append(r)

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        "problems": len(problems),
        "problems_with_rows": len({r["example_id"] for r in rows}),
        "rows": len(rows),
        "rows_by_turn": {str(t): len(v) for t, v in sorted(by_turn.items())},
        "nonzero_advantage_rows": sum(1 for r in rows if r["advantage"] != 0),
        "rows_with_code": sum(1 for r in rows if r["pass_rate"] is not None),
        "baseline_groups": dict(sorted(Counter(r["baseline_group"] for r in rows).items())),
        "reward_mean_by_turn": {str(t): mean([r["reward"] for r in v]) for t, v in by_turn.items()},
        "mean_abs_advantage_by_turn": {
            str(t): mean([abs(r["advantage"]) for r in v]) for t, v in by_turn.items()
        },
    }


# --- the stage in storage ------------------------------------------------------------------------


class OfflineDataSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    trajectories: Trajectories


def offline_data_spec(trajectories: Trajectories) -> OfflineDataSpec:
    """The content address of an offline dataset: its trajectories and the code."""
    recipe = {
        "stage": "offline",
        "evaluation": trajectories.evaluation.fingerprint,
        "multiturn": trajectories.multiturn.fingerprint,
        "problems": trajectories.problems.fingerprint,
        "code": code_version(*OFFLINE_DATA_CODE),
    }
    return OfflineDataSpec(key=recipe_key(**recipe), trajectories=trajectories)


def empty_reason(stats: dict[str, Any]) -> str:
    return (
        f"the offline dataset is empty: the trajectories run has {stats['problems']} problems "
        "but no logged turn (every sample ended with an engine error or a context overflow). "
        "Check the trajectories run's engine, or collect again"
    )


def nothing_to_learn_reason(stats: dict[str, Any]) -> str:
    return (
        f"the offline dataset has no row with a nonzero advantage: of {stats['rows']} logged "
        f"turns of {stats['problems']} problems, every sample got the same reward as the other "
        "samples of its context (baseline groups: "
        f"{stats.get('baseline_groups')}), e.g. a model that writes no program. Collect more "
        "samples per problem (--n, at least 2), on problems the reference model solves "
        "sometimes, or use a stronger reference model"
    )


def offline_data_stage(
    spec: OfflineDataSpec,
    storage: StorageConfig,
    *,
    refresh: bool = False,
    logger: Logger = log,
) -> BanditRef:
    """Build the offline dataset into `<storage>/offline/<key>/data.parquet` (MANIFEST.json
    last); a finished one is returned as is unless `refresh`. The ref has the bandit dataset's
    shape (a parquet dataset with its stats), so the training stage reads either the same way."""
    st = open_storage(storage)
    directory = st.path("offline", spec.key)
    manifest_path = f"{directory}/{MANIFEST}"
    if not refresh and st.fs.exists(manifest_path):
        logger.info("offline dataset: %s is finished already", directory)
        return from_manifest(st.read_json(manifest_path), BanditRef)
    problems = problem_data(spec.trajectories, storage)
    rows = offline_rows(problems)
    stats = offline_stats(problems, rows)
    if not rows:
        raise EmptyStageError(empty_reason(stats))
    ref = commit_rows(st, directory, spec.key, rows, stats, spec)
    logger.info(
        "offline dataset: %d rows (%s by turn, %d with a nonzero advantage) from %d problems at %s",
        ref.rows,
        stats["rows_by_turn"],
        stats["nonzero_advantage_rows"],
        stats["problems"],
        ref.uri,
    )
    return ref


def turn_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows, mean reward and mean |advantage| per turn (the report's table)."""
    return [
        {
            "turn": int(t),
            "rows": n,
            "reward_mean": stats.get("reward_mean_by_turn", {}).get(t),
            "mean_abs_advantage": stats.get("mean_abs_advantage_by_turn", {}).get(t),
        }
        for t, n in stats.get("rows_by_turn", {}).items()
    ]
