"""The training stage in storage (docs/TRAINING.md): its parameters, finding the trajectories run
and the policy it starts from, and training into `<storage>/training/<key>/` (the model,
log_history.json, the curves' PNG; checkpoints while it runs, resumed after a crash;
MANIFEST.json last). By mode: `cobalt` / `single_turn` train with GRPO
(`cobalt/training/grpo.py`) on the bandit dataset (`cobalt/bandit/dataset.py`); `offline` trains
with `cobalt/training/offline.py` on the offline dataset (`cobalt/training/method/offline_rows.py`).
Every mode records its cost (wall and GPU seconds, `cobalt/training/reporting/cost.py`) in the
stats.
`tasks/training.py` wraps both steps in cached Prefect tasks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cobalt.bandit.dataset import (
    BanditConfig,
    BanditRef,
    BanditSpec,
    bandit_spec,
    no_repairs_reason,
)
from cobalt.errors import EmptyStageError
from cobalt.judging import SandboxRuntime
from cobalt.models import NAMES, resolve_model, storage_model
from cobalt.run_settings import ModelRunSettings
from cobalt.storage import (
    MANIFEST,
    Logger,
    StorageConfig,
    StorageError,
    code_version,
    from_manifest,
    open_storage,
    recipe_key,
)
from cobalt.training.launch import Job, run_job
from cobalt.training.machinery.checkpoints import download_last_checkpoint, last_checkpoint
from cobalt.training.machinery.plan import TrainingPlan, check_resume, plan_training
from cobalt.training.method.offline_rows import (
    OfflineDataSpec,
    nothing_to_learn_reason,
    offline_data_spec,
)
from cobalt.training.reporting.curves import plot_rewards, reward_stats
from cobalt.training.reporting.phases import overlap_phrase, split_phrase
from cobalt.training.settings import Mode, TrainingConfig
from cobalt.trajectories.problemsets import ProblemSetError, ProblemSource
from cobalt.trajectories.runs import Trajectories, find_trajectories
from sandbox import SandboxConfig

log = logging.getLogger(__name__)
TRAINING_CODE = (
    "cobalt.training.machinery.activations",
    "cobalt.training.decisions",
    "cobalt.training.settings",
    "cobalt.training.method.preset_defaults",
    "cobalt.training.method.dense_reward",
    "cobalt.training.grpo",
    "cobalt.training.machinery.trl_trainer",
    "cobalt.training.method.k2_kl",
    "cobalt.training.machinery.memory",
    "cobalt.training.method.multiturn_rollout",
    "cobalt.training.machinery.padding",
    "cobalt.training.machinery.precision",
    "cobalt.training.method.cobalt_reward",
    "cobalt.training.method.sandbox_reward",
    "cobalt.training.machinery.weights",
    "cobalt.bandit.rows",
    "cobalt.trajectories.collect.judge_turns",
    "cobalt.trajectories.prompts",
)
OFFLINE_TRAINING_CODE = (
    "cobalt.training.decisions",
    "cobalt.training.settings",
    "cobalt.training.method.preset_defaults",
    "cobalt.training.method.offline_objectives",
    "cobalt.training.offline",
    "cobalt.training.machinery.precision",
    "cobalt.training.machinery.weights",
)


# settings of the other kind of mode, left out of a training key (changing them changes nothing);
# report_to only says where the curves go. The process count is in every mode's key: a step's
# rows are the same on any count, their sums' order is not (reduction-order noise)
_RUNTIME = {"collective_timeout_s", "node_rank", "rdzv_endpoint", "rendezvous_timeout_s"}
_OTHER_MODES = (
    {"offline", "report_to", *_RUNTIME},
    {
        *_RUNTIME,
        "generation",
        "vllm_server_base_url",
        "vllm_server_gpus",
        "fp8_generation",
        "fp8_kv_cache",
        "max_prompt_length",
        "report_to",
        "reward",
        "turns",
        "kl_estimator",
        "vllm_is_correction",
    },
)


def training_code(mode: Mode) -> tuple[str, ...]:
    """The modules whose source is part of a training stage's key, by mode."""
    return OFFLINE_TRAINING_CODE if mode == "offline" else TRAINING_CODE


