"""The data stage: sources -> clean, verified, versioned problem sets (METHOD §1.1, §1.7).

Per source: `load_stage` (rows -> `Problem`s; malformed rows counted) -> `clean_stage` (TACO rules
and test capping; not for test-role sources) -> `verify_stage` (reference solutions in the
sandbox). Then `sets_stage` (seeded train/dev split, test set, perturbed copies) and `summarize`
(counts table + summary line). Each stage is a plain function writing a content-addressed dataset
to storage; `tasks/data.py` wraps each in a cached Prefect task, `flows/data.py` chains them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import fsspec
from pydantic import BaseModel, Field, model_validator

from cobalt.data.cleaning import CleanRules, clean_problems
from cobalt.data.source_spec import Sources, SourceSpec
from cobalt.data.sources import LoadConfig, SourceError, hub_hint, infer_kind, load_problems
from cobalt.data.splits import SplitConfig, build_sets
from cobalt.data.tally import KEPT, counts, examples, lines
from cobalt.data.verify import VerifyConfig, verify_problems
from cobalt.judging import SandboxRuntime
from cobalt.run_settings import RunSettings
from cobalt.storage import DatasetRef, StorageConfig, code_version, open_storage, recipe_key

SAMPLES = Path(__file__).resolve().parents[2] / "samples"  # the repository's samples/
SAMPLE_SOURCES = tuple(  # relative to the working directory: samples/... from the repo root
    f"{os.path.relpath(SAMPLES / name)}:{kind}"
    for name, kind in (
        ("apps_sample.jsonl", "taco"),
        ("codecontests_sample.jsonl", "codecontests"),
        ("lcb_sample.jsonl", "lcb"),
    )
)
SAMPLE_RULES = CleanRules(min_tests=1)  # the APPS sample has 1-8 tests per problem


class DataParams(RunSettings):
    """Parameters of the data flow, validated before any work starts (how it runs:
    `RunSettings`)."""

    sources: Sources = Field(
        min_length=1, description="Sources: SourceSpec objects or 'URI[:KIND][?key=value&...]'."
    )
    load: LoadConfig = Field(default_factory=LoadConfig)
    rules: CleanRules = Field(default_factory=CleanRules)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    hub_cache_days: float = Field(
        7, gt=0, description="Hub fetches are reused this long, then refetched (new releases)."
    )

    @model_validator(mode="after")
    def _unique(self) -> DataParams:
        names = [s.name for s in self.sources]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"source names {dup} repeat: give each a name (URI?name=...)")
        return self

    @classmethod
    def samples(cls, **overrides: Any) -> DataParams:
        """The bundled samples with `SAMPLE_RULES` (the embedded default run)."""
        return cls.model_validate(
            {"sources": list(SAMPLE_SOURCES), "rules": SAMPLE_RULES, **overrides}
        )


class Ready(BaseModel):
    """What preflight found: sources with their schema known, and the revision of each."""

    sources: list[SourceSpec]
    revisions: dict[str, str]


class DataSummary(BaseModel):
    problem_sets: DatasetRef
    table: list[dict[str, Any]]
    line: str


# --- preflight: fail fast, before any work ---


def preflight(params: DataParams) -> Ready:
    """Storage reachable, every source present; Hub revisions resolved, local files hashed.
    Raises StorageError / SourceError naming what to set."""
    open_storage(params.storage).check()
    sources, revisions = [], {}
    for spec in params.sources:
        if spec.is_hub:
            revisions[spec.name] = hub_revision(spec)
        else:
            revisions[spec.name] = file_revision(spec.uri)
            if spec.kind is None:
                spec = spec.with_kind(infer_kind(file_columns(spec.uri)))
        sources.append(spec)
    return Ready(sources=sources, revisions=revisions)


def hub_revision(spec: SourceSpec) -> str:
    """The commit a Hub revision points at (new commits -> new cache keys)."""
    from huggingface_hub import HfApi, constants

    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    if constants.HF_HUB_OFFLINE or offline:
        raise SourceError(hub_hint(spec, "HF_HUB_OFFLINE is set"))
    try:
        return HfApi().dataset_info(spec.dataset, revision=spec.revision, timeout=20).sha
    except Exception as exc:
        raise SourceError(hub_hint(spec, exc)) from None


def file_revision(uri: str) -> str:
    """'sha256:<hex>' of a local (or fsspec URL) source file."""
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.isfile(path):
        raise SourceError(
            f"source file {uri} not found: pass an existing JSONL or parquet file as "
            "--source PATH:KIND (e.g. samples/apps_sample.jsonl:taco), or a Hub dataset as hf:NAME"
        )
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def file_columns(uri: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(uri)
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            with fs.open(path, "rb") as f:
                return pq.read_schema(f).names
        with fs.open(path, "rt", encoding="utf-8") as f:
            return list(json.loads(f.readline()))
    except (ValueError, OSError, TypeError) as exc:
        raise SourceError(
            f"cannot read the columns of {uri} ({exc}): give its schema as {uri}:KIND"
        ) from None


# --- stages: plain functions (logic) ---

HERE = "cobalt.data.stages"
LOAD_CODE = (
    "cobalt.data.source_spec",
    "cobalt.data.sources",
    "cobalt.data.schemas",
    "cobalt.problems",
    "sandbox.formats",
    f"{HERE}.load_stage",
)
CLEAN_CODE = ("cobalt.data.cleaning", "cobalt.problems", f"{HERE}.clean_stage")
VERIFY_CODE = ("cobalt.data.verify", "cobalt.problems", f"{HERE}.verify_stage")
SETS_CODE = ("cobalt.data.splits", "cobalt.problems", "sandbox.compare", f"{HERE}.sets_stage")


def _dump(model: BaseModel) -> dict:
    return model.model_dump(mode="json")


def load_stage(
    spec: SourceSpec, revision: str, config: LoadConfig, storage: StorageConfig
) -> DatasetRef:
    problems, tally = load_problems(spec, revision, config)
    recipe = {
        "spec": _dump(spec),
        "revision": revision,
        "config": _dump(config),
        "code": code_version(*LOAD_CODE),
    }
    return open_storage(storage).write_dataset(
        f"load/{spec.name}", recipe_key(**recipe), {"problems": problems}, tally.rows(), recipe
    )


def clean_stage(ref: DatasetRef, rules: CleanRules, storage: StorageConfig) -> DatasetRef:
    st = open_storage(storage)
    problems, tally = clean_problems(st.read_problems(ref), rules)
    recipe = {
        "input": ref.tables["problems"].fingerprint,
        "rules": _dump(rules),
        "code": code_version(*CLEAN_CODE),
    }
    name = "clean/" + ref.name.split("/", 1)[1]
    return st.write_dataset(
        name, recipe_key(**recipe), {"problems": problems}, tally.rows(), recipe
    )


def verify_stage(
    ref: DatasetRef, config: VerifyConfig, sandbox: SandboxRuntime, storage: StorageConfig
) -> DatasetRef:
    st = open_storage(storage)
    problems, tally = verify_problems(st.read_problems(ref), config, sandbox)
    recipe = {
        "input": ref.tables["problems"].fingerprint,
        "config": _dump(config),
        "code": code_version(*VERIFY_CODE),
    }
    name = "verify/" + ref.name.split("/", 1)[1]
    return st.write_dataset(
        name, recipe_key(**recipe), {"problems": problems}, tally.rows(), recipe
    )


def sets_stage(
    pools: dict[str, list[DatasetRef]], config: SplitConfig, storage: StorageConfig
) -> DatasetRef:
    st = open_storage(storage)
    problems = {
        role: [p for ref in refs for p in st.read_problems(ref)] for role, refs in pools.items()
    }
    sets, tally = build_sets(problems, config)
    recipe = {
        "inputs": {
            role: sorted(r.tables["problems"].fingerprint for r in refs)
            for role, refs in pools.items()
        },
        "config": _dump(config),
        "code": code_version(*SETS_CODE),
    }
    return st.write_dataset("problemsets", recipe_key(**recipe), sets, tally.rows(), recipe)


# --- report ---

SET_COLUMNS = ("train", "dev", "test")


def counts_table(stage_refs: list[DatasetRef], sets: DatasetRef) -> list[dict[str, Any]]:
    """One row per source and difficulty (plus a total row): rows read, drops by reason (with
    the line numbers of rows dropped from a file read line by line), kept problems per set,
    verified, perturbed."""
    read: Counter[tuple[str, str]] = Counter()
    drops: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    where = {k: v for ref in stage_refs for k, v in lines(ref.tally).items()}
    for ref in stage_refs:
        for (source, difficulty, outcome), n in counts(ref.tally).items():
            if ref.name.startswith("load/"):
                read[(source, difficulty)] += n
            if outcome not in (KEPT, "passed", "no_reference", "not_run"):
                drops[(source, difficulty)][outcome] += n
    final: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for (source, difficulty, outcome), n in counts(sets.tally).items():
        final[(source, difficulty)][
            outcome.split(":")[0] if outcome.startswith("perturb_skipped") else outcome
        ] += n
    rows = []
    for key in sorted(set(read) | set(drops) | set(final)):
        got, dropped = final[key], drops[key]
        rows.append(
            {
                "source": key[0],
                "difficulty": key[1],
                "read": read[key],
                "dropped": sum(dropped.values()),
                "kept": sum(got[s] for s in SET_COLUMNS),
                **{s: got[s] for s in SET_COLUMNS},
                "verified": got["verification:passed"],
                "perturbed": got["perturbed"],
                "perturb_skipped": got["perturb_skipped"],
                "drop_reasons": ", ".join(
                    f"{r} {n}{at_lines(where.get((*key, r)), n)}"
                    for r, n in sorted(dropped.items())
                ),
            }
        )
    total: dict[str, Any] = {"source": "total", "difficulty": "all"}
    for column in (
        "read",
        "dropped",
        "kept",
        *SET_COLUMNS,
        "verified",
        "perturbed",
        "perturb_skipped",
    ):
        total[column] = sum(r[column] for r in rows)
    all_drops: Counter[str] = Counter()
    for dropped in drops.values():
        all_drops.update(dropped)
    total["drop_reasons"] = ", ".join(f"{r} {n}" for r, n in sorted(all_drops.items()))
    return [*rows, total]


def at_lines(numbers: list[int] | None, count: int) -> str:
    """' (line 3)', ' (lines 3, 7, ...)': where in its file a dropped row was, when known."""
    if not numbers:
        return ""
    more = ", ..." if count > len(numbers) else ""
    return f" (line{'s' if count > 1 else ''} {', '.join(map(str, numbers))}{more})"


def summarize(params: DataParams, stage_refs: list[DatasetRef], sets: DatasetRef) -> DataSummary:
    """The counts table and summary line of a finished run; the LATEST pointer (what
    `--problems latest` reads) now names these problem sets."""
    st = open_storage(params.storage)
    table = counts_table(stage_refs, sets)
    total = table[-1]
    sizes = ", ".join(f"{name} {info.rows}" for name, info in sets.tables.items())
    line = (
        f"data: {len(params.sources)} sources, {total['read']} rows read -> {total['kept']} "
        f"problems kept ({sizes}); dropped {total['dropped']}"
        f"{' (' + total['drop_reasons'] + ')' if total['drop_reasons'] else ''}; "
        f"problem sets at {sets.uri}"
    )
    st.point_latest("datasets/problemsets", uri=sets.uri, key=sets.key)
    return DataSummary(problem_sets=sets, table=table, line=line)


def drop_examples(stage_refs: list[DatasetRef]) -> str:
    """The first example of each drop reason, as markdown bullet lines."""
    found = {k: v for r in stage_refs for k, v in examples(r.tally).items()}
    return "\n".join(f"- `{s}` {o}: {e}" for (s, o), e in sorted(found.items()))
