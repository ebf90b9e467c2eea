"""The reward-hacking stage in storage (docs/REWARD_HACKING.md): its parameters, the preflight,
and its two steps after the multi-turn inference (which is the trajectories stage with perturbed
feedback, run as it is): the errors step here, the judged step (shards and their merge) in
`cobalt/analysis/judged.py`.

    reward_hacking/errors/<key>/errors.jsonl   turn-level errors and counts, one line per problem
    reward_hacking/judged/<key>/judged.jsonl   the judge's labels and raw replies, one line per
                                               problem with errors (its shards merged in order)
    reward_hacking/judged/<key>/shards/...     one shard's judged.jsonl, appended as judged
                                               (resumable), and its MANIFEST.json
    .../MANIFEST.json                          written last: the step is finished
    reward_hacking/judged/<key>/report.json, report.md, turn_errors.png   the report
    reward_hacking/comparisons/<key>/...       a comparison of two analyses
    reward_hacking/LATEST.json                 the newest finished analysis

Keys are content addresses: errors = hash(multiturn and evaluation records, problems, turns,
code of the detection); judged = hash(errors, the judge's identity and settings, code of the
judge). `tasks/reward_hacking.py` runs the errors step as a cached Prefect task, the judged
step as one cached task per shard (here or on a Dask cluster) and a merge task.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cobalt.analysis.judge import JudgeConfig, JudgeError, Judgement
from cobalt.analysis.reward_hacking import detect_all, totals
from cobalt.models import EMBEDDED, FITTED, NAMES
from cobalt.presets import SYNTHETIC_SOURCES, tiny_collect
from cobalt.run_settings import InferenceRunSettings
from cobalt.storage import (
    MANIFEST,
    Logger,
    StorageConfig,
    code_version,
    from_manifest,
    open_storage,
    recipe_key,
)
from cobalt.trajectories.batching import BatchConfig
from cobalt.trajectories.collect import CollectConfig
from cobalt.trajectories.evaluation import EvalRecord
from cobalt.trajectories.problemsets import (
    ProblemSetError,
    ProblemSource,
    load_problems,
    resolve_problems,
)
from cobalt.trajectories.records import Record, parse_records
from cobalt.trajectories.runs import Trajectories
from cobalt.trajectories.specs import TrajectoryRef
from cobalt.trajectories.stages import (
    TrajectoryParams,
    engine_identity,
    local_engine,
    read_stage,
)
from engines import EngineConfig, SamplingConfig, make_engine

ERRORS_CODE = ("cobalt.analysis.reward_hacking",)
JUDGE_CODE = ("cobalt.analysis.judge",)
FORMAT = "cobalt-reward-hacking/1"
DEFAULT_PROBLEMS = SYNTHETIC_SOURCES[0]  # the embedded run's training problems


def embedded_judge() -> JudgeConfig:
    """The fitted model as judge, 48 tokens per reply (its labels are poor; the machinery is
    the real one)."""
    return JudgeConfig(
        engine=EngineConfig(kind="auto", model=FITTED),
        sampling=SamplingConfig(n=1, temperature=0.0, max_new_tokens=48, seed=0),
    )


class HackingParams(InferenceRunSettings):
    """Parameters of the reward-hacking flow, validated before any work starts (how it runs:
    `InferenceRunSettings`). The defaults are the embedded run: the bundled synthetic problems,
    the tiny model fitted on CPU as policy and judge, local storage."""

    problems: str = Field(
        DEFAULT_PROBLEMS,
        description="As the trajectories flow takes it: 'latest' (the data stage's newest "
        "bundle; its '<table>_perturbed' set is used), a bundle directory, a .jsonl/.parquet of "
        "problem records or a raw source PATH:KIND (problems without perturbed tests are "
        "perturbed here, seed 0). Default: the bundled synthetic training problems.",
    )
    table: str = Field(
        "train", description="Set of a bundle whose perturbed copy is analysed: train or dev."
    )
    limit: int | None = Field(None, ge=1, description="Only the first N problems.")
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig(kind="auto", model=FITTED),
        description=f"The policy (or reference model) whose repairs are analysed: {NAMES} "
        f"(cobalt/models.py; '{FITTED}': the embedded default's model, fitted once into the "
        "storage), or a LiteLLM model with --api-base.",
    )
    api_key_block: str | None = Field(None, description="Prefect Secret block of the policy key.")
    collect: CollectConfig = Field(
        default_factory=tiny_collect,
        description="Multi-turn inference; default: as the pipeline samples the embedded model "
        "(cobalt.presets.tiny_collect; the paper's evaluation: n 16, 8 turns, 6144 tokens).",
    )
    batch: BatchConfig = Field(default_factory=BatchConfig)
    judge: JudgeConfig = Field(default_factory=embedded_judge)
    judge_chunk: int = Field(
        64, ge=1, le=100_000, description="Errors per judge round (one generate call each)."
    )
    judge_shard_size: int | None = Field(
        None,
        ge=1,
        description="Errors per judge task (whole problems, whole rounds; a multiple of "
        "judge_chunk), the unit of work run here or on a --cluster worker. Default: 16 rounds "
        "(1024 errors with the default judge_chunk).",
    )
    compare: str | None = Field(
        None,
        description="Another finished analysis to compare with ('latest' or its directory, "
        "<storage>/reward_hacking/judged/<key>): it is 'before', this run 'after'.",
    )
    examples: int = Field(6, ge=0, le=100, description="Errors shown with their diffs.")
    label: str | None = Field(
        None, description="The policy's name in the report (default: its model's name)."
    )

    @model_validator(mode="after")
    def _whole_rounds(self) -> HackingParams:
        if self.judge_shard_size is not None and self.judge_shard_size % self.judge_chunk:
            whole = self.judge_chunk * max(1, round(self.judge_shard_size / self.judge_chunk))
            raise ValueError(
                f"judge_shard_size ({self.judge_shard_size}) must be a multiple of judge_chunk "
                f"({self.judge_chunk}): e.g. {whole}"
            )
        return self

    def trajectories(self, engine: EngineConfig) -> TrajectoryParams:
        """The multi-turn inference: the trajectories stage with perturbed feedback."""
        return TrajectoryParams(
            problems=self.problems,
            table=self.table,
            perturbed=True,
            limit=self.limit,
            engine=engine,
            api_key_block=self.api_key_block,
            collect=self.collect,
            batch=self.batch,
            **self.passed_to(TrajectoryParams),
        )


# --- preflight ------------------------------------------------------------------------------------


class Ready(BaseModel):
    problems: ProblemSource
    compare: dict[str, Any] | None = None


def check_engine(engine: EngineConfig, what: str, params: HackingParams) -> None:
    """A LiteLLM key is set; a local engine's model resolves (a Hub model or a storage
    directory downloaded once, here; 'fitted' and 'tiny' are built by the flow)."""
    engine = engine.resolved()
    if engine.kind == "litellm":
        engine.api_key()  # MissingAPIKeyError names the variable
    elif engine.model not in EMBEDDED:
        flag = "--judge-model" if what == "judge" else "--model"
        local_engine(engine, params.storage, params.work_dir, flag)


def preflight(params: HackingParams) -> Ready:
    """Storage usable, the problem set found with perturbed tests, policy and judge usable (the
    judge's endpoint answers), the analysis to compare with finished. Raises StorageError /
    ProblemSetError / MissingAPIKeyError / JudgeError naming what to set."""
    open_storage(params.storage).check()
    check_engine(params.engine, "policy", params)
    check_engine(params.judge.engine, "judge", params)
    try:
        source = resolve_problems(params.problems, params.storage, params.table, True, params.limit)
    except ProblemSetError as exc:
        if "no problems to use" not in str(exc):
            raise
        raise ProblemSetError(
            f"{exc}: the reward-hacking analysis needs problems with perturbed public tests "
            "(METHOD §1.7: at least two public tests with distinct outputs, or a data-stage "
            "'<table>_perturbed' set)"
        ) from None
    compare = find_analysis(params.compare, params.storage) if params.compare else None
    probe_judge(params.judge.engine)
    return Ready(problems=source, compare=compare)


def probe_judge(engine: EngineConfig) -> None:
    """One tiny request to a served judge (LiteLLM), without retries: an endpoint that is down
    or a model it does not serve fails here, before any inference."""
    if engine.kind != "litellm":
        return
    quick = engine.model_copy(update={"max_retries": 0, "timeout_s": min(engine.timeout_s, 60)})
    with make_engine(quick) as probe:
        reply = probe.generate(
            [[{"role": "user", "content": "Reply with OK."}]],
            SamplingConfig(n=1, temperature=0.0, max_new_tokens=1),
        )[0][0]
    if reply.error is not None:
        where = engine.api_base or "the provider's API"
        raise JudgeError(
            f"the judge {engine.model} at {where} did not answer ({reply.error[:300]}): start "
            "the server, or fix --judge-api-base / --judge-model (--judge-api-key-env for a "
            "hosted API)"
        )


def resolve_engine(
    engine: EngineConfig, params: HackingParams, logger: Logger, what: str = "policy"
) -> EngineConfig:
    """A local engine's model resolved to its directory ('fitted' / 'tiny' fitted or built
    once into the storage, reused after), then kind auto decided for that model."""
    if engine.kind == "litellm":
        return engine
    flag = "--judge-model" if what == "judge" else "--model"
    return local_engine(engine, params.storage, params.work_dir, flag, logger)


# --- steps ----------------------------------------------------------------------------------------


class AnalysisRef(BaseModel):
    """A finished step: what tasks pass on (small)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Literal["errors", "judged"]
    key: str
    uri: str = Field(description="The step's directory (MANIFEST.json and its JSONL).")
    rows: int
    fingerprint: str = Field(description="sha256 of the JSONL.")
    stats: dict[str, Any] = Field(default_factory=dict)

    @property
    def records_uri(self) -> str:
        return f"{self.uri}/{self.stage}.jsonl"


