"""The pipeline's parameters and what each stage it chains gets from them, the checks between
stages, and the closing summary (what each stage produced; Pass@1 per turn before and after
training; a PNG and summary.json in storage). The flow is `flows/pipeline.py`, its Prefect tasks
and artifacts `tasks/pipeline.py`; docs/PIPELINE.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from cobalt.analysis.judge import JudgeConfig
from cobalt.analysis.stages import HackingParams, embedded_judge
from cobalt.analysis.summary import HackingSummary
from cobalt.bandit.dataset import BanditConfig
from cobalt.data.cleaning import CleanRules
from cobalt.data.source_spec import Sources, SourceSpec
from cobalt.data.stages import DataParams, DataSummary
from cobalt.errors import EmptyStageError
from cobalt.models import FITTED, NAMES, TINY, is_embedded
from cobalt.params import deep_merge
from cobalt.presets import (
    PRESET_FIELDS,
    SYNTHETIC_RULES,
    SYNTHETIC_SOURCES,
    PipelinePreset,
    preset_defaults,
    tiny_collect,
    tiny_training,
)
from cobalt.reference import FIT_STEPS
from cobalt.run_settings import ShardedRunSettings
from cobalt.seed_spread import change_at, spread_for
from cobalt.storage import open_storage
from cobalt.training.config import MODES, TrainingConfig
from cobalt.training.stages import TrainingParams, TrainingSummary, check_offline_params
from cobalt.trajectories.batching import BatchConfig
from cobalt.trajectories.collect import CollectConfig
from cobalt.trajectories.evaluation import plot_before_after
from cobalt.trajectories.runs import TrajectorySummary, before_after
from cobalt.trajectories.stages import TrajectoryParams
from engines import EngineConfig


class PipelineParams(ShardedRunSettings):
    """Parameters of the pipeline flow, validated before any work starts (how it runs:
    `ShardedRunSettings`, passed on to every flow it chains). The defaults are the embedded run:
    bundled synthetic problems, the tiny model fitted on CPU, local storage. A real reference
    model (a Hub id, a directory) gets the paper preset's settings (`preset`) unless the
    parameters set them."""

    preset: PipelinePreset | None = Field(
        None,
        description="Settings of trajectories, evaluation, bandit contexts, training and engine "
        "(PRESET_FIELDS) that the parameters do not set: tiny (the embedded run) or paper (SPEC "
        "§1.2-§1.6). None: tiny for the embedded reference models (fitted, tiny, or a directory "
        "the tiny fit made), paper for any other model.",
    )

    sources: Sources = Field(
        default_factory=lambda: [SourceSpec.parse(s) for s in SYNTHETIC_SOURCES],
        min_length=1,
        description="Data sources (see the data flow); default: the bundled synthetic problems.",
    )
    rules: CleanRules = Field(
        default_factory=lambda: SYNTHETIC_RULES,
        description="Cleaning rules; default: SPEC §1.1's for given sources, 40 alphanumerics "
        "instead of 100 for the bundled synthetic problems (their statements are short).",
    )
    reference: str = Field(
        FITTED,
        description=f"The reference model that collects trajectories and is trained: {NAMES} "
        f"(cobalt/models.py; '{FITTED}': the tiny model fitted on CPU to the synthetic family, "
        f"built once into the storage; '{TINY}': the random tiny model). Resolved once, at the "
        "preflight, to a local directory every stage loads.",
    )
    fit_steps: int = Field(
        FIT_STEPS,
        ge=1,
        le=100_000,
        description="Optimizer steps of the reference model's fit (about 75 s on 2 CPU cores).",
    )
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig(kind="auto", model=FITTED),
        description="Engine of every generating stage (kind auto: vLLM on a GPU where it is "
        "installed, else transformers; device, dtype, batch size); its model is the reference.",
    )
    train_table: str = Field("train", description="Problem set the trajectories come from.")
    eval_table: str = Field("test", description="Problem set evaluated before and after.")
    train_limit: int | None = Field(None, ge=1, description="Only the first N training problems.")
    eval_limit: int | None = Field(None, ge=1, description="Only the first N evaluation problems.")
    collect: CollectConfig = Field(
        default_factory=tiny_collect,
        description="Trajectories for the bandit dataset (paper: n 16, turns 2, 6144 tokens).",
    )
    eval_turns: int = Field(2, ge=0, le=64, description="Feedback turns when evaluating.")
    eval_samples: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Samples per problem when evaluating (None: the trajectories' "
        "collect.sampling.n); more samples, a finer Pass@1.",
    )
    batch: BatchConfig = Field(default_factory=BatchConfig)
    bandit: BanditConfig = Field(default_factory=lambda: BanditConfig(max_prompt_tokens=1024))
    training: TrainingConfig = Field(
        default_factory=tiny_training,
        description="Training mode and settings; `tiny_training('offline')` is the embedded "
        "default of the offline mode.",
    )
    reward_hacking: bool = Field(
        False,
        description="After training, the reward-hacking analysis (SPEC §1.7; "
        "docs/REWARD_HACKING.md) on the perturbed `hacking_table` set for the reference and the "
        "trained policy, and their comparison.",
    )
    hacking_table: str = Field(
        "train",
        description="Problem set whose perturbed copy is analysed: train or dev (the paper used "
        "its perturbed validation set; the embedded default's dev set has 3 problems).",
    )
    hacking_limit: int | None = Field(
        None,
        ge=1,
        description="Only the first N problems of the analysis (default: train_limit when the "
        "table is the training table, so the reference's run is the perturbed trajectories').",
    )
    judge: JudgeConfig | None = Field(
        None,
        description="The analysis' LLM judge; None: the reference model, in this process "
        "(greedy; 48 tokens per reply for the embedded default's model, else 1024).",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_defaults(cls, values: Any) -> Any:
        """Fill what the parameters leave unset from the preset (see `preset_defaults`)."""
        if not isinstance(values, dict):
            return values
        reference = values.get("reference", FITTED)
        preset = values.get("preset") or ("tiny" if is_embedded(reference) else "paper")
        if preset not in ("tiny", "paper"):
            return values  # the field's own validation names the error
        training = values.get("training")
        mode = training.get("mode", "cobalt") if isinstance(training, dict) else "cobalt"
        defaults = preset_defaults(preset, mode if mode in MODES else "cobalt")
        merged = {**values, "preset": preset}
        for field in PRESET_FIELDS:
            given = values.get(field)
            if field not in values:
                merged[field] = defaults[field]
            elif isinstance(given, dict) and isinstance(defaults[field], dict):
                merged[field] = deep_merge(defaults[field], given, field)
        if "rules" not in values and "sources" in values:
            merged["rules"] = CleanRules().model_dump()  # SPEC §1.1 for the user's sources
        return merged

    @model_validator(mode="after")
    def _offline_has_no_perturbed_mixing(self) -> PipelineParams:
        check_offline_params(self.training, self.bandit)
        return self

    # --- what each chained flow gets ------------------------------------------------------------
    def data(self) -> DataParams:
        return DataParams(sources=self.sources, rules=self.rules, **self.passed_to(DataParams))

    def trajectories(
        self,
        problems: str,
        table: str,
        model: str,
        purpose: Literal["train", "eval"],
        perturbed: bool = False,
    ) -> TrajectoryParams:
        collect = self.collect
        if purpose == "eval":
            sampling = collect.sampling.model_copy(
                update={
                    "n": self.eval_samples or collect.sampling.n,
                    "seed": evaluation_seed(collect.sampling.seed),
                }
            )
            collect = collect.model_copy(update={"turns": self.eval_turns, "sampling": sampling})
        return TrajectoryParams(
            problems=problems,
            table=table,
            perturbed=perturbed,
            limit=self.train_limit if purpose == "train" else self.eval_limit,
            engine=self.engine.model_copy(update={"model": model}),
            collect=collect,
            batch=self.batch,
            **self.passed_to(TrajectoryParams),
        )

    def hacking(
        self,
        problems: str,
        policy: str,
        reference: str,
        compare: str | None = None,
        label: str | None = None,
    ) -> HackingParams:
        """The reward-hacking analysis of `policy` (a model directory); the judge is the same
        for every policy analysed (the reference model unless `judge` is set)."""
        judge = self.judge
        if judge is None:
            local = self.reference in (FITTED, TINY)
            judge = (embedded_judge() if local else JudgeConfig()).model_copy(
                update={"engine": self.engine.model_copy(update={"model": reference})}
            )
        limit = self.hacking_limit
        if limit is None and self.hacking_table == self.train_table:
            limit = self.train_limit
        return HackingParams(
            problems=problems,
            table=self.hacking_table,
            limit=limit,
            engine=self.engine.model_copy(update={"model": policy}),
            collect=self.collect.model_copy(update={"turns": self.eval_turns}),
            batch=self.batch,
            judge=judge,
            compare=compare,
            label=label,
            **self.passed_to(HackingParams),
        )

    def training_params(
        self, evaluation_uri: str, model: str, perturbed_uri: str | None = None
    ) -> TrainingParams:
        return TrainingParams(
            trajectories=evaluation_uri,
            perturbed=perturbed_uri,
            model=model,
            bandit=self.bandit,
            training=self.training,
            **self.passed_to(TrainingParams),
        )


def evaluation_protocol(model: str, preset: PipelinePreset | None = None) -> dict[str, Any]:
    """The pipeline's evaluation of `model` as TrajectoryParams values (`python -m
    flows.trajectories --evaluation`): the evaluation table of the latest problem sets, the
    preset's engine, evaluation turns, samples and seed; the preset as the pipeline decides it
    for `model` unless `preset` names one. The same settings give the same stage keys as the
    pipeline's own evaluation of that model."""
    values: dict[str, Any] = {"reference": model, **({"preset": preset} if preset else {})}
    params = PipelineParams.model_validate(values)
    evaluation = params.trajectories("latest", params.eval_table, model, "eval")
    return evaluation.model_dump(mode="json", include={"problems", "table", "engine", "collect"})


def evaluation_seed(seed: int | None) -> int | None:
    """The evaluations' sampling seed: derived from the trajectories' `seed`, never equal to it.
    With one seed, a test problem whose prompt is a training problem's (each of the embedded test
    set's 60 statements is) would be sampled the same texts as the training trajectories drew:
    the evaluation would replay the contexts training saw. The evaluations before and after
    training share this seed, so they share their noise (common random numbers,
    engines.keyed_sampling)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"evaluation:{seed}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") >> 1


def with_seed(params: PipelineParams, seed: int) -> PipelineParams:
    """The same run with another seed: every sampled token (the training trajectories and both
    evaluations), the bandit rows' order and the trainer's seed. The fitted reference model stays
    the one fitted with seed 0 (`cobalt.reference.reference_model`)."""
    sampling = params.collect.sampling.model_copy(update={"seed": seed})
    return params.model_copy(
        update={
            "collect": params.collect.model_copy(update={"sampling": sampling}),
            "bandit": params.bandit.model_copy(update={"seed": seed}),
            "training": params.training.model_copy(update={"seed": seed}),
        }
    )


def check_sets(data: DataSummary, params: PipelineParams) -> str:
    """The problem-set bundle's directory, after checking both tables the pipeline uses."""
    for table in (params.train_table, params.eval_table):
        info = data.problem_sets.tables.get(table)
        if info is None or info.rows == 0:
            raise EmptyStageError(
                f"the data stage produced no '{table}' problems ({data.line}): add sources with "
                f"that role (e.g. PATH:KIND?role={table}) or relax the cleaning rules"
            )
    return data.problem_sets.uri


# --- report ---------------------------------------------------------------------------------------


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
