"""The Cobalt bandit dataset in storage (METHOD §1.4): every partial trajectory of a finished
trajectories run as a context with its `prev_best_pass_rate`, selected by
`cobalt/bandit/selection.py`, optionally mixed with repair contexts from perturbed-feedback
trajectories (§1.7), written as parquet under `<storage>/bandit/<key>/` (MANIFEST.json last) and
read back with `datasets`. `build_bandit_rows` is the notebook entry point (no writes)."""

from __future__ import annotations

import hashlib
import io
import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cobalt.bandit.rows import prepare_rows
from cobalt.bandit.selection import (
    FEEDBACK_TURNS,
    MAX_PROMPT_TOKENS,
    ProblemData,
    bandit_rows,
    problem_data_from_eval,
)
from cobalt.errors import EmptyStageError
from cobalt.storage import (
    MANIFEST,
    Logger,
    Storage,
    StorageConfig,
    StorageError,
    code_version,
    from_manifest,
    open_storage,
    recipe_key,
)
from cobalt.trajectories.evaluation import EvalRecord
from cobalt.trajectories.problemsets import load_problems
from cobalt.trajectories.records import Record
from cobalt.trajectories.runs import Trajectories
from cobalt.trajectories.stages import read_stage

log = logging.getLogger(__name__)
DATA = "data.parquet"
BANDIT_CODE = (
    "cobalt.bandit.selection",
    "cobalt.bandit.dataset",
    "cobalt.bandit.rows",
)


class BanditConfig(BaseModel):
    """How the bandit dataset is built from trajectories (METHOD §1.4)."""

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
        "collected with perturbed public-test feedback (METHOD §1.7's mitigation); needs the "
        "training flow's `perturbed` trajectories. 0: none.",
    )


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


def bandit_spec(
    trajectories: Trajectories,
    perturbed: Trajectories | None,
    config: BanditConfig,
    tokenizer: str,
) -> BanditSpec:
    """The content address of a bandit dataset: its trajectories, config, tokenizer and code."""
    recipe = {
        "stage": "bandit",
        "evaluation": trajectories.evaluation.fingerprint,
        "multiturn": trajectories.multiturn.fingerprint,
        "problems": trajectories.problems.fingerprint,
        "perturbed": perturbed.evaluation.fingerprint if perturbed else None,
        "config": config.model_dump(mode="json"),
        "tokenizer": tokenizer,
        "code": code_version(*BANDIT_CODE),
    }
    return BanditSpec(
        key=recipe_key(**recipe),
        trajectories=trajectories,
        perturbed=perturbed,
        config=config,
        tokenizer=tokenizer,
    )


def prompt_token_counter(model: str) -> Callable[[list[dict[str, str]]], int]:
    """Tokens of a conversation's prompt under `model`'s tokenizer and chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    return prompt_tokens


def problem_data(found: Trajectories, storage: StorageConfig) -> list[ProblemData]:
    """Per problem of a finished trajectories run: its records and per-turn pass rates."""
    problems = load_problems(found.problems, storage)
    records = read_stage(found.multiturn, storage, Record)
    evals = read_stage(found.evaluation, storage, EvalRecord)
    return [
        problem_data_from_eval(records[p.id], evals[p.id], p.tests)  # rewards: the true tests
        for p in problems
        if p.id in records and p.id in evals
    ]


def build_bandit_rows(
    spec: BanditSpec, storage: StorageConfig, tokenizer: str
) -> tuple[list[dict[str, Any]], dict]:
    """The bandit rows of a trajectories run and their stats (no storage writes); prompt lengths
    counted with the chat template of the model directory `tokenizer`."""
    config = spec.config
    counter = prompt_token_counter(tokenizer)

    def rows_of(data: list[Any]) -> list[dict[str, Any]]:
        return bandit_rows(
            data,
            config.mode,
            counter,
            seed=config.seed,
            max_prompt_tokens=config.max_prompt_tokens,
            feedback_turns=config.feedback_turns,
        )

    data = problem_data(spec.trajectories, storage)
    rows = rows_of(data)
    stats = bandit_stats(data, rows)
    if spec.perturbed is not None and config.perturbed_ratio > 0:
        extra = [r for r in rows_of(problem_data(spec.perturbed, storage)) if _depth(r) > 0]
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


def bandit_stage(
    spec: BanditSpec,
    storage: StorageConfig,
    tokenizer: str,
    *,
    refresh: bool = False,
    logger: Logger = log,
) -> BanditRef:
    """Build the bandit dataset into `<storage>/bandit/<key>/data.parquet` (MANIFEST.json last);
    a finished one is returned as is unless `refresh`."""
    st = open_storage(storage)
    directory = st.path("bandit", spec.key)
    manifest_path = f"{directory}/{MANIFEST}"
    if not refresh and st.fs.exists(manifest_path):
        logger.info("bandit: %s is finished already", directory)
        return from_manifest(st.read_json(manifest_path), BanditRef)
    rows, stats = build_bandit_rows(spec, storage, tokenizer)
    if not rows:
        raise EmptyStageError(empty_reason(stats))
    ref = commit_rows(st, directory, spec.key, rows, stats, spec)
    logger.info(
        "bandit: %d rows (%s by depth) from %d problems at %s",
        ref.rows,
        stats["contexts_by_depth"],
        stats["problems"],
        ref.uri,
    )
    return ref


def commit_rows(
    st: Storage,
    directory: str,
    key: str,
    rows: list[dict[str, Any]],
    stats: dict[str, Any],
    spec: BaseModel,
) -> BanditRef:
    """Rows written as `directory/data.parquet` (with `datasets`), then the manifest: a training
    dataset (bandit or offline) committed."""
    from datasets import Dataset

    buffer = io.BytesIO()
    Dataset.from_list(rows).to_parquet(buffer)
    data = buffer.getvalue()
    st.write_atomic(f"{directory}/{DATA}", data)
    ref = BanditRef(
        key=key,
        uri=st.protocol + directory,
        rows=len(rows),
        fingerprint="sha256:" + hashlib.sha256(data).hexdigest(),
        stats=stats,
    )
    st.commit(f"{directory}/{MANIFEST}", ref, spec)
    return ref


def read_bandit_rows(ref: BanditRef, storage: StorageConfig) -> list[dict[str, Any]]:
    """The rows of a bandit dataset, read through the storage's own filesystem (s3fs for S3):
    `datasets`' loader would refuse an s3:// file under HF_HUB_OFFLINE=1, as an air-gapped
    cluster sets it ("Offline mode is enabled. Tried to reach s3://...")."""
    import datasets
    import pyarrow.parquet as pq

    st = open_storage(storage)
    if not st.fs.exists(f"{ref.uri.removeprefix('s3://')}/{MANIFEST}"):
        raise StorageError(f"bandit dataset {ref.uri} has no manifest: rerun with --refresh")
    with st.fs.open(ref.data_uri.removeprefix("s3://"), "rb") as f:
        return datasets.Dataset(pq.read_table(f)).to_list()