class TrainingParams(ModelRunSettings):
    """Parameters of the training flow, validated before any work starts (how it runs:
    `ModelRunSettings`)."""

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
        description=f"The policy to train: {NAMES} (cobalt/models.py), resolved once at the "
        "preflight to a local directory. Default: the model that collected the trajectories "
        "(when that was a local model).",
    )
    bandit: BanditConfig = Field(default_factory=BanditConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    summary_uri: str | None = Field(
        None,
        description="Where node 0 writes the run's summary (JSON) once it completes: set by the "
        "training-nodes flow, which reads it back for the pipeline; not part of any cache key.",
    )

    @model_validator(mode="after")
    def _offline_has_no_perturbed_mixing(self) -> TrainingParams:
        check_offline_params(self.training, self.bandit)
        return self


def check_offline_params(training: TrainingConfig, bandit: BanditConfig) -> None:
    if training.mode == "offline" and bandit.perturbed_ratio > 0:
        raise ValueError(
            "bandit.perturbed_ratio: the offline mode trains on the logged turns of the "
            "true-feedback trajectories, perturbed contexts are mixed into the bandit dataset "
            "only: set it to 0, or train with mode cobalt"
        )


class Ready(BaseModel):
    trajectories: Trajectories
    perturbed: Trajectories | None = None
    model: str
    model_identity: str
    plan: TrainingPlan | None = None


def check_shared_storage(training: TrainingConfig, storage: StorageConfig) -> None:
    """Training on several nodes keeps its checkpoints and policy where every node reaches them:
    raises StorageError for local storage not declared shared (`storage.shared`)."""
    if training.nodes > 1 and storage.is_local and not storage.shared:
        raise StorageError(
            f"training on {training.nodes} nodes needs storage every node shares: pass "
            "--storage s3://bucket/prefix (each node uploads its part of every checkpoint there, "
            "node 0 the trained policy), or a directory every node mounts (NFS, Lustre) with "
            "--shared-storage (storage.shared)"
        )


def preflight(params: TrainingParams) -> Ready:
    """Storage usable, trajectories found and finished, policy model resolved to a local
    directory. Raises StorageError / ProblemSetError / ModelNameError naming what to pass."""
    storage = open_storage(params.storage)
    storage.check()
    check_training(params.training)
    check_shared_storage(params.training, params.storage)
    found = find_trajectories(params.trajectories, params.storage)
    model = params.model or found.engine.get("model")
    if found.engine.get("kind") == "litellm" and not params.model:
        raise ProblemSetError(
            f"the trajectories were collected through an API ({found.engine.get('model')}): "
            "pass the policy's weights with --model NAME (a Hub id, a directory, a storage URI)"
        )
    if not model:
        raise ProblemSetError(
            f"the trajectories name no model to train: pass --model NAME ({NAMES})"
        )
    model = resolve_model(model, params.storage, params.work_dir)
    plan = plan_training(params.training, model)
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
        plan=plan,
    )


def check_training(config: TrainingConfig) -> None:
    """The training settings, before any work: the trainer's own config and the run's GPU plan
    on this machine without the model (`cobalt.training.machinery.plan`; with it, once it is
    resolved:
    whether a GPU holds its share, vLLM's share, host memory)."""
    try:
        config.check()
    except ValueError as exc:
        raise ProblemSetError(f"{exc} (set the GRPOConfig field with --set KEY=VALUE)") from None
    plan_training(config)


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


class Runtime(BaseModel):
    """How stages run: never part of a cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    sandbox: SandboxRuntime
    storage: StorageConfig
    work_dir: str
    refresh: bool = False


class TrainingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    dataset: BanditRef = Field(description="The bandit dataset; offline mode: the offline one.")
    model: str = Field(description="Identity (content hash) of the starting policy.")
    config: TrainingConfig
    problems: ProblemSource | None = Field(
        None, description="multi_turn: the problem set whose public tests give the feedback."
    )


class PolicyRef(BaseModel):
    """A trained policy in storage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    uri: str = Field(description="The model directory (save_pretrained) in storage.")
    steps: int
    stats: dict[str, Any] = Field(default_factory=dict)
    plot: str = ""


def training_spec(params: TrainingParams, ready: Ready, dataset: BanditRef) -> TrainingSpec:
    config = params.training.model_copy(update={"sandbox": SandboxConfig()})  # runtime only
    problems = ready.trajectories.problems if config.mode == "multi_turn" else None
    recipe = {
        "stage": "training",
        "dataset": dataset.fingerprint,
        "model": ready.model_identity,
        "config": config.model_dump(mode="json", exclude=_OTHER_MODES[config.mode == "offline"]),
        "code": code_version(*training_code(config.mode)),
        **({"problems": problems.fingerprint} if problems else {}),
    }
    return TrainingSpec(
        key=recipe_key(**recipe),
        dataset=dataset,
        model=ready.model_identity,
        config=config,
        problems=problems,
    )


