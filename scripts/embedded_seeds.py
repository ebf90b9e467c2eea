"""Signal or noise? The embedded default's before/after Pass@1 over several seeds.

    python scripts/embedded_seeds.py                                   # the default, seeds 0-4
    python scripts/embedded_seeds.py --max-steps 24 --lr 5e-5 --label steps24_lr5e-5
    python scripts/embedded_seeds.py --report                          # the table of every setting

Each seed is `make run`'s pipeline (`flows.pipeline.pipeline_flow`, the same Prefect flow) with
`cobalt.pipeline.with_seed`: another seed changes every sampled token (training trajectories,
evaluation before and after), the bandit rows' order and GRPO's seed; the fitted reference model
stays the one fitted with seed 0. All settings share one storage (`--storage`), so the reference
model, the problem sets, the trajectories and the evaluation before are computed once per seed
(content-keyed stages) and a setting only trains and evaluates again.

Per setting it prints Pass@1 (%) before / after per turn (mean over seeds), the change in points:
mean, standard deviation over seeds (the run-to-run spread), a 95% t interval of the mean over
seeds and a 95% two-level bootstrap interval over seeds and problems
(`cobalt.analysis.intervals.bootstrap_difference`, paired by problem). Results go to `--out`
(JSON, rewritten after every seed; a seed already there for the label is not run again).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file too
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

OUT = ROOT / "benchmarks" / "results" / f"embedded_seeds_{date.today().isoformat()}.json"
# t quantile 0.975 for 1..30 degrees of freedom (a 95% interval of a mean over 2..31 seeds)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t975(df: int) -> float:
    """The t distribution's 0.975 quantile: the table up to 30 degrees of freedom, beyond it the
    Cornish-Fisher expansion around the normal's (within 1e-4 of the exact value there)."""
    if df <= len(T975):
        return T975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / df ** (k + 1) for k, term in enumerate(terms))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python scripts/embedded_seeds.py",
        description=__doc__.split("\n\n")[0],
        epilog="Settings default to the embedded default's (cobalt.presets.tiny_training, "
        "tiny_collect). " + __doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arg = parser.add_argument
    arg("--seeds", default="0,1,2,3,4", help="comma-separated seeds (0,1,2,3,4)")
    arg("--config", type=Path, help="JSON file with PipelineParams fields under the flags")
    arg("--label", help="name of the setting in --out (default: built from the flags)")
    arg("--mode", choices=["cobalt", "single_turn", "offline"], default="cobalt")
    arg("--max-steps", type=int, help="GRPO optimizer steps")
    arg("--lr", type=float, help="learning rate")
    arg("--batch", type=int, help="completions per GRPO step (per_device_train_batch_size)")
    arg("--generations", type=int, help="completions per prompt (num_generations)")
    arg("--set", action="append", default=[], metavar="KEY=JSON", help="other GRPOConfig field")
    arg("--n", type=int, help="samples per problem of trajectories and evaluations")
    arg("--eval-samples", type=int, help="samples per problem of the evaluations alone")
    arg("--train-limit", type=int, help="only the first N training problems")
    arg("--storage", default=str(ROOT / "runs" / "seeds"), help="storage shared by settings")
    arg("--out", type=Path, default=OUT, help=f"results JSON ({OUT.relative_to(ROOT)})")
    arg("--report", action="store_true", help="print the table of every setting in --out, run none")
    return parser.parse_args(argv)


def _default(field: str) -> dict[str, Any]:
    from cobalt.pipeline import PipelineParams

    return PipelineParams.model_fields[field].default_factory().model_dump()


# overrides of the default's that no setting changes, left out of the labels
UNLABELLED = {"max_completion_length"}


def _plain_default(field: str) -> Any:
    from cobalt.pipeline import PipelineParams

    return PipelineParams.model_fields[field].default


