"""Data flow: public datasets -> clean, verified, versioned problem sets (docs/DATA.md).

    python -m flows.data                                     # bundled samples, ./runs
    python -m flows.data --source samples/apps_sample.jsonl:taco \\
        --source samples/lcb_sample.jsonl:lcb --storage s3://bucket/prefix \\
        --endpoint-url http://127.0.0.1:9000 [--refresh]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefect import flow

from cobalt.data.stages import DataParams, DataSummary, preflight
from cobalt.params import add_option, deep_merge
from cobalt.tables import markdown_table
from flows.cli import (
    add_refresh,
    add_sandbox_args,
    add_storage_args,
    read_config,
    run_flow_cli,
    sandbox_values,
    storage_values,
)
from tasks.data import Stages, report


@flow(name="data", log_prints=True)
def data_flow(params: DataParams) -> DataSummary:
    """Sources -> load -> clean -> verify -> train/dev/test (+ perturbed) -> counts report."""
    ready = preflight(params)  # storage reachable, sources present: fail before any work
    stages = Stages(params)  # tasks bound to the storage: results, cache records, --refresh
    history = {s.name: stages.prepare(s, ready.revisions[s.name]) for s in ready.sources}
    pools = {
        role: [history[s.name][-1] for s in ready.sources if s.role == role]
        for role in ("train", "dev", "test")
    }
    sets = stages.sets(pools, params.split, params.storage)
    return report(params, [ref for refs in history.values() for ref in refs], sets)


EPILOG = """\
sources: URI[:KIND][?key=value&...] with KIND one of taco, cobalt, lcb, codecontests
  samples/apps_sample.jsonl:taco          local JSONL or parquet file (any fsspec URL)
  hf:likaixin/TACO-verified                a Hub dataset (needs the Hub)
  hf:livecodebench/code_generation_lite?version_tag=v6&date_from=2025-02-01
keys: name, role (train|dev|test), split, revision, version_tag, date_from, date_to

Without --source the bundled samples run with min_tests=1 (the APPS sample has 1-8 tests
per problem; the paper's rule is 8). Credentials for S3 come from AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY (or a Prefect RemoteFileSystem block: --storage-block).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.data",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Turn TACO / Cobalt / CodeContests / LiveCodeBench rows into clean, verified, "
        "versioned problem sets (train, dev, test, perturbed) in local or S3 storage.",
        epilog=EPILOG,
    )
    arg = parser.add_argument
    arg("--source", action="append", metavar="SPEC", help="a source (repeat); see below")
    arg("--config", type=Path, help="JSON file with DataParams fields (flags override it)")
    add_storage_args(parser)
    add_refresh(parser)
    arg("--min-tests", type=int, help="drop problems with fewer tests (paper: 8)")
    arg("--max-tests", type=int, help="keep at most this many tests (paper: 20)")
    arg("--public-tests", type=int, help="leading tests that are public (paper: 4)")
    arg("--dev-fraction", type=float, help="share of train-role problems in dev (0.1)")
    add_option(
        parser,
        "--split-seed",
        aliases=("--seed",),
        type=int,
        metavar="N",
        help="seed of the solution shuffle, the train/dev split and the perturbation (0)",
    )
    arg("--no-verify", action="store_true", help="skip the reference-solution check")
    add_sandbox_args(parser, aliases=("--concurrency",))
    return parser


def parse_params(argv: list[str] | None = None) -> DataParams:
    parser = build_parser()
    args = parser.parse_args(argv)

    values = read_config(args.config)
    if args.source:
        values["sources"] = args.source
    samples = "sources" not in values
    if samples:
        print("no --source: the bundled samples, with min_tests=1 (sample profile)")
    storage_values(args, values)
    for flag, section, field in (
        ("min_tests", "rules", "min_tests"),
        ("max_tests", "rules", "max_tests"),
        ("public_tests", "load", "public_tests"),
        ("dev_fraction", "split", "dev_fraction"),
    ):
        if getattr(args, flag) is not None:
            values.setdefault(section, {})[field] = getattr(args, flag)
    sandbox_values(args, values)
    if args.split_seed is not None:
        for section in ("load", "split"):
            values.setdefault(section, {})["seed"] = args.split_seed
    if args.no_verify:
        values.setdefault("verify", {})["enabled"] = False
    if args.refresh:
        values["refresh"] = True
    if samples:
        sample = DataParams.samples()
        values["sources"] = [s.model_dump() for s in sample.sources]
        values["rules"] = deep_merge(sample.rules.model_dump(), values.get("rules") or {}, "rules")
    return DataParams.model_validate(values)


def main(argv: list[str] | None = None) -> int:
    return run_flow_cli(
        lambda: parse_params(argv),
        preflight,
        data_flow,
        lambda summary: f"\n{summary.line}\n\n{markdown_table(summary.table)}",
    )


if __name__ == "__main__":
    sys.exit(main())