def training_stage(spec: TrainingSpec, runtime: Runtime, *, logger: Logger = log) -> PolicyRef:
    """Train in a local output directory (the storage itself when local; work_dir for S3, with
    each checkpoint uploaded as it is saved and downloaded again by a resumed run elsewhere),
    then commit the model, its log history and the curves' plot to storage. On several nodes
    every node runs this stage; node 0 commits, the others return node 0's commit."""
    from cobalt.training.reporting.cost import CostMeter

    st = open_storage(runtime.storage)
    directory = st.path("training", spec.key)
    manifest_path = f"{directory}/{MANIFEST}"
    nodes, node = spec.config.nodes, spec.config.node_rank
    if runtime.refresh:
        if node == 0 and st.fs.exists(directory):
            st.fs.rm(directory, recursive=True)
    elif st.fs.exists(manifest_path):
        logger.info("training: %s is finished already", directory)
        return from_manifest(st.read_json(manifest_path), PolicyRef)
    local = (
        Path(directory)
        if runtime.storage.is_local
        else Path(runtime.work_dir, "training", spec.key)
    )
    shared = runtime.storage.is_local and nodes > 1  # one directory for every node
    if runtime.refresh and local.exists() and not (shared and node > 0):
        shutil.rmtree(local)  # (a shared one: node 0's alone, above, before any node trains)
    if not runtime.storage.is_local:
        download_last_checkpoint(st, directory, local, logger, nodes)
    plan = plan_training(spec.config, runtime.model)  # the machine this stage runs on
    logger.info("training plan: %s", plan.describe())
    if (resumed := last_checkpoint(local)) is not None:
        check_resume(resumed, plan.processes)
        logger.info("training: resuming from %s", resumed)
    job = Job(
        config=spec.config,
        dataset=spec.dataset,
        storage=runtime.storage,
        sandbox=runtime.sandbox,
        model=runtime.model,
        output_dir=str(local),
        upload_dir=None if runtime.storage.is_local else directory,
        # a node > 0 of a shared directory keeps its launch files on its own disk: node 0's
        # --refresh may empty the directory after that node has written them
        launch_dir=str(Path(runtime.work_dir, "training", spec.key, f"launch-node{node}"))
        if shared and node > 0
        else None,
        problems=spec.problems,
        plan=plan,
    )
    with CostMeter() as cost:
        history, timing, extra = run_job(job, logger)
    if node > 0:  # node 0 saves the policy and commits the stage
        return wait_for_commit(st, manifest_path, COMMIT_WAIT_S, logger)
    config = spec.config
    if config.mode == "offline":
        from cobalt.training.offline import offline_curve_stats, plot_offline

        name = "curves.png"
        title = f"Offline ({config.offline.objective}, {config.preset}): loss, weighted advantage"
        plot = plot_offline(history, title)
        stats = {**offline_curve_stats(history), "objective": config.offline.objective, **extra}
    else:
        name = "rewards.png"
        plot = plot_rewards(history, f"GRPO ({config.mode}, {config.preset}): reward per step")
        stats = {**reward_stats(history), **extra}
    (local / name).write_bytes(plot)
    (local / "log_history.json").write_text(json.dumps(history, indent=1))
    if not runtime.storage.is_local:
        for path in sorted(local.iterdir()):
            if path.is_file():
                st.fs.put_file(str(path), f"{directory}/{path.name}")
        for events in sorted(local.glob("tensorboard/**/*")):  # the curves (report_to)
            if events.is_file():
                st.fs.put_file(str(events), f"{directory}/{events.relative_to(local)}")
    steps = max((int(h.get("step", 0)) for h in history), default=0)
    spent = cost.summary()
    if extra.get("gpu_peak_memory_gib"):  # measured in the launched training process
        spent["gpu_peak_memory_gib"] = max(
            spent.get("gpu_peak_memory_gib") or 0.0, extra.pop("gpu_peak_memory_gib")
        )
        stats.pop("gpu_peak_memory_gib", None)
    spent["gpu_peak_reserved_gib"] = extra.pop("gpu_peak_reserved_gib", None)
    stats.pop("gpu_peak_reserved_gib", None)
    stats |= {
        "mode": config.mode,
        "timing": timing,
        "cost": spent,
        "processes": config.num_processes,
        "plan": plan.model_dump(),
        "resumed_from": resumed,
    }
    ref = PolicyRef(
        key=spec.key,
        uri=st.protocol + directory,
        steps=steps,
        stats=stats,
        plot=(local / name).as_uri()
        if runtime.storage.is_local
        else st.protocol + f"{directory}/{name}",
    )
    st.commit(manifest_path, ref, spec)
    logger.info("training: %d steps, %s, model at %s", steps, stats, ref.uri)
    return ref


COMMIT_WAIT_S = 3600  # node 0 uploads the trained policy (16 GB at 8B) before it commits