class ErrorsSpec(BaseModel):
    """What decides the errors step: the inference's records and the problems."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    problems: ProblemSource
    multiturn: TrajectoryRef
    evaluation: TrajectoryRef
    turns: int
    policy: dict[str, Any] = Field(description="Identity of the engine that wrote the programs.")


class JudgedSpec(BaseModel):
    """What decides the judged step: the errors and the judge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    errors: AnalysisRef
    judge: dict[str, Any] = Field(description="The judge's identity and settings.")


class JudgedRecord(BaseModel):
    """The judgements of one problem's errors (one JSONL line)."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str
    judgements: list[Judgement]


class Runtime(BaseModel):
    """How the steps run: never part of a key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    storage: StorageConfig
    judge: JudgeConfig = Field(description="With its model resolved to a directory.")
    judge_chunk: int = 64
    judge_shard_size: int | None = Field(None, description="Errors per shard (16 rounds).")
    work_dir: str
    refresh: bool = False

    @property
    def errors_per_shard(self) -> int:
        """Whole rounds: the shard size rounded down to a multiple of judge_chunk (one at least)."""
        size = self.judge_shard_size or 16 * self.judge_chunk
        return max(1, size // self.judge_chunk) * self.judge_chunk


def errors_spec(trajectories: Trajectories, turns: int) -> ErrorsSpec:
    recipe = {
        "stage": "errors",
        "multiturn": trajectories.multiturn.fingerprint,
        "evaluation": trajectories.evaluation.fingerprint,
        "problems": trajectories.problems.fingerprint,
        "turns": turns,
        "code": code_version(*ERRORS_CODE),
    }
    return ErrorsSpec(
        key=recipe_key(**recipe),
        problems=trajectories.problems,
        multiturn=trajectories.multiturn,
        evaluation=trajectories.evaluation,
        turns=turns,
        policy=trajectories.engine,
    )


def judged_spec(errors: AnalysisRef, judge: JudgeConfig) -> JudgedSpec:
    identity = {**engine_identity(judge.engine), **judge.recipe()}
    recipe = {
        "stage": "judged",
        "errors": errors.fingerprint,
        "judge": identity,
        "code": code_version(*JUDGE_CODE),
    }
    return JudgedSpec(key=recipe_key(**recipe), errors=errors, judge=identity)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_step(ref: AnalysisRef, storage: StorageConfig, model: type[BaseModel]) -> dict[str, Any]:
    st = open_storage(storage)
    with st.fs.open(ref.records_uri.removeprefix("s3://"), "rb") as f:
        records, _ = parse_records(f.read(), model, None, ref.records_uri)
    return records


def errors_stage(
    spec: ErrorsSpec, storage: StorageConfig, *, refresh: bool = False, logger: Logger
) -> AnalysisRef:
    """Turn-level errors of every problem (fast: no model, no sandbox; the evaluation step
    already judged every program on the wrong tests)."""
    st = open_storage(storage)
    directory = st.path("reward_hacking", "errors", spec.key)
    manifest = f"{directory}/{MANIFEST}"
    if not refresh and st.fs.exists(manifest):
        return from_manifest(st.read_json(manifest), AnalysisRef)
    problems = load_problems(spec.problems, storage)
    if not any(p.modified_tests and p.modified_tests.inputs for p in problems):
        raise ProblemSetError(
            f"no problem of {spec.problems.uri} has wrong (modified) tests: run the analysis on "
            "a perturbed set (METHOD §1.7)"
        )
    records = read_stage(spec.multiturn, storage, Record, logger)
    evaluations = read_stage(spec.evaluation, storage, EvalRecord, logger)
    found = detect_all(problems, records, evaluations, spec.turns)
    data = b"".join(r.model_dump_json().encode() + b"\n" for r in found)
    st.write_atomic(f"{directory}/errors.jsonl", data)
    ref = AnalysisRef(
        stage="errors",
        key=spec.key,
        uri=st.protocol + directory,
        rows=len(found),
        fingerprint=_sha256(data),
        stats=totals(found),
    )
    st.commit(manifest, ref, spec, format=FORMAT)
    stats = ref.stats
    logger.info(
        "turn-level errors: %d in %d program pairs (%d changed) over %d problems; rule "
        "pre-check hard-coded %d",
        stats["errors"],
        stats["pairs"],
        stats["changed"],
        stats["problems"],
        stats["rule_hard_coded"],
    )
    return ref


# --- finding an analysis again ------------------------------------------------------------------


def find_analysis(where: str, storage: StorageConfig) -> dict[str, Any]:
    """The report (report.json) of a finished analysis: 'latest' or its judged directory."""
    st = open_storage(storage)
    if where == "latest":
        where = st.latest("reward_hacking", "judged")
        if where is None:
            raise ProblemSetError(
                f"no reward-hacking analysis in {st.url()} yet: run `python -m "
                "flows.reward_hacking` with the same --storage first, or pass --compare DIR"
            )
    path = f"{where.removeprefix('s3://').rstrip('/')}/report.json"
    if not st.fs.exists(path):
        raise ProblemSetError(
            f"{where} is not a finished reward-hacking analysis (no report.json): pass "
            "<storage>/reward_hacking/judged/<key> of a completed run"
        )
    return st.read_json(path)


def write_json(storage: StorageConfig, path: str, value: Any) -> None:
    open_storage(storage).write_atomic(path, json.dumps(value, indent=1, default=str).encode())
