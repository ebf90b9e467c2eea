"""The Prefect-bound half of the training stage (docs/TRAINING.md): its parameters, how a finished
trajectories run is found, the two cached tasks (bandit dataset -> GRPO training), their storage
layout and the report. The logic is plain: `tasks/bandit.py` (SPEC §1.4), `tasks/reward.py`
(§1.5), `tasks/training.py` (§1.6, TRL's GRPOTrainer) and `tasks/step_timing.py`.

Storage layout (content-addressed like the other stages, MANIFEST.json written last):

    <storage>/bandit/<key>/data.parquet   the bandit dataset (prompt, test_cases, prev_best, ...)
    <storage>/training/<key>/             the trained model (save_pretrained) + log_history.json,
                                          rewards.png, checkpoint-N/ while it runs
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import Task, get_run_logger, task
from pydantic import BaseModel, ConfigDict, Field

from sandbox import SandboxConfig
from tasks.bandit import FEEDBACK_TURNS, MAX_PROMPT_TOKENS, bandit_rows, problem_data_from_eval
from tasks.caching import bind, code_version, from_manifest, stage_policy
from tasks.evaluation import EvalRecord
from tasks.storage import StorageConfig, StorageError, default_work_dir, open_storage, recipe_key
from tasks.tables import markdown_table
from tasks.training import TrainingConfig, last_checkpoint, prepare_rows, train
from tasks.trajectories import Record
from tasks.trajectory_stages import (
    ProblemSetError,
    ProblemSource,
    TrajectoryRef,
    load_problems,
    read_stage,
)
from tasks.trajectory_stages import (
    Runtime as TrajectoryRuntime,
)
from tasks.verify import SandboxRuntime

MANIFEST = "MANIFEST.json"
DATA = "data.parquet"
BANDIT_CODE = ("tasks.bandit", "tasks.training.prepare_rows")
TRAINING_CODE = ("tasks.training", "tasks.reward", "tasks.trajectories.extract_code")


class EmptyStageError(RuntimeError):
    """A stage produced nothing to pass on; the message says why and what to change."""


# --- parameters ---------------------------------------------------------------------------------


class BanditConfig(BaseModel):
    """How the bandit dataset is built from trajectories (SPEC §1.4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["train", "validation"] = Field(
        "train",
        description="train: dynamic sampling + max-variance down-sampling to 4 samples; "
        "validation: the one sample with the smallest positive diff.",
    )
    max_prompt_tokens: int = Field(
        MAX_PROMPT_TOKENS,
        ge=1,
        description="A partial context longer than this (policy tokenizer and chat template) "
        "ends its sample's contexts (paper: 10000).",
    )
    feedback_turns: int = Field(FEEDBACK_TURNS, ge=1, description="Deepest context kept (3).")
    seed: int = Field(0, description="Shuffle seed of the rows.")
    perturbed_ratio: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of the repair contexts (turn depth >= 1) taken from trajectories "
        "collected with perturbed public-test feedback (SPEC §1.7's mitigation); needs the "
        "training flow's `perturbed` trajectories. 0: none.",
    )


