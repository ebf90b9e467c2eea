"""The trajectory stage in storage (docs/TRAJECTORIES.md): its parameters, the content address
of each step (initial -> multiturn -> evaluation; a step's key chains its upstream's), and the
steps themselves, run shard by shard (cobalt/trajectories/shards.py) into a JSONL under
`<storage>/trajectories/<stage>/<key>/` with MANIFEST.json written last (a finished step is found
again, a killed one resumes). The logic they run is `cobalt/trajectories/collect.py` and
`cobalt/trajectories/evaluation.py`; `tasks/trajectories.py` runs each shard as a cached Prefect
task (in this process or on a Dask cluster), `flows/trajectories.py` chains the steps. `run_step`
runs a step without Prefect.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cobalt.judging import open_judge
from cobalt.models import NAMES, TINY, resolve_model, stable_name
from cobalt.run_settings import InferenceRunSettings
from cobalt.storage import (
    Logger,
    StorageConfig,
    code_version,
    open_storage,
    recipe_key,
)
from cobalt.trajectories.batching import BatchConfig, Gate, per_call
from cobalt.trajectories.collect import CollectConfig, collect_initial, collect_multiturn
from cobalt.trajectories.evaluation import evaluate
from cobalt.trajectories.problemsets import (
    ProblemSource,
    resolve_problems,
)
from cobalt.trajectories.records import Record, parse_records
from cobalt.trajectories.shards import merge_shards, run_shard, shard_problems, shards_of
from cobalt.trajectories.specs import (
    Runtime,
    Shard,
    ShardRef,
    StageSpec,
    TrajectoryRef,
)
from engines import Engine, EngineConfig, make_engine, visible_gpus
from engines.plan import check_clients, plan_engine

log = logging.getLogger(__name__)


# --- parameters ---------------------------------------------------------------------------------


class TrajectoryParams(InferenceRunSettings):
    """Parameters of the trajectories flow, validated before any work starts (how it runs:
    `InferenceRunSettings`)."""

    problems: str = Field(
        "latest",
        description="'latest' (the newest problem sets of the data stage in this storage), a "
        "problem-set directory (holding MANIFEST.json), a .parquet / .jsonl file of problem "
        "records, or a raw source file as PATH:KIND (e.g. samples/apps_sample.jsonl:taco).",
    )
    table: str = Field("train", description="Problem set of a data-stage bundle: train, dev, test.")
    perturbed: bool = Field(
        False,
        description="Feedback from perturbed public tests (METHOD §1.7): the bundle's "
        "'<table>_perturbed' set, or problems perturbed here (seed 0); evaluation stays on the "
        "true tests. Off: feedback from the true public tests.",
    )
    limit: int | None = Field(None, ge=1, description="Only the first N problems (smoke runs).")
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig(kind="auto", model=TINY),
        description=f"The reference LLM. A local engine's model: {NAMES} (cobalt/models.py), "
        f"resolved once at the preflight to a local directory; '{TINY}': the tiny built-in "
        "model, built into the storage (or work_dir for S3) on first use. litellm: the API's "
        "model name.",
    )
    api_key_block: str | None = Field(
        None,
        description="Name of a Prefect Secret block holding the API key; the flow puts it into "
        "the environment variable named by engine.api_key_env for this run (never logged).",
    )
    collect: CollectConfig = Field(default_factory=CollectConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    checkpoint_s: float = Field(
        60,
        gt=0,
        description="S3: seconds between uploads of the "
        "JSONL being written (what a resume elsewhere starts from).",
    )


# --- preflight: fail fast, before any work ------------------------------------------------------


class Ready(BaseModel):
    problems: ProblemSource
    engine: EngineConfig


def preflight(params: TrajectoryParams) -> Ready:
    """Storage usable, problem set found and non-empty, engine usable (model resolved to a local
    directory, API key set). Raises StorageError / ProblemSetError / ModelNameError /
    MissingAPIKeyError naming what to set."""
    storage = open_storage(params.storage)
    storage.check()
    engine = params.engine
    if engine.kind == "litellm":
        engine.api_key()  # MissingAPIKeyError names the variable
    else:
        engine = local_engine(engine, params.storage, params.work_dir)
    source = resolve_problems(
        params.problems, params.storage, params.table, params.perturbed, params.limit
    )
    return Ready(problems=source, engine=engine)


def local_engine(
    engine: EngineConfig,
    storage: StorageConfig,
    work_dir: str,
    flag: str = "--model",
    logger: Logger | None = None,
) -> EngineConfig:
    """A local engine that can run here, its model resolved to a local directory
    (`cobalt.models.resolve_model`: fitted, tiny, a directory, a model directory in storage, a
    Hub id; ModelNameError names `flag` and the fix) and kind auto decided for that model
    (`engines.auto`: by its size); its GPU plan (`engines.plan`) checked before and after: the
    GPUs its data_parallel_size asks for visible (GPUCountError), the clients it needs (vLLM;
    LiteLLM for vLLM on several GPUs) installed (MissingClientError)."""
    gpus = visible_gpus()
    if engine.kind != "auto":
        check_clients(plan_engine(engine, gpus=gpus), "engine")
    path = resolve_model(engine.model, storage, work_dir, flag=flag, logger=logger)
    engine = engine.model_copy(update={"model": path}).resolved()
    check_clients(plan_engine(engine, gpus=gpus), "engine")  # now that auto has decided
    return engine


# --- stages -----------------------------------------------------------------------------------

INITIAL_CODE = (
    "cobalt.trajectories.collect.collect_initial",
    "cobalt.trajectories.records.make_turn",
    "cobalt.trajectories.prompts.extract_code",
    "cobalt.trajectories.records.Record",
    "cobalt.trajectories.records.Turn",
)
MULTITURN_CODE = (
    "cobalt.trajectories.collect",
    "cobalt.trajectories.prompts",
    "cobalt.trajectories.records",
)
EVALUATION_CODE = ("cobalt.trajectories.evaluation", "sandbox.compare")
IDENTITY = ("kind", "model", "dtype", "extra")  # engine fields that decide what is generated


def engine_identity(engine: EngineConfig) -> dict[str, Any]:
    identity = {k: v for k, v in engine.model_dump(mode="json").items() if k in IDENTITY}
    identity["extra"] = {k: v for k, v in identity["extra"].items() if "key" not in k.lower()}
    if engine.kind != "litellm":  # a Hub snapshot by repo and commit, not its path here
        identity["model"] = stable_name(engine.model)
        if (config := Path(engine.model, "config.json")).exists():
            identity["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()[:16]
    if engine.kind == "transformers":  # how its padded batches draw tokens
        identity["sampler"] = code_version("engines.keyed_sampling")
    elif engine.kind in ("vllm", "litellm"):  # how its requests are seeded
        from engines.keyed_sampling import SEEDING

        identity["sampler"] = SEEDING
    return identity


def stage_specs(params: TrajectoryParams, ready: Ready) -> dict[str, StageSpec]:
    """The spec of each stage; keys chain (a stage's key includes its upstream's)."""
    src, collect = ready.problems, params.collect
    identity = engine_identity(ready.engine)
    initial_recipe = {
        "stage": "initial",
        "instructions": src.instructions,
        "engine": identity,
        "sampling": collect.sampling.model_dump(mode="json"),
        "max_answer_chars": collect.max_answer_chars,
        "system": collect.system_prompt,
        "code": code_version(*INITIAL_CODE),
    }
    initial = StageSpec(
        stage="initial",
        key=recipe_key(**initial_recipe),
        problems=src,
        collect=collect,
        limits=params.limits,
        engine=identity,
    )
    later = {"key": "", "upstream": None}  # keyed once the upstream stage is done (`chained`)
    return {
        "initial": initial,
        "multiturn": initial.model_copy(update={"stage": "multiturn", **later}),
        "evaluation": initial.model_copy(update={"stage": "evaluation", **later}),
    }


def chained(spec: StageSpec, upstream: TrajectoryRef) -> StageSpec:
    """The spec with its upstream and the key that follows from it."""
    recipe = {
        "stage": spec.stage,
        "upstream": upstream.fingerprint,
        "problems": spec.problems.fingerprint,
        "limits": spec.limits.model_dump(),
        "code": code_version(*(MULTITURN_CODE if spec.stage == "multiturn" else EVALUATION_CODE)),
    }
    if spec.stage == "multiturn":
        recipe["collect"] = spec.collect.model_dump(mode="json")
        recipe["engine"] = spec.engine
    else:
        recipe["turns"] = spec.collect.turns
    return spec.model_copy(update={"upstream": upstream, "key": recipe_key(**recipe)})


_ENGINES: dict[str, Engine] = {}


def engine_for(config: EngineConfig) -> Engine:
    """One engine per config in this process: the stages share a loaded model."""
    key = config.model_dump_json()
    if key not in _ENGINES:
        _ENGINES[key] = make_engine(config)
    return _ENGINES[key]


def close_engines() -> int:
    """Close this process's engines (a served one stops its server and frees its GPUs); returns
    how many were open."""
    closed = 0
    while _ENGINES:
        _ENGINES.popitem()[1].close()
        closed += 1
    return closed


def read_stage(
    ref: TrajectoryRef,
    storage: StorageConfig,
    model: type[BaseModel] = Record,
    logger: Logger | None = None,
) -> dict[str, Any]:
    """The records of a finished step, by problem id."""
    st = open_storage(storage)
    with st.fs.open(ref.records_uri.removeprefix("s3://"), "rb") as f:
        records, _ = parse_records(f.read(), model, logger, ref.records_uri)
    return records


def initial_shard(
    shard: Shard, runtime: Runtime, *, logger: Logger = log, gate: Gate | None = None
) -> ShardRef:
    """Turn 0 of a shard's problems: n samples each (the cached first programs). `gate`: held
    while generating."""
    problems = shard_problems(shard, runtime)

    def body(path: Path, logger: Logger) -> dict[str, Any]:
        engine = engine_for(runtime.engine)
        _, stats = collect_initial(
            problems,
            engine,
            shard.spec.collect,
            path,
            per_call(runtime.batch, engine),
            gate=gate,
            progress=True,
            logger=logger,
        )
        return stats.as_dict()

    return run_shard(shard, runtime, body, logger)


def multiturn_shard(
    shard: Shard,
    runtime: Runtime,
    *,
    logger: Logger = log,
    gate: Gate | None = None,
    sandbox_gate: Gate | None = None,
) -> ShardRef:
    """Feedback turns of a shard's problems: feedback from the public (or perturbed) tests,
    repair, repeat."""
    spec = shard.spec
    assert spec.upstream is not None
    problems = shard_problems(shard, runtime)

    def body(path: Path, logger: Logger) -> dict[str, Any]:
        initial = read_stage(spec.upstream, runtime.storage, Record, logger)
        engine = engine_for(runtime.engine)
        with open_judge(runtime.sandbox, spec.limits) as judge:
            _, stats = collect_multiturn(
                problems,
                initial,
                engine,
                judge,
                spec.collect,
                path,
                per_call(runtime.batch, engine),
                feedback_kind="perturbed" if spec.problems.perturbed else "public",
                gate=gate,
                sandbox_gate=sandbox_gate,
                progress=True,
                logger=logger,
            )
        return stats.as_dict()

    return run_shard(shard, runtime, body, logger)


def evaluation_shard(
    shard: Shard, runtime: Runtime, *, logger: Logger = log, sandbox_gate: Gate | None = None
) -> ShardRef:
    """Every turn's program of a shard's problems on all true tests."""
    spec = shard.spec
    assert spec.upstream is not None
    problems = shard_problems(shard, runtime)

    def body(path: Path, logger: Logger) -> dict[str, Any]:
        records = read_stage(spec.upstream, runtime.storage, Record, logger)
        with open_judge(runtime.sandbox, spec.limits) as judge:
            _, stats = evaluate(
                problems,
                records,
                judge,
                spec.collect.turns,
                path,
                runtime.batch,
                gate=sandbox_gate,
                progress=True,
                logger=logger,
            )
        return stats.as_dict()

    return run_shard(shard, runtime, body, logger)


SHARD_STEPS = {
    "initial": initial_shard,
    "multiturn": multiturn_shard,
    "evaluation": evaluation_shard,
}


def run_step(spec: StageSpec, runtime: Runtime, *, logger: Logger = log) -> TrajectoryRef:
    """One step without Prefect (a notebook, a script): its shards one after another in this
    process, then merged. The flows run the same shards as tasks, locally or on a cluster."""
    step = SHARD_STEPS[spec.stage]
    refs = [step(shard, runtime, logger=logger) for shard in shards_of(spec, runtime)]
    return merge_shards(spec, refs, runtime, logger=logger)


def runtime_of(params: TrajectoryParams, ready: Ready) -> Runtime:
    return Runtime(
        engine=ready.engine,
        sandbox=params.sandbox,
        batch=params.batch,
        storage=params.storage,
        llm_limit=params.llm_limit,
        sandbox_limit=params.sandbox_limit,
        work_dir=params.work_dir,
        checkpoint_s=params.checkpoint_s,
        refresh=params.refresh,
    )
