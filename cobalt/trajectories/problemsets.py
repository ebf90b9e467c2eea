"""Problem sets as the trajectory stages read them: resolved from 'latest', a problem-set bundle, a
file of problem records or a raw source file; fingerprinted (the identity of a stage's input);
read with the feedback view asked for (true or perturbed public tests, METHOD §1.7)."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cobalt.errors import UserError
from cobalt.problems import Problem, from_table
from cobalt.storage import DatasetRef, StorageConfig, StorageError, open_storage


class ProblemSetError(UserError):
    """The problem set cannot be found or used; the message says what to pass."""


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


def resolve_problems(
    where: str,
    storage_config: StorageConfig,
    table: str = "train",
    perturbed: bool = False,
    limit: int | None = None,
) -> ProblemSource:
    """Where the problems come from (see `TrajectoryParams.problems` for the forms of `where`),
    checked, with the fingerprint of the selection."""
    storage = open_storage(storage_config)
    text = where
    table_name: str | None = None
    if text == "latest":
        uri = storage.latest("datasets/problemsets", "uri")
        if uri is None:
            raise ProblemSetError(
                f"no problem sets in {storage.url()} yet: run `python -m flows.data` with the "
                "same --storage first, or pass --problems PATH (a problem-set directory, a "
                ".parquet/.jsonl of problems, or a raw source file as PATH:KIND)"
            )
        kind = "dataset"
    elif _is_source_spec(text):
        kind, uri = "source", text
    elif text.endswith((".parquet", ".jsonl", ".json")):
        kind, uri = "file", text
    else:
        kind, uri = "dataset", text
    if kind == "dataset":
        table_name = table + ("_perturbed" if perturbed else "")
    source = ProblemSource(
        kind=kind,
        uri=uri,
        table=table_name,
        perturbed=perturbed,
        limit=limit,
        count=0,
        fingerprint="",
        instructions="",
    )
    problems = _read_problems(source, storage_config)
    if not problems:
        raise ProblemSetError(
            f"the problem set {uri} ({table_name or kind}) has no problems to use"
        )
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
            from cobalt.data.schemas import LoadConfig
            from cobalt.data.source_spec import SourceSpec
            from cobalt.data.sources import load_problems as load_source
            from cobalt.data.stages import file_revision

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
    from cobalt.data.splits import perturb_problem
    from cobalt.data.tally import Rejected

    try:
        return perturb_problem(problem, seed=0)
    except Rejected:
        return None