def wait_for_commit(st: Any, manifest_path: str, timeout_s: int, logger: Logger) -> PolicyRef:
    """Node 0's commit of the stage, once it is in the shared storage (a node > 0 trained with
    it and ends with the same policy)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not st.fs.exists(manifest_path):
        if time.monotonic() > deadline:
            raise EmptyStageError(
                f"training: node 0 did not commit {manifest_path} within {timeout_s} s of the "
                "training's end: see node 0's run"
            )
        time.sleep(2)
        st.fs.invalidate_cache()
    logger.info("training: node 0 committed %s", manifest_path)
    return from_manifest(st.read_json(manifest_path), PolicyRef)


def local_model(ref: PolicyRef, storage: StorageConfig, work_dir: str) -> Path:
    """A local directory holding the trained model (downloaded from S3 once)."""
    if storage.is_local:
        return Path(ref.uri)
    return storage_model(ref.uri, storage, work_dir)


def on_this_machine(
    summary: TrainingSummary, storage: StorageConfig, work_dir: str
) -> TrainingSummary:
    """`summary` (another machine's: the training-nodes flow's node 0) with `model` a local
    directory of this machine, downloaded from the shared storage once."""
    return summary.model_copy(update={"model": str(local_model(summary.policy, storage, work_dir))})


def bandit_spec_of(params: TrainingParams, ready: Ready) -> BanditSpec:
    return bandit_spec(ready.trajectories, ready.perturbed, params.bandit, ready.model_identity)


def runtime_of(params: TrainingParams, ready: Ready) -> Runtime:
    return Runtime(
        model=ready.model,
        sandbox=params.sandbox,
        storage=params.storage,
        work_dir=params.work_dir,
        refresh=params.refresh,
    )


def offline_spec_of(ready: Ready) -> OfflineDataSpec:
    return offline_data_spec(ready.trajectories)


def check_dataset(params: TrainingParams, dataset: BanditRef) -> None:
    """Cobalt training needs repair contexts (else it is single-turn training in disguise);
    offline training needs a row whose advantage is not 0 (else there is nothing to learn)."""
    if params.training.mode == "cobalt" and not dataset.stats.get("problems_with_repairs"):
        raise EmptyStageError(no_repairs_reason(dataset.stats))
    if params.training.mode == "offline" and not dataset.stats.get("nonzero_advantage_rows"):
        raise EmptyStageError(nothing_to_learn_reason(dataset.stats))


class TrainingSummary(BaseModel):
    dataset: BanditRef
    policy: PolicyRef = Field(
        description="The trained policy; its `uri` (the model directory in storage) is a name "
        "--model takes (cobalt/models.py)."
    )
    model: str = Field(description="A local directory holding the trained model.")
    line: str


def summarize(params: TrainingParams, dataset: BanditRef, policy: PolicyRef) -> TrainingSummary:
    """One line for the log, naming the policy as a later --model takes it (its directory in
    storage); the trained model as a local directory."""
    stats, ps = dataset.stats, policy.stats
    cost = ps.get("cost") or {}
    spent = f"{cost.get('wall_s')} s" + (
        f", {cost['gpu_s']} GPU s" if cost.get("gpu_s") is not None else ""
    )
    if params.training.mode == "offline":
        line = (
            f"training: {dataset.rows} offline rows (logged turns) from {stats.get('problems')} "
            f"problems, {stats.get('nonzero_advantage_rows')} with a nonzero advantage; offline "
            f"{ps.get('objective')}, {policy.steps} steps on {ps.get('rows_trained')} rows, loss "
            f"{ps.get('loss_first')} -> {ps.get('loss_last')}, weighted advantage "
            f"{ps.get('weighted_advantage_first')} -> {ps.get('weighted_advantage_last')}; "
            f"{spent}; policy (--model): {policy.uri}"
        )
    else:
        timing = ps.get("timing", {})
        line = (
            f"training: {dataset.rows} bandit rows from {stats.get('problems')} problems "
            f"({stats.get('problems_with_repairs')} with repair contexts); "
            f"{params.training.mode} GRPO, {policy.steps} steps, reward "
            f"{ps.get('reward_first')} -> {ps.get('reward_last')}; "
            f"reward wait {100 * timing.get('reward_share', 0):.1f}% of step time; "
            f"{overlap_phrase(ps.get('overlap'))}{split_phrase(ps)}{spent}; "
            f"policy (--model): {policy.uri}"
        )
    return TrainingSummary(
        dataset=dataset,
        policy=policy,
        model=str(local_model(policy, params.storage, params.work_dir)),
        line=line,
    )