class TrainingParams(BaseModel):
    """Parameters of the training flow, validated before any work starts."""

    model_config = ConfigDict(extra="forbid")

    trajectories: str = Field(
        "latest",
        description="'latest' (the newest trajectories run in this storage) or the directory of "
        "a finished evaluation stage (<storage>/trajectories/evaluation/<key>).",
    )
    perturbed: str | None = Field(
        None,
        description="Evaluation stage directory of a trajectories run with perturbed feedback "
        "(`flows.trajectories --perturbed`), mixed in at bandit.perturbed_ratio.",
    )
    model: str | None = Field(
        None,
        description="The policy to train: a local model directory. Default: the model that "
        "collected the trajectories (when that was a local model).",
    )
    bandit: BanditConfig = Field(default_factory=BanditConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    sandbox: SandboxRuntime = Field(default_factory=SandboxRuntime)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    work_dir: str = Field(
        default_factory=default_work_dir,
        description="Local directory for checkpoints and models when storage is S3.",
    )
    refresh: bool = Field(False, description="Recompute every stage, ignoring finished ones.")


class Trajectories(BaseModel):
    """A finished trajectories run, as the training stage needs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    evaluation: TrajectoryRef
    multiturn: TrajectoryRef
    problems: ProblemSource
    engine: dict[str, Any] = Field(description="Identity of the engine that collected them.")


class Ready(BaseModel):
    trajectories: Trajectories
    perturbed: Trajectories | None = None
    model: str
    model_identity: str


# --- preflight ----------------------------------------------------------------------------------


def preflight(params: TrainingParams) -> Ready:
    """Storage usable, trajectories found and finished, policy model present. Raises
    StorageError / ProblemSetError naming what to pass."""
    storage = open_storage(params.storage)
    storage.check()
    check_training(params.training)
    found = find_trajectories(params.trajectories, params.storage)
    model = params.model or found.engine.get("model")
    if found.engine.get("kind") == "litellm" and not params.model:
        raise ProblemSetError(
            f"the trajectories were collected through an API ({found.engine.get('model')}): "
            "pass the policy's local weights with --model PATH"
        )
    if not model or not Path(model, "config.json").exists():
        raise ProblemSetError(
            f"policy model directory {model} not found (it needs config.json): pass --model PATH, "
            "a directory saved with save_pretrained"
        )
    perturbed = None
    if params.bandit.perturbed_ratio > 0:
        if not params.perturbed:
            raise ProblemSetError(
                "bandit.perturbed_ratio > 0 needs --perturbed DIR: the evaluation stage of a "
                "trajectories run with perturbed feedback (python -m flows.trajectories "
                "--perturbed)"
            )
        perturbed = find_trajectories(params.perturbed, params.storage)
        if not perturbed.problems.perturbed:
            raise ProblemSetError(f"{params.perturbed} was collected with true feedback")
    return Ready(
        trajectories=found,
        perturbed=perturbed,
        model=str(model),
        model_identity=model_identity(model),
    )


def check_training(config: TrainingConfig) -> None:
    try:
        config.check()
    except ValueError as exc:
        raise ProblemSetError(f"{exc} (set the GRPOConfig field with --set KEY=VALUE)") from None


def find_trajectories(where: str, storage_config: StorageConfig) -> Trajectories:
    """The evaluation stage named by `where` ('latest' or its directory) and its upstream."""
    st = open_storage(storage_config)
    if where == "latest":
        pointer = st.path("trajectories", "LATEST.json")
        if not st.fs.exists(pointer):
            raise ProblemSetError(
                f"no trajectories in {st.url()} yet: run `python -m flows.trajectories` with the "
                "same --storage first, or pass --trajectories DIR (an evaluation stage directory)"
            )
        where = st.read_json(pointer)["evaluation"]
    manifest_path = f"{where.removeprefix('s3://').rstrip('/')}/{MANIFEST}"
    if not st.fs.exists(manifest_path):
        raise ProblemSetError(
            f"{where} is not a finished evaluation stage (no {MANIFEST}): pass "
            "<storage>/trajectories/evaluation/<key> of a completed trajectories run"
        )
    manifest = st.read_json(manifest_path)
    spec = manifest.get("spec") or {}
    if spec.get("stage") != "evaluation" or not spec.get("upstream"):
        raise ProblemSetError(f"{where} holds a {spec.get('stage')!r} stage, not 'evaluation'")
    evaluation = from_manifest(manifest, TrajectoryRef)
    return Trajectories(
        evaluation=evaluation,
        multiturn=TrajectoryRef.model_validate(spec["upstream"]),
        problems=ProblemSource.model_validate(spec["problems"]),
        engine=spec.get("engine") or {},
    )


def model_identity(path: str | Path) -> str:
    """sha256 over a model directory's config, tokenizer and weight files (weights by content up
    to 2 GB in all, by name and size beyond)."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file())
    digest = hashlib.sha256()
    weights = [p for p in files if p.suffix in (".safetensors", ".bin")]
    by_content = sum(p.stat().st_size for p in weights) <= 2 << 30
    for p in files:
        if p.suffix in (".json", ".txt", ".model", ".jinja") or (p in weights and by_content):
            digest.update(p.name.encode() + b"\0" + p.read_bytes())
        elif p in weights:
            digest.update(f"{p.name}:{p.stat().st_size}".encode())
    return "sha256:" + digest.hexdigest()


