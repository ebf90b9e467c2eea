"""The Prefect-bound half of the trajectory stage (docs/TRAJECTORIES.md): its parameters, how
problem sets are found and read, the storage layout of each stage (content-addressed JSONL under
`<storage>/trajectories/<stage>/<key>/`, MANIFEST.json written last), the three cached tasks
(initial -> multiturn -> evaluation) and the report. The logic they run is in
`tasks/trajectories.py` and `tasks/evaluation.py`, which import no Prefect; the flow and its CLI
are in `flows/trajectories.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from prefect import Task, get_run_logger, task
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engines import Engine, EngineConfig, make_engine
from sandbox import Limits, SandboxConfig, SyncJudge
from tasks.caching import bind, code_version, from_manifest, stage_policy
from tasks.evaluation import EvalRecord, evaluate, plot_pass_at_1, turn_table
from tasks.problems import Problem, from_table
from tasks.storage import (
    DatasetRef,
    StorageConfig,
    StorageError,
    default_work_dir,
    open_storage,
    recipe_key,
)
from tasks.tables import markdown_table
from tasks.trajectories import (
    BatchConfig,
    CollectConfig,
    Record,
    collect_initial,
    collect_multiturn,
    parse_records,
)
from tasks.verify import SandboxRuntime

RECORDS = "records.jsonl"
MANIFEST = "MANIFEST.json"
FORMAT = "cobalt-jsonl/1"
TINY_SEED = 0
TINY = "tiny"


class ProblemSetError(RuntimeError):
    """The problem set cannot be found or used; the message says what to pass."""


# --- parameters ---------------------------------------------------------------------------------


class TrajectoryParams(BaseModel):
    """Parameters of the trajectories flow, validated before any work starts."""

    model_config = ConfigDict(extra="forbid")

    problems: str = Field(
        "latest",
        description="'latest' (the newest problem sets of the data stage in this storage), a "
        "problem-set directory (holding MANIFEST.json), a .parquet / .jsonl file of problem "
        "records, or a raw source file as PATH:KIND (e.g. samples/apps_sample.jsonl:taco).",
    )
    table: str = Field("train", description="Problem set of a data-stage bundle: train, dev, test.")
    perturbed: bool = Field(
        False,
        description="Feedback from perturbed public tests (SPEC §1.7): the bundle's "
        "'<table>_perturbed' set, or problems perturbed here (seed 0); evaluation stays on the "
        "true tests. Off: feedback from the true public tests.",
    )
    limit: int | None = Field(None, ge=1, description="Only the first N problems (smoke runs).")
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig(kind="transformers", model=TINY),
        description=f"The reference LLM. Model '{TINY}' with the transformers engine: the tiny "
        "built-in model, built into the storage (or work_dir for S3) on first use.",
    )
    api_key_block: str | None = Field(
        None,
        description="Name of a Prefect Secret block holding the API key; it is put into the "
        "environment variable named by engine.api_key_env for this run (never logged).",
    )
    collect: CollectConfig = Field(default_factory=CollectConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    limits: Limits = Field(default_factory=Limits, description="Per-test sandbox limits.")
    sandbox: SandboxRuntime = Field(default_factory=SandboxRuntime)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    llm_limit: str | None = Field(
        None,
        description="Name of a Prefect global concurrency limit that flow runs sharing an "
        "LLM endpoint take one slot of while they generate (requests in flight per run: "
        "engine.concurrency).",
    )
    sandbox_limit: str | None = Field(
        None,
        description="Name of a Prefect global concurrency limit taken while judging "
        "(flow runs sharing a sandbox host).",
    )
    work_dir: str = Field(
        default_factory=default_work_dir,
        description="Local directory for the JSONL being written when storage is S3 (synced "
        "there every checkpoint_s) and for the tiny model (env COBALT_WORK_DIR).",
    )
    checkpoint_s: float = Field(
        60,
        gt=0,
        description="S3: seconds between uploads of the "
        "JSONL being written (what a resume elsewhere starts from).",
    )
    refresh: bool = Field(False, description="Recompute every stage, ignoring finished ones.")


class ProblemSource(BaseModel):
    """A resolved problem set: where it is read from and what it holds (its fingerprint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["dataset", "file", "source"]
    uri: str
    table: str | None = None
    perturbed: bool = False
    limit: int | None = None
    count: int
    fingerprint: str = Field(description="sha256 of the selected problems (tests included).")
    instructions: str = Field(description="sha256 of the (id, instruction) pairs only.")


class Runtime(BaseModel):
    """How stages run: never part of a cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig
    sandbox: SandboxRuntime
    batch: BatchConfig
    storage: StorageConfig
    llm_limit: str | None = None
    sandbox_limit: str | None = None
    work_dir: str
    checkpoint_s: float = 60
    refresh: bool = False


class StageSpec(BaseModel):
    """What determines a stage's content (its cache key and storage key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Literal["initial", "multiturn", "evaluation"]
    key: str
    problems: ProblemSource
    collect: CollectConfig
    limits: Limits
    engine: dict[str, Any] = Field(description="What of the engine decides its output.")
    upstream: TrajectoryRef | None = None


class TrajectoryRef(BaseModel):
    """A finished stage: what tasks pass on (small)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    key: str
    uri: str = Field(description="The stage directory (MANIFEST.json, records.jsonl).")
    rows: int
    fingerprint: str = Field(description="sha256 of records.jsonl.")
    stats: dict[str, Any] = Field(default_factory=dict)

    @property
    def records_uri(self) -> str:
        return f"{self.uri}/{RECORDS}"


StageSpec.model_rebuild()


class TrajectorySummary(BaseModel):
    initial: TrajectoryRef
    multiturn: TrajectoryRef
    evaluation: TrajectoryRef
    table: list[dict[str, Any]]
    plot: str
    line: str


# --- preflight: fail fast, before any work ------------------------------------------------------


class Ready(BaseModel):
    problems: ProblemSource
    engine: EngineConfig


def preflight(params: TrajectoryParams) -> Ready:
    """Storage usable, problem set found and non-empty, engine usable (model present, API key
    set). Raises StorageError / ProblemSetError / MissingAPIKeyError naming what to set."""
    storage = open_storage(params.storage)
    storage.check()
    engine = params.engine
    if engine.kind == "transformers" and engine.model == TINY:
        engine = engine.model_copy(update={"model": str(tiny_model(params))})
    if params.api_key_block:
        load_api_key(params.api_key_block, engine)
    if engine.kind == "litellm":
        engine.api_key()  # MissingAPIKeyError names the variable
    elif not Path(engine.model).is_dir():
        raise ProblemSetError(
            f"model directory {engine.model} not found: local engines load a downloaded model "
            "directory (--model PATH); leave --model out for the tiny built-in model"
        )
    source = resolve_problems(params)
    return Ready(problems=source, engine=engine)


def load_api_key(block: str, engine: EngineConfig) -> None:
    """Put the key of Prefect Secret block `block` into the variable the engine reads."""
    from prefect.blocks.system import Secret

    if not engine.api_key_env:
        raise ProblemSetError(
            f"api_key_block {block!r} needs engine.api_key_env (--api-key-env VAR): the name of "
            "the environment variable the engine reads the key from"
        )
    try:
        secret = Secret.load(block)
    except ValueError as e:
        raise ProblemSetError(
            f"Prefect Secret block {block!r} not found: create it with "
            f"`Secret(value=...).save({block!r})` or in the UI (Blocks > Secret)"
        ) from e
    os.environ[engine.api_key_env] = secret.get()


def tiny_model(params: TrajectoryParams) -> Path:
    """The embedded default model, built once into the storage (or work_dir for S3)."""
    storage = open_storage(params.storage)
    base = Path(storage.root) if params.storage.is_local else Path(params.work_dir)
    path = base / "models" / f"tiny-seed{TINY_SEED}"
    if not (path / "tiny_model.json").exists():
        from engines.tiny import build_tiny_model

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=path.parent))
        build_tiny_model(tmp, seed=TINY_SEED)
        try:
            os.replace(tmp, path)
        except OSError:  # another run built it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def resolve_problems(params: TrajectoryParams) -> ProblemSource:
    """Where the problems come from, checked, with the fingerprint of the selection."""
    storage = open_storage(params.storage)
    text = params.problems
    table: str | None = None
    if text == "latest":
        pointer = storage.path("datasets", "problemsets", "LATEST.json")
        if not storage.fs.exists(pointer):
            raise ProblemSetError(
                f"no problem sets in {storage.url()} yet: run `python -m flows.data` with the "
                "same --storage first, or pass --problems PATH (a problem-set directory, a "
                ".parquet/.jsonl of problems, or a raw source file as PATH:KIND)"
            )
        kind, uri = "dataset", storage.read_json(pointer)["uri"]
    elif _is_source_spec(text):
        kind, uri = "source", text
    elif text.endswith((".parquet", ".jsonl", ".json")):
        kind, uri = "file", text
    else:
        kind, uri = "dataset", text
    if kind == "dataset":
        table = params.table + ("_perturbed" if params.perturbed else "")
    source = ProblemSource(
        kind=kind,
        uri=uri,
        table=table,
        perturbed=params.perturbed,
        limit=params.limit,
        count=0,
        fingerprint="",
        instructions="",
    )
    problems = _read_problems(source, params.storage)
    if not problems:
        raise ProblemSetError(f"the problem set {uri} ({table or kind}) has no problems to use")
    return source.model_copy(
        update={
            "count": len(problems),
            "fingerprint": _fingerprint(problems),
            "instructions": _hash([[p.id, p.instruction] for p in problems]),
        }
    )


def _is_source_spec(text: str) -> bool:
    head, _, kind = text.partition("?")[0].rpartition(":")
    return bool(head) and kind in ("taco", "cobalt", "lcb", "codecontests") and "://" not in kind


def _hash(value: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _fingerprint(problems: list[Problem]) -> str:
    return _hash([p.model_dump(mode="json", exclude={"solutions"}) for p in problems])


def load_problems(source: ProblemSource, storage: StorageConfig) -> list[Problem]:
    """The problems of a resolved source (checked against its fingerprint)."""
    problems = _read_problems(source, storage)
    if source.fingerprint and _fingerprint(problems) != source.fingerprint:
        raise ProblemSetError(f"the problem set {source.uri} changed during the run")
    return problems


def _read_problems(source: ProblemSource, storage_config: StorageConfig) -> list[Problem]:
    key = source.model_copy(update={"count": 0, "fingerprint": "", "instructions": ""})
    return list(_read_cached(key, storage_config, _stamp(source)))


def _stamp(source: ProblemSource) -> tuple[int, int] | None:
    """Local files: (mtime, size), so an edited file is read again (bundles are immutable)."""
    path = Path(source.uri.rsplit(":", 1)[0] if source.kind == "source" else source.uri)
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


@lru_cache(maxsize=4)
def _read_cached(
    source: ProblemSource, storage_config: StorageConfig, stamp: tuple[int, int] | None
) -> tuple[Problem, ...]:
    storage = open_storage(storage_config)
    try:
        if source.kind == "dataset":
            try:
                manifest = storage.read_manifest(source.uri)
            except StorageError as exc:
                raise ProblemSetError(str(exc)) from None
            ref = DatasetRef.model_validate(
                {k: manifest[k] for k in DatasetRef.model_fields if k in manifest}
            )
            if source.table not in ref.tables:
                raise ProblemSetError(
                    f"problem-set bundle {source.uri} has no table {source.table!r} (it has "
                    f"{', '.join(sorted(ref.tables))}): pick one with --table"
                )
            problems = storage.read_problems(ref, source.table)
        elif source.kind == "file":
            problems = _read_file(source.uri)
        else:
            from tasks.data import file_revision
            from tasks.sources import LoadConfig, SourceSpec
            from tasks.sources import load_problems as load_source

            spec = SourceSpec.parse(source.uri)
            problems, _ = load_source(spec, file_revision(spec.uri), LoadConfig())
    except FileNotFoundError as exc:
        raise ProblemSetError(f"problem set {source.uri} not found ({exc})") from None
    problems = [_feedback_view(p, source.perturbed) for p in problems]
    problems = [p for p in problems if p is not None]
    return tuple(problems[: source.limit] if source.limit else problems)


def _read_file(uri: str) -> list[Problem]:
    import fsspec

    with fsspec.open(uri, "rb") as f:
        data = f.read()
    if uri.endswith(".parquet"):
        import io

        import pyarrow.parquet as pq

        return from_table(pq.read_table(io.BytesIO(data)))
    try:
        return [Problem.model_validate_json(line) for line in data.splitlines() if line.strip()]
    except ValidationError as exc:
        raise ProblemSetError(
            f"{uri} is not a JSONL of problem records ({exc.errors()[0]['msg']}); for raw "
            "dataset rows pass PATH:KIND (taco, cobalt, lcb, codecontests)"
        ) from None


def _feedback_view(problem: Problem, perturbed: bool) -> Problem | None:
    """Perturbed on: the problem with perturbed public tests (made here if it has none; None if
    it cannot be perturbed). Off: without them, so feedback comes from the true public tests."""
    if not perturbed:
        return problem.model_copy(update={"perturbed_public_tests": None, "modified_tests": None})
    if problem.perturbed_public_tests is not None:
        return problem
    from tasks.splits import perturb_problem
    from tasks.tally import Rejected

    try:
        return perturb_problem(problem, seed=0)
    except Rejected:
        return None


# --- stages -----------------------------------------------------------------------------------

INITIAL_CODE = (
    "tasks.trajectories.collect_initial",
    "tasks.trajectories.make_turn",
    "tasks.trajectories.extract_code",
    "tasks.trajectories.Record",
    "tasks.trajectories.Turn",
)
MULTITURN_CODE = ("tasks.trajectories",)
EVALUATION_CODE = ("tasks.evaluation", "sandbox.compare")
IDENTITY = ("kind", "model", "dtype", "extra")  # engine fields that decide what is generated


def engine_identity(engine: EngineConfig) -> dict[str, Any]:
    identity = {k: v for k, v in engine.model_dump(mode="json").items() if k in IDENTITY}
    identity["extra"] = {k: v for k, v in identity["extra"].items() if "key" not in k.lower()}
    if engine.kind != "litellm" and (config := Path(engine.model, "config.json")).exists():
        identity["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()[:16]
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


def close_engines() -> None:
    while _ENGINES:
        _ENGINES.popitem()[1].close()


def _gate(name: str | None) -> Callable[[], AbstractContextManager[Any]] | None:
    if not name:
        return None
    from prefect.concurrency.sync import concurrency

    return lambda: concurrency(name, occupy=1)


def _judge(spec: StageSpec, runtime: Runtime) -> SyncJudge:
    return SyncJudge(
        SandboxConfig(
            backend=runtime.sandbox.backend,
            concurrency=runtime.sandbox.concurrency,
            limits=spec.limits,
        )
    )


def run_stage(
    spec: StageSpec, runtime: Runtime, body: Callable[[Path, Any], dict[str, Any]]
) -> TrajectoryRef:
    """Run `body(local_jsonl, logger)` into the stage's directory and commit its manifest.

    Local storage: the JSONL is written in place. S3: in `work_dir` (resumed from the uploaded
    copy when the local one is missing), uploaded every `checkpoint_s` and at the end. A
    directory whose manifest exists is finished: returned as is (unless refresh).
    """
    logger = get_run_logger()
    st = open_storage(runtime.storage)
    directory = st.path("trajectories", spec.stage, spec.key)
    manifest_path, remote = f"{directory}/{MANIFEST}", f"{directory}/{RECORDS}"
    local = (
        Path(remote)
        if runtime.storage.is_local
        else Path(runtime.work_dir, "spool", spec.stage, spec.key, RECORDS)
    )
    if runtime.refresh:
        for path in (manifest_path, remote):
            if st.fs.exists(path):
                st.fs.rm(path)
        local.unlink(missing_ok=True)
    elif st.fs.exists(manifest_path):
        logger.info("%s: %s is finished already", spec.stage, directory)
        manifest = st.read_json(manifest_path)
        return from_manifest(manifest, TrajectoryRef)
    if not runtime.storage.is_local and not local.exists() and st.fs.exists(remote):
        local.parent.mkdir(parents=True, exist_ok=True)
        st.fs.get_file(remote, str(local))
        logger.info("%s: resuming from %s", spec.stage, st.url(remote))
    stop = threading.Event()
    uploader = None
    if not runtime.storage.is_local:

        def upload_periodically() -> None:
            while not stop.wait(runtime.checkpoint_s):
                _upload(st, local, remote)

        uploader = threading.Thread(target=upload_periodically, daemon=True)
        uploader.start()
    try:
        stats = body(local, logger)
    finally:
        stop.set()
        if uploader is not None:
            uploader.join()
    data = local.read_bytes()
    if not runtime.storage.is_local:
        st.write_atomic(remote, data)
    ref = TrajectoryRef(
        stage=spec.stage,
        key=spec.key,
        uri=st.protocol + directory,
        rows=data.count(b"\n"),
        fingerprint="sha256:" + hashlib.sha256(data).hexdigest(),
        stats=stats,
    )
    manifest = {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "spec": spec.model_dump(mode="json"),
        **ref.model_dump(mode="json"),
    }
    st.write_atomic(manifest_path, json.dumps(manifest, indent=1, default=str).encode())
    logger.info(
        "%s: %d records at %s (%s)",
        spec.stage,
        ref.rows,
        ref.uri,
        ", ".join(f"{k} {v}" for k, v in stats.items() if k != "outcomes"),
    )
    return ref


def _upload(st: Any, local: Path, remote: str) -> None:
    try:
        data = local.read_bytes()
    except FileNotFoundError:
        return
    st.write_atomic(remote, data[: data.rfind(b"\n") + 1])


def read_stage(
    ref: TrajectoryRef, runtime: Runtime, model: type[BaseModel] = Record, logger: Any = None
) -> dict[str, Any]:
    st = open_storage(runtime.storage)
    with st.fs.open(ref.records_uri.removeprefix("s3://"), "rb") as f:
        records, _ = parse_records(f.read(), model, logger, ref.records_uri)
    return records


def initial_stage(spec: StageSpec, runtime: Runtime) -> TrajectoryRef:
    problems = load_problems(spec.problems, runtime.storage)

    def body(path: Path, logger: Any) -> dict[str, Any]:
        _, stats = collect_initial(
            problems,
            engine_for(runtime.engine),
            spec.collect,
            path,
            runtime.batch,
            gate=_gate(runtime.llm_limit),
            progress=True,
            logger=logger,
        )
        return stats.as_dict()

    return run_stage(spec, runtime, body)


def multiturn_stage(spec: StageSpec, runtime: Runtime) -> TrajectoryRef:
    assert spec.upstream is not None
    problems = load_problems(spec.problems, runtime.storage)

    def body(path: Path, logger: Any) -> dict[str, Any]:
        initial = read_stage(spec.upstream, runtime, Record, logger)
        with _judge(spec, runtime) as judge:
            _, stats = collect_multiturn(
                problems,
                initial,
                engine_for(runtime.engine),
                judge,
                spec.collect,
                path,
                runtime.batch,
                feedback_kind="perturbed" if spec.problems.perturbed else "public",
                gate=_gate(runtime.llm_limit),
                sandbox_gate=_gate(runtime.sandbox_limit),
                progress=True,
                logger=logger,
            )
        return stats.as_dict()

    return run_stage(spec, runtime, body)


def evaluation_stage(spec: StageSpec, runtime: Runtime) -> TrajectoryRef:
    assert spec.upstream is not None
    problems = load_problems(spec.problems, runtime.storage)

    def body(path: Path, logger: Any) -> dict[str, Any]:
        records = read_stage(spec.upstream, runtime, Record, logger)
        with _judge(spec, runtime) as judge:
            _, stats = evaluate(
                problems,
                records,
                judge,
                spec.collect.turns,
                path,
                runtime.batch,
                gate=_gate(runtime.sandbox_limit),
                progress=True,
                logger=logger,
            )
        return stats.as_dict()

    return run_stage(spec, runtime, body)


# --- tasks: thin cached wrappers ----------------------------------------------------------------


@task(
    name="initial",
    task_run_name="initial-{key}",
    cache_policy=stage_policy(*INITIAL_CODE),
    retries=1,
    retry_delay_seconds=5,
)
def initial_task(key: str, spec: StageSpec, runtime: Runtime) -> TrajectoryRef:
    """Turn 0: n samples per problem (the cached first programs)."""
    return initial_stage(spec, runtime)


@task(
    name="multiturn",
    task_run_name="multiturn-{key}",
    cache_policy=stage_policy(*MULTITURN_CODE),
    retries=1,
    retry_delay_seconds=5,
)
def multiturn_task(key: str, spec: StageSpec, runtime: Runtime) -> TrajectoryRef:
    """Feedback turns: public-test feedback, repair, repeat (resumes a killed run)."""
    return multiturn_stage(spec, runtime)


@task(
    name="evaluation",
    task_run_name="evaluation-{key}",
    cache_policy=stage_policy(*EVALUATION_CODE),
    retries=1,
    retry_delay_seconds=5,
)
def evaluation_task(key: str, spec: StageSpec, runtime: Runtime) -> TrajectoryRef:
    """Every turn's program on all true tests."""
    return evaluation_stage(spec, runtime)


class Stages:
    """The stage tasks bound to the run's storage (results, cache records, --refresh)."""

    def __init__(self, params: TrajectoryParams, ready: Ready):
        st = open_storage(params.storage)
        self.specs = stage_specs(params, ready)
        self.runtime = Runtime(
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
        bound: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (
                ("initial", initial_task),
                ("multiturn", multiturn_task),
                ("evaluation", evaluation_task),
            )
        }
        self.tasks = bound

    def _run(self, spec: StageSpec) -> TrajectoryRef:
        return self.tasks[spec.stage](spec.key, spec, self.runtime)

    def initial(self) -> TrajectoryRef:
        return self._run(self.specs["initial"])

    def multiturn(self, initial: TrajectoryRef) -> TrajectoryRef:
        return self._run(chained(self.specs["multiturn"], initial))

    def evaluation(self, multiturn: TrajectoryRef) -> TrajectoryRef:
        return self._run(chained(self.specs["evaluation"], multiturn))


# --- report ---------------------------------------------------------------------------------------


def report(
    params: TrajectoryParams,
    ready: Ready,
    initial: TrajectoryRef,
    multiturn: TrajectoryRef,
    evaluation: TrajectoryRef,
    runtime: Runtime,
) -> TrajectorySummary:
    """Per-turn Pass@1 table (artifact, JSON and markdown in storage), PNG plot in storage with
    image and markdown artifacts pointing at it, and a summary line in the log."""
    from prefect.artifacts import (
        create_image_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    st = open_storage(params.storage)
    evals = read_stage(evaluation, runtime, EvalRecord, get_run_logger())
    table = turn_table(evals.values(), params.collect.turns)
    directory = evaluation.uri.removeprefix("s3://")
    source = ready.problems
    what = f"{source.uri}{' [' + source.table + ']' if source.table else ''}" + (
        " (perturbed feedback)" if source.perturbed else ""
    )
    title = f"Pass@1 per turn: {ready.engine.model.rsplit('/', 1)[-1]}, {source.count} problems"
    plot_path = f"{directory}/pass_at_1.png"
    st.write_atomic(plot_path, plot_pass_at_1(table, title))
    st.write_atomic(f"{directory}/table.json", json.dumps(table, indent=1).encode())
    st.write_atomic(f"{directory}/table.md", (markdown_table(table) + "\n").encode())
    plot_url = Path(plot_path).as_uri() if params.storage.is_local else st.protocol + plot_path
    all_rows = [r for r in table if r["difficulty"] == "all"]
    first, last = all_rows[0], all_rows[-1]
    change = last["change_vs_turn0"]
    line = (
        f"trajectories: {source.count} problems x {params.collect.sampling.n} samples, "
        f"{params.collect.turns} feedback turns; Pass@1 {first['pass@1']}% at turn 0 -> "
        f"{last['pass@1']}% at turn {last['turn']}"
        f"{'' if change is None else f' ({change:+.1f}%)'}; problems from {what}; "
        f"records at {multiturn.uri}"
    )
    create_table_artifact(
        table=table,
        key="trajectories-pass-at-1",
        description="Pass@1 (%) per turn and difficulty, relative change to "
        "turn 0 (%), mean test pass rate, turns without a program",
    )
    create_image_artifact(
        image_url=plot_url, key="trajectories-plot", description="Pass@1 per turn (PNG in storage)"
    )
    create_markdown_artifact(
        key="trajectories-summary",
        markdown=(
            f"# Trajectories\n\n{line}\n\n{markdown_table(table)}\n\n"
            f"Plot: [{plot_url}]({plot_url})\n\nStages: initial `{initial.uri}`, multiturn "
            f"`{multiturn.uri}`, evaluation `{evaluation.uri}`\n"
        ),
    )
    st.write_atomic(
        st.path("trajectories", "LATEST.json"),
        json.dumps(
            {
                "evaluation": evaluation.uri,
                "multiturn": multiturn.uri,
                "at": datetime.now(UTC).isoformat(),
            }
        ).encode(),
    )
    get_run_logger().info(line)
    return TrajectorySummary(
        initial=initial,
        multiturn=multiturn,
        evaluation=evaluation,
        table=table,
        plot=plot_url,
        line=line,
    )