def setting(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The setting's label and its PipelineParams fields (over the embedded default)."""
    from cobalt.presets import tiny_training

    fields: dict[str, Any] = json.loads(args.config.read_text()) if args.config else {}
    training = fields.get("training") or tiny_training(args.mode).model_dump()
    overrides = training["overrides"]
    named = {
        "per_device_train_batch_size": args.batch,
        "num_generations": args.generations,
        "learning_rate": args.lr,
    }
    for item in args.set:
        key, _, value = item.partition("=")
        named[key] = json.loads(value)
    if args.mode == "offline":
        if args.lr is not None:
            training["offline"]["learning_rate"] = args.lr
        named.pop("learning_rate")
    overrides.update({k: v for k, v in named.items() if v is not None})
    if args.max_steps is not None:
        training["max_steps"] = args.max_steps
    fields["training"] = training
    if args.n is not None:
        collect = fields.get("collect") or _default("collect")
        collect["sampling"]["n"] = args.n
        fields["collect"] = collect
    if args.eval_samples is not None:
        fields["eval_samples"] = args.eval_samples
    if args.train_limit is not None:
        fields["train_limit"] = args.train_limit
    short = {"per_device_train_batch_size": "b", "num_generations": "g", "learning_rate": "lr"}
    parts = [args.mode, f"steps{training.get('max_steps')}"]
    labelled = [*named, *(k for k in overrides if k not in named and k not in UNLABELLED)]
    parts += [f"{short.get(k, k)}{overrides[k]}" for k in labelled if k in overrides]
    n = (fields.get("collect") or _default("collect"))["sampling"]["n"]
    parts += [f"n{n}"]
    eval_n = fields.get("eval_samples", _plain_default("eval_samples"))
    parts += [f"eval{eval_n}"] * (eval_n not in (None, n))
    parts += [f"limit{args.train_limit}"] * (args.train_limit is not None)
    # the transformers engine's keyed sampling (each row its own noise, engines.keyed_sampling)
    # since the seventh round of settings; labels without it drew one random stream per batch
    parts += ["keyed", reference_tag(fields)]
    return args.label or "_".join(parts), fields


def reference_tag(fields: dict[str, Any]) -> str:
    """The reference model a setting starts from, in its label: the embedded fit's recipe hash
    (another fit recipe is another default, measured apart), else the reference's name."""
    from cobalt.models import FITTED
    from cobalt.reference import FIT_STEPS, embedded_recipe_hash

    reference = fields.get("reference", FITTED)
    if reference != FITTED:
        return f"ref-{Path(reference).name}"
    return f"ref{embedded_recipe_hash(fields.get('fit_steps', FIT_STEPS))[:8]}"


# --- one seed --------------------------------------------------------------------------------------


def per_problem(where: str, turns: list[int]) -> dict[str, dict[str, float]]:
    """Pass@1 of every problem at each turn, from an evaluation stage's records."""
    from cobalt.trajectories.evaluation import EvalRecord, problem_scores
    from cobalt.trajectories.records import parse_records

    records, _ = parse_records(Path(where, "records.jsonl").read_bytes(), EvalRecord)
    return {str(t): problem_scores(records.values(), t) for t in turns}


def run_seed(fields: dict[str, Any], seed: int, storage: str) -> dict[str, Any]:
    """The pipeline flow once; what the aggregate needs from it."""
    from cobalt.pipeline import PipelineParams, with_seed
    from flows.pipeline import pipeline_flow

    params = with_seed(PipelineParams.model_validate({**fields, "storage": {"url": storage}}), seed)
    started = time.perf_counter()
    summary = pipeline_flow(params)
    wall = time.perf_counter() - started
    stages = {row["stage"].split(" (")[0]: row for row in summary.stages}
    before, after = stages["evaluation before"]["where"], stages["evaluation after"]["where"]
    turns = sorted({r["turn"] for r in summary.before_after})
    return {
        "seed": seed,
        "wall_s": round(wall, 1),
        "line": summary.line,
        "before_after": summary.before_after,
        "training": stages["training"]["produced"] + "; " + stages["training"]["detail"],
        "dataset": stages.get("bandit dataset", stages.get("offline dataset", {})).get("produced"),
        "problems": scores(per_problem(before, turns), per_problem(after, turns)),
    }


def scores(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict:
    """{"ids": problem ids, turn: {"before": [Pass@1 per id], "after": [...]}}: compact."""
    ids = sorted(next(iter(before.values())))
    out: dict[str, Any] = {"ids": ids}
    for t in before:
        out[t] = {"before": [before[t][i] for i in ids], "after": [after[t][i] for i in ids]}
    return out


def by_problem(problems: dict[str, Any], turn: int, when: str) -> dict[str, float]:
    return dict(zip(problems["ids"], problems[str(turn)][when], strict=True))


# --- aggregate -------------------------------------------------------------------------------------


def t_interval(values: list[float]) -> tuple[float, float] | None:
    if len(values) < 2:
        return None
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    mean = statistics.fmean(values)
    return round(mean - half, 2), round(mean + half, 2)


def aggregate(seeds: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per difficulty and turn over the seeds: before, after, change (mean, SD, min, max, t
    interval; 'all' also the bootstrap over seeds and problems)."""
    from cobalt.analysis.intervals import bootstrap_difference

    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for result in seeds.values():
        for r in result["before_after"]:
            cells.setdefault((r["difficulty"], r["turn"]), []).append(r)
    rows = []
    for (difficulty, turn), rs in sorted(cells.items(), key=lambda c: (c[0][0] != "all", c[0])):
        change = [r["change_points"] for r in rs]
        row: dict[str, Any] = {
            "difficulty": difficulty,
            "turn": turn,
            "seeds": len(rs),
            "before": round(statistics.fmean(r["before_pass@1"] for r in rs), 2),
            "after": round(statistics.fmean(r["after_pass@1"] for r in rs), 2),
            "change": round(statistics.fmean(change), 2) + 0.0,  # no -0.0
            "sd": round(statistics.stdev(change), 2) if len(change) > 1 else None,
            "min": min(change),
            "max": max(change),
            "up": sum(c > 0 for c in change),
            "t95": t_interval(change),
        }
        if difficulty == "all":
            by = {int(s): r["problems"] for s, r in seeds.items()}
            boot = bootstrap_difference(
                {s: by_problem(p, turn, "after") for s, p in by.items()},
                {s: by_problem(p, turn, "before") for s, p in by.items()},
            ).as_dict(scale=100)
            row["boot95"] = (boot["low"], boot["high"])
        rows.append(row)
    return rows


def report(results: dict[str, Any]) -> str:
    from cobalt.tables import markdown_table

    lines = []
    for label, entry in results["settings"].items():
        rows = aggregate(entry["seeds"])
        walls = [s["wall_s"] for s in entry["seeds"].values()]
        lines += [
            f"\n## {label}: {len(entry['seeds'])} seeds, flow wall s per seed {min(walls)}-"
            f"{max(walls)}\n",
            markdown_table(rows),
        ]
    return "\n".join(lines)


def dumps(results: dict[str, Any]) -> str:
    """Indented JSON with every innermost list or object on one line (a problem's scores, a
    table row): diffable, a few kB per seed."""
    text = json.dumps(results, indent=1)
    inner = re.compile(r"([\[{])\n\s+([^\[\]{}]*?)\n\s*([\]}])")
    return inner.sub(lambda m: m[1] + " ".join(x.strip() for x in m[2].split("\n")) + m[3], text)


def save_setting(out: Path, label: str, entry: dict[str, Any]) -> None:
    """Write one setting into the results file: under a lock, over what is there now (settings,
    or seeds of one setting, run side by side each add their own), through a temporary file (a
    crash leaves the old one)."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(out.read_text()) if out.exists() else {"settings": {}}
        settings = results.setdefault("settings", {})
        if label in settings:  # seeds another process added meanwhile stay
            entry["seeds"] = settings[label]["seeds"] | entry["seeds"]
        settings[label] = entry
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(dumps(results))
        os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {"settings": {}}
    if args.out.exists():
        results = json.loads(args.out.read_text())
    if args.report:
        print(report(results))
        return 0
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    from flows.cli import EPHEMERAL_START_S

    label, fields = setting(args)
    entry = results["settings"].setdefault(label, {"fields": fields, "seeds": {}})
    entry["machine"] = f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}"
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    timeout = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: EPHEMERAL_START_S}
    with temporary_settings(updates=timeout):
        for seed in seeds:
            if str(seed) in entry["seeds"]:
                continue
            entry["seeds"][str(seed)] = run_seed(fields, seed, args.storage)
            entry["date"] = date.today().isoformat()
            save_setting(args.out, label, entry)
            print(f"{label} seed {seed}: {entry['seeds'][str(seed)]['line']}", flush=True)
    print(report({"settings": {label: entry}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