# --- specs and refs ------------------------------------------------------------------------------


class Runtime(BaseModel):
    """How stages run: never part of a cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    sandbox: SandboxRuntime
    storage: StorageConfig
    work_dir: str
    refresh: bool = False


class BanditSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    trajectories: Trajectories
    perturbed: Trajectories | None = None
    config: BanditConfig
    tokenizer: str = Field(description="Identity of the policy (its tokenizer counts tokens).")


class BanditRef(BaseModel):
    """A finished bandit dataset."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    uri: str = Field(description="Directory holding data.parquet and MANIFEST.json.")
    rows: int
    fingerprint: str
    stats: dict[str, Any] = Field(default_factory=dict)

    @property
    def data_uri(self) -> str:
        return f"{self.uri}/{DATA}"


class TrainingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    dataset: BanditRef
    model: str = Field(description="Identity (content hash) of the starting policy.")
    config: TrainingConfig


class PolicyRef(BaseModel):
    """A trained policy in storage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    uri: str = Field(description="The model directory (save_pretrained) in storage.")
    steps: int
    stats: dict[str, Any] = Field(default_factory=dict)
    plot: str = ""


def bandit_spec(params: TrainingParams, ready: Ready) -> BanditSpec:
    recipe = {
        "stage": "bandit",
        "evaluation": ready.trajectories.evaluation.fingerprint,
        "multiturn": ready.trajectories.multiturn.fingerprint,
        "problems": ready.trajectories.problems.fingerprint,
        "perturbed": ready.perturbed.evaluation.fingerprint if ready.perturbed else None,
        "config": params.bandit.model_dump(mode="json"),
        "tokenizer": ready.model_identity,
        "code": code_version(*BANDIT_CODE),
    }
    return BanditSpec(
        key=recipe_key(**recipe),
        trajectories=ready.trajectories,
        perturbed=ready.perturbed,
        config=params.bandit,
        tokenizer=ready.model_identity,
    )


def training_spec(params: TrainingParams, ready: Ready, dataset: BanditRef) -> TrainingSpec:
    config = params.training.model_copy(update={"sandbox": SandboxConfig()})  # runtime only
    recipe = {
        "stage": "training",
        "dataset": dataset.fingerprint,
        "model": ready.model_identity,
        "config": config.model_dump(mode="json"),
        "code": code_version(*TRAINING_CODE),
    }
    return TrainingSpec(
        key=recipe_key(**recipe), dataset=dataset, model=ready.model_identity, config=config
    )


# --- bandit dataset -----------------------------------------------------------------------------


def _tokens_counter(model: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    return prompt_tokens


def _trajectory_runtime(runtime: Runtime) -> Any:
    from engines import EngineConfig

    return TrajectoryRuntime(
        engine=EngineConfig(kind="transformers", model=runtime.model),
        sandbox=runtime.sandbox,
        batch={},
        storage=runtime.storage,
        work_dir=runtime.work_dir,
    )


def _problem_data(found: Trajectories, runtime: Runtime) -> list[Any]:
    problems = load_problems(found.problems, runtime.storage)
    trt = _trajectory_runtime(runtime)
    records = read_stage(found.multiturn, trt, Record)
    evals = read_stage(found.evaluation, trt, EvalRecord)
    return [
        problem_data_from_eval(records[p.id], evals[p.id], p.tests)  # rewards: the true tests
        for p in problems
        if p.id in records and p.id in evals
    ]


def build_bandit_rows(spec: BanditSpec, runtime: Runtime) -> tuple[list[dict[str, Any]], dict]:
    """The bandit rows of a trajectories run and their stats (plain: no storage writes)."""
    config = spec.config
    counter = _tokens_counter(runtime.model)

    def rows_of(data: list[Any]) -> list[dict[str, Any]]:
        return bandit_rows(
            data,
            config.mode,
            counter,
            seed=config.seed,
            max_prompt_tokens=config.max_prompt_tokens,
            feedback_turns=config.feedback_turns,
        )

    data = _problem_data(spec.trajectories, runtime)
    rows = rows_of(data)
    stats = bandit_stats(data, rows)
    if spec.perturbed is not None and config.perturbed_ratio > 0:
        extra = [r for r in rows_of(_problem_data(spec.perturbed, runtime)) if _depth(r) > 0]
        rows, taken = mix_perturbed(rows, extra, config.perturbed_ratio, config.seed)
        stats["perturbed_contexts"] = taken
        stats["rows"] = len(rows)
    rows = prepare_rows(rows, "cobalt")  # test_cases as JSON text: one parquet schema
    return rows, stats


def mix_perturbed(
    rows: list[dict[str, Any]], perturbed: list[dict[str, Any]], ratio: float, seed: int
) -> tuple[list[dict[str, Any]], int]:
    """Add repair contexts from perturbed-feedback trajectories so that they make up `ratio` of
    all repair contexts (as many as there are, if fewer); returns the rows, reshuffled, and how
    many were added."""
    import random

    repairs = sum(1 for r in rows if _depth(r) > 0)
    wanted = round(ratio / (1 - ratio) * repairs)
    rng = random.Random(seed)
    taken = rng.sample(perturbed, min(wanted, len(perturbed)))
    mixed = rows + [{**r, "example_id": f"{r['example_id']}#perturbed"} for r in taken]
    rng.shuffle(mixed)
    return mixed, len(taken)


def bandit_stats(data: list[Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Problems in / skipped / kept, contexts per turn depth, prev_best and turn-0 pass rates."""
    solved = sum(1 for d in data if d.combined() and all(r and r[0] >= 1.0 for r in d.combined()))
    kept_partial = {r["example_id"] for r in rows if _depth(r) > 0}
    depths = Counter(_depth(r) for r in rows)
    bins = ("0", "(0,0.5)", "[0.5,1)", "1")

    def bin_of(x: float) -> str:
        return "0" if x <= 0 else "1" if x >= 1 else "(0,0.5)" if x < 0.5 else "[0.5,1)"

    prev = Counter(bin_of(r["prev_best_pass_rate"]) for r in rows if _depth(r) > 0)
    turn0 = Counter(
        bin_of(sum(r[0] for r in d.combined()) / len(d.combined())) for d in data if d.combined()
    )
    return {
        "problems": len(data),
        "skipped_all_solved": solved,
        "problems_with_repairs": len(kept_partial),
        "rows": len(rows),
        "contexts_by_depth": {str(k): depths[k] for k in sorted(depths)},
        "prev_best_pass_rate": {b: prev[b] for b in bins},
        "turn0_mean_pass_rate": {b: turn0[b] for b in bins},
    }


