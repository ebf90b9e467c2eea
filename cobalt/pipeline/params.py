"""The pipeline's parameters (`PipelineParams`: the presets fill what they leave unset), what each
stage it chains gets from them, and the checks between stages. docs/PIPELINE.md.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import Field, model_validator

from cobalt.analysis.judge import JudgeConfig
from cobalt.analysis.stages import HackingParams, embedded_judge
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
from cobalt.training.settings import MODES, TrainingConfig
from cobalt.training.stages import TrainingParams, check_offline_params
from cobalt.trajectories.batching import BatchConfig
from cobalt.trajectories.collect import CollectConfig
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
        "(PRESET_FIELDS) that the parameters do not set: tiny (the embedded run) or paper (METHOD "
        "§1.6.1). None: tiny for the embedded reference models (fitted, tiny, or a directory "
        "the tiny fit made), paper for any other model.",
    )

    sources: Sources = Field(
        default_factory=lambda: [SourceSpec.parse(s) for s in SYNTHETIC_SOURCES],
        min_length=1,
        description="Data sources (see the data flow); default: the bundled synthetic problems.",
    )
    rules: CleanRules = Field(
        default_factory=lambda: SYNTHETIC_RULES,
        description="Cleaning rules; default: METHOD §1.1's for given sources, 40 alphanumerics "
        "instead of 100 for the bundled synthetic problems (their statements are short).",
    )
    reference: str = Field(
        FITTED,
        description=f"The reference model that collects trajectories and is trained: {NAMES} "
        f"(cobalt/models.py; '{FITTED}', the default: the tiny model fitted on CPU to the "
        f"synthetic family, built once into the storage; '{TINY}': the random tiny model). "
        "Resolved once, at the preflight, to a local directory every stage loads.",
    )
    fit_steps: int = Field(
        FIT_STEPS,
        ge=1,
        le=100_000,
        description="Optimizer steps of the reference model's fit (its time: docs/RESULTS.md, "
        "'The fitted reference model').",
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
        description="After training, the reward-hacking analysis (METHOD §1.7; "
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
        preset = values.get("preset") or preset_for(values.get("reference", FITTED))
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
            merged["rules"] = CleanRules().model_dump()  # METHOD §1.1 for the user's sources
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


def preset_for(model: str) -> PipelinePreset:
    """The preset a model gets when none is named (the pipeline's, flows.training's): tiny for
    the embedded default's models (fitted, tiny, or a directory the tiny fit made), paper for
    any other (a Hub id, a model directory, a trained policy in storage)."""
    return "tiny" if is_embedded(model) else "paper"


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