def _depth(row: dict[str, Any]) -> int:
    return sum(1 for m in row["prompt"] if m["role"] == "assistant")


def empty_reason(stats: dict[str, Any]) -> str:
    return (
        f"the bandit dataset is empty: {stats['problems']} problems, {stats['skipped_all_solved']} "
        "of them solved by every first sample (skipped). Collect trajectories on problems the "
        "reference model does not always solve, with more samples (--n) or feedback turns "
        "(--turns), or a stronger reference model"
    )


def no_repairs_reason(stats: dict[str, Any]) -> str:
    return (
        f"the bandit dataset has no repair contexts: of {stats['problems']} problems "
        f"({stats['skipped_all_solved']} solved by every first sample), no sample was solved "
        "after failing, so cobalt training would be single-turn training. Collect more samples "
        "(--n) or feedback turns (--turns), use a stronger reference model, or train with "
        "--mode single_turn"
    )


def bandit_stage(spec: BanditSpec, runtime: Runtime) -> BanditRef:
    logger = get_run_logger()
    st = open_storage(runtime.storage)
    directory = st.path("bandit", spec.key)
    manifest_path = f"{directory}/{MANIFEST}"
    if not runtime.refresh and st.fs.exists(manifest_path):
        logger.info("bandit: %s is finished already", directory)
        return from_manifest(st.read_json(manifest_path), BanditRef)
    rows, stats = build_bandit_rows(spec, runtime)
    if not rows:
        raise EmptyStageError(empty_reason(stats))
    from datasets import Dataset

    buffer = io.BytesIO()
    Dataset.from_list(rows).to_parquet(buffer)
    data = buffer.getvalue()
    st.write_atomic(f"{directory}/{DATA}", data)
    ref = BanditRef(
        key=spec.key,
        uri=st.protocol + directory,
        rows=len(rows),
        fingerprint="sha256:" + hashlib.sha256(data).hexdigest(),
        stats=stats,
    )
    _commit(st, manifest_path, ref, spec)
    logger.info(
        "bandit: %d rows (%s by depth) from %d problems at %s",
        ref.rows,
        stats["contexts_by_depth"],
        stats["problems"],
        ref.uri,
    )
    return ref


def read_bandit_rows(ref: BanditRef, storage: StorageConfig) -> list[dict[str, Any]]:
    """The rows of a bandit dataset (through `datasets`' parquet loader)."""
    import datasets

    st = open_storage(storage)
    if not st.fs.exists(f"{ref.uri.removeprefix('s3://')}/{MANIFEST}"):
        raise StorageError(f"bandit dataset {ref.uri} has no manifest: rerun with --refresh")
    loaded = datasets.load_dataset(
        "parquet", data_files=ref.data_uri, split="train", storage_options=st.options or None
    )
    return loaded.to_list()


def _commit(st: Any, manifest_path: str, ref: BaseModel, spec: BaseModel) -> None:
    manifest = {
        "created_at": datetime.now(UTC).isoformat(),
        "spec": spec.model_dump(mode="json"),
        **ref.model_dump(mode="json"),
    }
    st.write_atomic(manifest_path, json.dumps(manifest, indent=1, default=str).encode())


# --- training -------------------------------------------------------------------------------------


def training_stage(spec: TrainingSpec, runtime: Runtime) -> PolicyRef:
    """Train in a local output directory (the storage itself when local; work_dir for S3, with
    each checkpoint uploaded as it is saved and downloaded again by a resumed run elsewhere),
    then commit the model, its log history and the reward-curve plot to storage."""
    from tasks.step_timing import StepTimer

    logger = get_run_logger()
    st = open_storage(runtime.storage)
    directory = st.path("training", spec.key)
    manifest_path = f"{directory}/{MANIFEST}"
    if runtime.refresh:
        if st.fs.exists(directory):
            st.fs.rm(directory, recursive=True)
    elif st.fs.exists(manifest_path):
        logger.info("training: %s is finished already", directory)
        return from_manifest(st.read_json(manifest_path), PolicyRef)
    local = (
        Path(directory)
        if runtime.storage.is_local
        else Path(runtime.work_dir, "training", spec.key)
    )
    if runtime.refresh and local.exists():
        shutil.rmtree(local)
    if not runtime.storage.is_local:
        _download_last_checkpoint(st, directory, local, logger)
    if (resumed := last_checkpoint(local)) is not None:
        logger.info("training: resuming from %s", resumed)
    rows = read_bandit_rows(spec.dataset, runtime.storage)
    config = spec.config.model_copy(
        update={
            "sandbox": SandboxConfig(
                backend=runtime.sandbox.backend, concurrency=runtime.sandbox.concurrency
            )
        }
    )
    callbacks: list[Any] = [StepTimer()]
    if not runtime.storage.is_local:
        callbacks.append(_uploader(st, local, directory))
    with callbacks[0] as timer:
        history = train(config, rows, runtime.model, local, callbacks=callbacks)
    plot = plot_rewards(history, f"GRPO ({config.mode}, {config.preset}): reward per step")
    (local / "rewards.png").write_bytes(plot)
    (local / "log_history.json").write_text(json.dumps(history, indent=1))
    if not runtime.storage.is_local:
        for path in sorted(local.iterdir()):
            if path.is_file():
                st.fs.put_file(str(path), f"{directory}/{path.name}")
    steps = max((int(h.get("step", 0)) for h in history), default=0)
    stats = {**reward_stats(history), "timing": timer.summary(), "resumed_from": resumed}
    ref = PolicyRef(
        key=spec.key,
        uri=st.protocol + directory,
        steps=steps,
        stats=stats,
        plot=(local / "rewards.png").as_uri()
        if runtime.storage.is_local
        else st.protocol + f"{directory}/rewards.png",
    )
    _commit(st, manifest_path, ref, spec)
    logger.info("training: %d steps, %s, model at %s", steps, stats, ref.uri)
    return ref


def _uploader(st: Any, local: Path, directory: str) -> Any:
    """A TrainerCallback that uploads each saved checkpoint to storage (what a resumed run
    elsewhere downloads); COMPLETE marks a finished upload."""
    from transformers import TrainerCallback

    class Uploader(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            name = f"checkpoint-{state.global_step}"
            if (local / name).is_dir():
                st.fs.put(str(local / name), f"{directory}/{name}", recursive=True)
                st.write_atomic(f"{directory}/{name}/COMPLETE", b"")

    return Uploader()


def _download_last_checkpoint(st: Any, directory: str, local: Path, logger: Any) -> None:
    if last_checkpoint(local) is not None or not st.fs.exists(directory):
        return
    names = [
        p.rstrip("/").rsplit("/", 1)[-1]
        for p in st.fs.ls(directory, detail=False)
        if p.rstrip("/").rsplit("/", 1)[-1].startswith("checkpoint-")
        and st.fs.exists(f"{p.rstrip('/')}/COMPLETE")
    ]
    if not names:
        return
    name = max(names, key=lambda n: int(n.split("-")[-1]))
    local.mkdir(parents=True, exist_ok=True)
    st.fs.get(f"{directory}/{name}", str(local / name), recursive=True)
    logger.info("training: downloaded %s from %s", name, st.url())


def reward_stats(history: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [h["reward"] for h in history if "reward" in h]
    if not rewards:
        return {"reward_first": None, "reward_last": None}
    k = max(1, len(rewards) // 4)
    return {
        "reward_first": round(rewards[0], 4),
        "reward_last": round(rewards[-1], 4),
        "reward_first_quarter": round(sum(rewards[:k]) / k, 4),
        "reward_last_quarter": round(sum(rewards[-k:]) / k, 4),
    }


def plot_rewards(history: list[dict[str, Any]], title: str) -> bytes:
    """A PNG of the mean reward (and each reward function's mean) against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logged = [h for h in history if "reward" in h]
    names = sorted(
        {k for h in logged for k in h if k.startswith("rewards/") and k.endswith("/mean")}
    )
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        steps = [h.get("step", i + 1) for i, h in enumerate(logged)]
        ax.plot(steps, [h["reward"] for h in logged], marker="o", linewidth=2.2, label="reward")
        for name in names:
            ax.plot(steps, [h.get(name) for h in logged], linewidth=1, label=name.split("/")[1])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("mean reward")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()


def local_model(ref: PolicyRef, storage: StorageConfig, work_dir: str) -> Path:
    """A local directory holding the trained model (downloaded from S3 once)."""
    if storage.is_local:
        return Path(ref.uri)
    st = open_storage(storage)
    path = Path(work_dir, "models", ref.key)
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        remote = ref.uri.removeprefix("s3://")
        for entry in st.fs.ls(remote, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if st.fs.isfile(entry):
                st.fs.get_file(entry, str(path / name))
    return path


# --- tasks: thin cached wrappers ----------------------------------------------------------------


# log_prints off: dill (under `datasets`) reads globals by capturing `print` output of `dis`,
# which Prefect's print patch would turn into pages of log lines (and empty dill's capture)
@task(
    name="bandit",
    task_run_name="bandit-{key}",
    cache_policy=stage_policy(*BANDIT_CODE),
    log_prints=False,
)
def bandit_task(key: str, spec: BanditSpec, runtime: Runtime) -> BanditRef:
    """Trajectories + per-turn evaluation -> contextual-bandit training rows (SPEC §1.4)."""
    return bandit_stage(spec, runtime)


@task(
    name="training",
    task_run_name="training-{key}",
    cache_policy=stage_policy(*TRAINING_CODE),
    retries=1,
    retry_delay_seconds=10,
    log_prints=False,
)
def training_task(key: str, spec: TrainingSpec, runtime: Runtime) -> PolicyRef:
    """GRPO on the bandit rows with the sandbox reward (resumes from its last checkpoint)."""
    return training_stage(spec, runtime)


class Stages:
    """The stage tasks bound to the run's storage (results, cache records, --refresh)."""

    def __init__(self, params: TrainingParams, ready: Ready):
        st = open_storage(params.storage)
        self.params, self.ready = params, ready
        self.runtime = Runtime(
            model=ready.model,
            sandbox=params.sandbox,
            storage=params.storage,
            work_dir=params.work_dir,
            refresh=params.refresh,
        )
        self.tasks: dict[str, Task] = {
            name: bind(t, st, params.refresh)
            for name, t in (("bandit", bandit_task), ("training", training_task))
        }

    def bandit(self) -> BanditRef:
        spec = bandit_spec(self.params, self.ready)
        return self.tasks["bandit"](spec.key, spec, self.runtime)

    def training(self, dataset: BanditRef) -> PolicyRef:
        if self.params.training.mode == "cobalt" and not dataset.stats.get("problems_with_repairs"):
            raise EmptyStageError(no_repairs_reason(dataset.stats))
        spec = training_spec(self.params, self.ready, dataset)
        return self.tasks["training"](spec.key, spec, self.runtime)


# --- report ---------------------------------------------------------------------------------------


class TrainingSummary(BaseModel):
    dataset: BanditRef
    policy: PolicyRef
    model: str = Field(description="A local directory holding the trained model.")
    line: str


def report(params: TrainingParams, dataset: BanditRef, policy: PolicyRef) -> TrainingSummary:
    """Bandit stats and reward curve as Prefect artifacts; a summary line in the log."""
    from prefect.artifacts import (
        create_image_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    stats = dataset.stats
    depth_rows = [
        {"turn_depth": k, "contexts": v} for k, v in stats.get("contexts_by_depth", {}).items()
    ]
    create_table_artifact(
        key="bandit-contexts",
        table=depth_rows,
        description=f"Bandit contexts per turn depth ({stats.get('problems')} problems, "
        f"{stats.get('skipped_all_solved')} skipped as solved by every first sample)",
    )
    timing = policy.stats.get("timing", {})
    line = (
        f"training: {dataset.rows} bandit rows from {stats.get('problems')} problems "
        f"({stats.get('problems_with_repairs')} with repair contexts); "
        f"{params.training.mode} GRPO, {policy.steps} steps, reward "
        f"{policy.stats.get('reward_first')} -> {policy.stats.get('reward_last')}; "
        f"reward wait {100 * timing.get('reward_share', 0):.1f}% of step time; "
        f"model at {policy.uri}"
    )
    history_rows = [
        {"bucket": k.removesuffix("_s"), "seconds": v, "share": timing.get(k[:-2] + "_share")}
        for k, v in timing.items()
        if k.endswith("_s") and k != "total_s"
    ]
    create_image_artifact(
        image_url=policy.plot, key="training-rewards", description="Reward per step (PNG)"
    )
    create_markdown_artifact(
        key="training-summary",
        markdown=(
            f"# Training\n\n{line}\n\n## Bandit dataset\n\n"
            f"{markdown_table([{k: v for k, v in stats.items() if not isinstance(v, dict)}])}\n\n"
            f"Contexts per turn depth:\n\n{markdown_table(depth_rows)}\n\n"
            f"## Step time\n\n{markdown_table(history_rows) if history_rows else '-'}\n\n"
            f"Reward curve: [{policy.plot}]({policy.plot})\n"
        ),
    )
    get_run_logger().info(line)
    return TrainingSummary(
        dataset=dataset,
        policy=policy,
        model=str(local_model(policy, params.storage, params.work_dir)),
        line=line,
    )
