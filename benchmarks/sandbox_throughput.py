"""Sandbox throughput: our Docker and namespace backends against two peer judges.

One workload, judged by every selected judge with the same concurrency and per-test timeout:

  apps     every reference and generated solution in samples/apps_sample.jsonl (real programs;
           a few time out, which costs every judge the same timeout per test)
  trivial  N copies of `print(input())` with --trivial-tests tests each (pure per-test overhead)

Judges:

  docker     our Docker backend (warm pool of hardened containers, one fork per test)
  namespace  our namespace backend (warm self-jailed runners, one fork per test)
  cobalt     Cobalt-style evaluator: a new multiprocessing.Process per test, running bubblewrap
             around a fresh python3 (benchmarks/peers.py)
  lcb        LiveCodeBench-style judge: a process pool; per program a Manager and one
             multiprocessing.Process that runs all tests in-process under SIGALRM timers

Each judge is started and warmed up first (one trivial program per worker); start-up is
reported apart and not counted in throughput. Per judge and workload it prints programs, tests,
wall seconds, tests/s, p50/p99 per-program latency, and how many verdicts (accepted or not) agree
with the Docker backend's; then the tests/s ratios, the per-test overhead on a trivial program
judged by a single worker, the memory of a warm idle Docker worker, and which goals are met.
Every judge runs every test of every program (no stop at the first failure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from benchmarks.peers import CobaltStyleJudge, LcbStyleJudge, PeerResult, Program
from sandbox import Judge, JudgeRequest, Limits, SandboxConfig, TestSuite
from sandbox.formats import taco_tests
from sandbox.pool import Worker

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "apps_sample.jsonl"
JUDGES = ("docker", "namespace", "cobalt", "lcb")
LABELS = {
    "docker": "docker (ours)",
    "namespace": "namespace (ours)",
    "cobalt": "Cobalt-style",
    "lcb": "LCB-style",
}
GOAL_COBALT_RATIO = 10.0
GOAL_LCB_RATIO = 1.0
GOAL_OVERHEAD_MS = 3.0
GOAL_MEMORY_MIB = 50.0

tqdm.monitor_interval = 0  # no monitor thread: the peers fork from this process


# ------------------------------------------------------------------------------------------------
# Records


@dataclass
class Record:
    """One judged program: its verdict and its latency (from its start to its verdict)."""

    id: str
    accepted: bool
    status: str
    outcomes: list[str]
    seconds: float


@dataclass
class Phase:
    workload: str
    programs: int
    tests: int
    wall_s: float
    records: list[Record]
    sampled_from: int | None = None  # programs in the full workload when only some were run
    full_tests: int | None = None

    @property
    def tests_per_s(self) -> float:
        return self.tests / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def extrapolated_wall_s(self) -> float:
        """Wall time of the full workload (the run's own when it was not sampled)."""
        if self.full_tests and self.tests:
            return self.wall_s * self.full_tests / self.tests
        return self.wall_s


@dataclass
class JudgeRun:
    judge: str
    startup_s: float = float("nan")
    phases: dict[str, Phase] = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    memory: dict | None = None
    replaced_workers: int | None = None
    load: tuple[float, float] | None = None  # 1-minute load average before and after the judge
    error: str | None = None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# ------------------------------------------------------------------------------------------------
# Workload


def trivial_program(index: int, tests: int) -> Program:
    inputs, outputs = [f"{j}\n" for j in range(tests)], [str(j) for j in range(tests)]
    suite = TestSuite(inputs=inputs, outputs=outputs)
    return Program(f"trivial/{index}", "print(input())", suite, expected=True)


def load_workload(sample: Path, trivial: int, trivial_tests: int) -> dict[str, list[Program]]:
    apps = []
    for p, line in enumerate(sample.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        tests = taco_tests(row["input_output"])
        for s, code in enumerate(json.loads(row["solutions"])):
            apps.append(Program(f"{p}/ref/{s}", code, tests, expected=True))
        for g, gen in enumerate(row.get("generated_solutions", [])):
            apps.append(Program(f"{p}/gen/{g}", gen["code"], tests, expected=gen.get("passed")))
    workload = {"apps": apps}
    if trivial:
        workload["trivial"] = [trivial_program(i, trivial_tests) for i in range(trivial)]
    return workload


def _bar(desc: str, total: int, quiet: bool) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="prog",
        file=sys.stderr,
        disable=quiet,
        mininterval=1.0,
        leave=False,
    )


# ------------------------------------------------------------------------------------------------
# Our backends


def _request(p: Program) -> JudgeRequest:
    return JudgeRequest(id=p.id, code=p.code, tests=p.tests)


async def _ours_phase(
    judge: Judge, name: str, programs: list[Program], concurrency: int, label: str, quiet: bool
) -> Phase:
    # At most `concurrency` programs are handed to the judge at once, like the peers' pools, so a
    # program's latency (and its suite deadline) starts when a worker is free for it.
    gate = asyncio.Semaphore(concurrency)
    bar = _bar(f"{label} {name}", len(programs), quiet)

    async def one(p: Program) -> Record:
        async with gate:
            start = time.perf_counter()
            v = await judge.judge(_request(p))
            seconds = time.perf_counter() - start
        bar.update()
        outcomes = list(v.outcomes) or [v.status] * len(p.tests.inputs)
        return Record(p.id, v.accepted, v.status, outcomes, seconds)

    start = time.perf_counter()
    records = await asyncio.gather(*(one(p) for p in programs))
    wall = time.perf_counter() - start
    bar.close()
    return Phase(
        name, len(programs), sum(len(p.tests.inputs) for p in programs), wall, list(records)
    )


def _container_memory(backend) -> dict:
    """Memory of each idle worker container, as `docker stats` shows it (usage minus cache)."""
    from sandbox.backends.docker import LABEL

    time.sleep(2.0)  # idle: no test running, replacements settled
    rows = []
    for c in backend.client.containers.list(filters={"label": f"{LABEL}={backend.owner}"}):
        mem = c.stats(stream=False).get("memory_stats", {})
        usage, stats = mem.get("usage", 0), mem.get("stats", {})
        cache = stats.get("total_inactive_file", stats.get("inactive_file", 0))
        used = usage - cache if cache < usage else usage
        rows.append(
            {
                "container": c.short_id,
                "mib": round(used / 2**20, 2),
                "usage_with_cache_mib": round(usage / 2**20, 2),
                "limit_mib": round(mem.get("limit", 0) / 2**20),
            }
        )
    return {"containers": rows, "max_mib": max((r["mib"] for r in rows), default=float("nan"))}


@contextlib.contextmanager
def _timed_test_requests(samples: list[float]):
    """Record how long each test request to a worker takes, seen from the host (benchmark-only
    wrapper around `Worker.request`: the round trip through the transport and the runner)."""
    original = Worker.request

    async def timed(self, message, timeout):
        start = time.perf_counter()
        reply = await original(self, message, timeout)
        if message.get("op") == "test":
            samples.append(time.perf_counter() - start)
        return reply

    Worker.request = timed
    try:
        yield
    finally:
        Worker.request = original


async def _ours_overhead(backend: str, args) -> dict:
    """Per-test cost on a trivial program, one worker, measured from here (the host)."""
    config = SandboxConfig(backend=backend, concurrency=1, limits=Limits(timeout_s=args.timeout))
    many = _request(trivial_program(0, args.overhead_tests))
    one = _request(trivial_program(1, 1))
    async with Judge(config) as judge:
        await judge.judge(many)  # warm-up
        per_test, round_trips = [], []
        with _timed_test_requests(round_trips):
            for _ in range(args.overhead_reps):
                start = time.perf_counter()
                v = await judge.judge(many)
                per_test.append((time.perf_counter() - start) / args.overhead_tests)
                assert v.accepted, v.status
        single = []
        for _ in range(20):
            start = time.perf_counter()
            await judge.judge(one)
            single.append(time.perf_counter() - start)
    return {
        "per_test_ms": statistics.median(per_test) * 1e3,
        "per_test_runs_ms": [round(x * 1e3, 3) for x in per_test],
        "one_test_program_ms": statistics.median(single) * 1e3,
        "per_test_median_ms": statistics.median(round_trips) * 1e3,
        "method": f"median of {args.overhead_reps} runs of a {args.overhead_tests}-test "
        "trivial program on 1 warm worker, wall / tests; one-test program: "
        "median of 20",
    }


async def run_ours(backend: str, workload: dict[str, list[Program]], args) -> JudgeRun:
    run = JudgeRun(backend)
    config = SandboxConfig(
        backend=backend, concurrency=args.concurrency, limits=Limits(timeout_s=args.timeout)
    )
    start = time.perf_counter()
    judge = Judge(config)
    await judge.__aenter__()
    run.startup_s = time.perf_counter() - start
    try:
        warm = _request(trivial_program(0, 1))
        await asyncio.gather(*(judge.judge(warm) for _ in range(args.concurrency)))
        for name, programs in workload.items():
            run.phases[name] = await _ours_phase(
                judge, name, programs, args.concurrency, backend, args.quiet
            )
        run.replaced_workers = judge.pool.replaced
        if backend == "docker":
            run.memory = await asyncio.to_thread(_container_memory, judge.backend)
    finally:
        await judge.__aexit__(None, None, None)
    if not args.no_overhead:
        run.overhead = await _ours_overhead(backend, args)
    return run


# ------------------------------------------------------------------------------------------------
# Peers


def _peer_records(results: list[PeerResult]) -> list[Record]:
    return [Record(r.id, r.accepted, r.status, r.outcomes, r.seconds) for r in results]


def _peer_overhead(name: str, args) -> dict:
    many = trivial_program(0, args.overhead_tests)
    one = trivial_program(1, 1)
    judge = _make_peer(name, 1, args.timeout)
    with judge:
        judge.judge_many([one])  # warm-up
        reps = 1 if name == "cobalt" else args.overhead_reps  # 100 fresh interpreters per run
        per_test, test_walls = [], []
        for _ in range(reps):
            start = time.perf_counter()
            [r] = judge.judge_many([many])
            per_test.append((time.perf_counter() - start) / args.overhead_tests)
            assert r.accepted, r.outcomes
            test_walls += r.test_seconds
        single = []
        for _ in range(5 if name == "cobalt" else 20):
            start = time.perf_counter()
            judge.judge_many([one])
            single.append(time.perf_counter() - start)
    out = {
        "per_test_ms": statistics.median(per_test) * 1e3,
        "per_test_runs_ms": [round(x * 1e3, 3) for x in per_test],
        "one_test_program_ms": statistics.median(single) * 1e3,
        "method": f"median of {reps} run(s) of a {args.overhead_tests}-test trivial program "
        "on 1 worker, wall / tests",
    }
    if test_walls and any(test_walls):
        out["per_test_median_ms"] = statistics.median(test_walls) * 1e3
    return out


def _make_peer(name: str, concurrency: int, timeout: float):
    if name == "cobalt":
        return CobaltStyleJudge(concurrency, timeout)
    return LcbStyleJudge(concurrency, timeout)


def run_peer(name: str, workload: dict[str, list[Program]], args) -> JudgeRun:
    run = JudgeRun(name)
    start = time.perf_counter()
    judge = _make_peer(name, args.concurrency, args.timeout)
    with judge:
        run.startup_s = time.perf_counter() - start
        judge.judge_many([trivial_program(0, 1)] * args.concurrency)  # warm-up
        for wname, programs in workload.items():
            chosen, full = programs, None
            if name == "cobalt" and wname == "trivial" and args.cobalt_sample < 1:
                chosen = programs[: max(1, round(len(programs) * args.cobalt_sample))]
                full = sum(len(p.tests.inputs) for p in programs)
            bar = _bar(f"{name} {wname}", len(chosen), args.quiet)
            t0 = time.perf_counter()
            results = judge.judge_many(chosen, on_done=lambda i, r, bar=bar: bar.update())
            wall = time.perf_counter() - t0
            bar.close()
            run.phases[wname] = Phase(
                wname,
                len(chosen),
                sum(len(p.tests.inputs) for p in chosen),
                wall,
                _peer_records(results),
                sampled_from=len(programs) if full else None,
                full_tests=full,
            )
    if not args.no_overhead:
        run.overhead = _peer_overhead(name, args)
    return run


# ------------------------------------------------------------------------------------------------
# Report


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    docker_version = None
    try:
        import docker

        docker_version = docker.from_env(timeout=10).version().get("Version")
    except Exception:  # no engine: reported as None
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "docker": docker_version,
        "python": platform.python_version(),
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _fmt(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def combined(run: JudgeRun) -> Phase:
    """All workloads together; a sampled phase counts with its extrapolated wall time."""
    phases = list(run.phases.values())
    records = [r for p in phases for r in p.records]
    tests = sum(p.full_tests or p.tests for p in phases)
    programs = sum(p.sampled_from or p.programs for p in phases)
    wall = sum(p.extrapolated_wall_s for p in phases)
    sampled = any(p.full_tests for p in phases)
    return Phase(
        "all",
        programs,
        tests,
        wall,
        records,
        full_tests=None,
        sampled_from=programs if sampled else None,
    )


def agreement(phase: Phase, reference: Phase | None) -> tuple[int, int, list[tuple]]:
    if reference is None:
        return 0, 0, []
    ref = {r.id: r for r in reference.records}
    same, total, differ = 0, 0, []
    for r in phase.records:
        if r.id not in ref:
            continue
        total += 1
        if r.accepted == ref[r.id].accepted:
            same += 1
        else:
            differ.append((r.id, r.status, ref[r.id].status))
    return same, total, differ


def report(runs: list[JudgeRun], args, info: dict, workload: dict[str, list[Program]]) -> dict:
    ok_runs = [r for r in runs if not r.error]
    by_name = {r.judge: r for r in ok_runs}
    ref_name = "docker" if "docker" in by_name else (ok_runs[0].judge if ok_runs else None)
    ref = by_name.get(ref_name)
    workloads = list(ok_runs[0].phases) if ok_runs else []
    out: dict = {"machine": info, "args": vars(args), "judges": {}, "ratios": {}, "goals": {}}
    expected = {
        p.id: p.expected
        for programs in workload.values()
        for p in programs
        if p.expected is not None
    }

    print(f"\n## Sandbox throughput ({info['date']})\n")
    print(
        f"machine: {info['nproc']} CPUs, {info['cpu']}, kernel {info['kernel']}, "
        f"Docker {info['docker']}, Python {info['python']}"
    )
    print(
        f"concurrency {args.concurrency}, timeout {args.timeout:g} s/test, trivial programs: "
        f"{args.trivial} x {args.trivial_tests} tests\n"
    )
    print(
        f"| judge | workload | programs | tests | wall s | tests/s | p50 ms | p99 ms "
        f"| verdicts = {ref_name} | = expected |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    notes, disagreements = [], []
    for run in runs:
        if run.error:
            print(f"| {LABELS[run.judge]} | (failed: {run.error}) | | | | | | | | |")
            continue
        entry = {
            "startup_s": run.startup_s,
            "phases": {},
            "overhead": run.overhead,
            "memory": run.memory,
            "replaced_workers": run.replaced_workers,
            "load_average_1min": run.load,
        }
        for phase in [*run.phases.values(), combined(run)]:
            lat = [r.seconds * 1e3 for r in phase.records]
            ref_phase = None
            if ref is not None:
                ref_phase = (
                    combined(ref) if phase.workload == "all" else ref.phases.get(phase.workload)
                )
            same, total, differ = agreement(phase, ref_phase)
            if phase.workload != "all":
                disagreements += [(run.judge, *d) for d in differ]
            mark = ""
            if phase.sampled_from:
                mark = "*"
                if phase.workload != "all":
                    notes.append(
                        f"* {LABELS[run.judge]} ran {phase.programs} of "
                        f"{phase.sampled_from} {phase.workload} programs; tests/s is "
                        "their rate, and the 'all' row extrapolates their wall time to "
                        "the full workload."
                    )
            wall = phase.wall_s
            rate = phase.tests / wall if wall else float("nan")
            agree = "—" if run.judge == ref_name else f"{same}/{total}"
            labelled = [r for r in phase.records if r.id in expected]
            right = sum(r.accepted == expected[r.id] for r in labelled)
            print(
                f"| {LABELS[run.judge]} | {phase.workload}{mark} | {phase.programs} | "
                f"{phase.tests} | {_fmt(wall)} | {_fmt(rate)} | {_fmt(percentile(lat, 50))} | "
                f"{_fmt(percentile(lat, 99))} | {agree} | {right}/{len(labelled)} |"
            )
            entry["phases"][phase.workload] = {
                "programs": phase.programs,
                "tests": phase.tests,
                "wall_s": wall,
                "tests_per_s": rate,
                "p50_ms": percentile(lat, 50),
                "p99_ms": percentile(lat, 99),
                "agree": [same, total],
                "sampled_from": phase.sampled_from,
                "expected": [right, len(labelled)],
                "records": [asdict(r) for r in phase.records] if phase.workload != "all" else None,
            }
        out["judges"][run.judge] = entry
    for n in dict.fromkeys(notes):
        print(n)
    print(
        "'= expected': references accepted, generated solutions given the APPS judge's "
        "recorded label, trivial programs accepted."
    )

    # Ratios of tests/s.
    def rate(judge: str, workload: str) -> float:
        return (
            out["judges"]
            .get(judge, {})
            .get("phases", {})
            .get(workload, {})
            .get("tests_per_s", float("nan"))
        )

    pairs = [
        (a, b)
        for a in ("docker", "namespace")
        for b in ("cobalt", "lcb")
        if a in by_name and b in by_name
    ]
    if pairs:
        cols = [*workloads, "all"]
        print("\n| tests/s ratio | " + " | ".join(cols) + " | goal (on all) |")
        print("| --- | " + " | ".join("---:" for _ in cols) + " | --- |")
        for a, b in pairs:
            ratios = {w: rate(a, w) / rate(b, w) for w in cols}
            out["ratios"][f"{a}/{b}"] = ratios
            goal = ""
            if a == "docker":
                need = GOAL_COBALT_RATIO if b == "cobalt" else GOAL_LCB_RATIO
                met = ratios["all"] >= need
                goal = f">= {need:g}x: {'met' if met else 'MISSED'}"
                out["goals"][f"docker >= {need:g}x {b}"] = {"value": ratios["all"], "met": met}
            print(
                f"| {a} / {b} | " + " | ".join(f"{ratios[w]:.2f}x" for w in cols) + f" | {goal} |"
            )

    # Overhead, start-up, memory.
    if any(r.overhead for r in ok_runs):
        print(
            "\n| judge | start-up s | per-test overhead, trivial program, 1 worker (ms) "
            "| one-test program (ms) |"
        )
        print("| --- | ---: | ---: | ---: |")
        for run in ok_runs:
            o = run.overhead or {}
            extra = ""
            if "per_test_median_ms" in o:
                extra = f" (median single test {o['per_test_median_ms']:.2f})"
            print(
                f"| {LABELS[run.judge]} | {_fmt(run.startup_s, 2)} | "
                f"{_fmt(o.get('per_test_ms', float('nan')), 2)}{extra} | "
                f"{_fmt(o.get('one_test_program_ms', float('nan')), 1)} |"
            )
        if "docker" in by_name and by_name["docker"].overhead:
            value = by_name["docker"].overhead["per_test_ms"]
            met = value < GOAL_OVERHEAD_MS
            out["goals"][f"docker overhead < {GOAL_OVERHEAD_MS:g} ms/test"] = {
                "value": value,
                "met": met,
            }
    print()
    if "docker" in by_name and by_name["docker"].memory:
        mem = by_name["docker"].memory
        sizes = ", ".join(f"{r['mib']:.1f}" for r in mem["containers"])
        met = mem["max_mib"] < GOAL_MEMORY_MIB
        out["goals"][f"warm docker container < {GOAL_MEMORY_MIB:g} MiB"] = {
            "value": mem["max_mib"],
            "met": met,
        }
        print(
            f"warm idle Docker worker memory (docker stats, usage - cache): {sizes} MiB "
            f"(max {mem['max_mib']:.1f} MiB)"
        )
    for run in ok_runs:
        if run.replaced_workers is not None:
            print(
                f"{LABELS[run.judge]}: workers replaced during the run: {run.replaced_workers} "
                "(tainted by a timeout or leftovers)"
            )
    loads = ", ".join(f"{r.judge} {r.load[0]:.1f}->{r.load[1]:.1f}" for r in runs if r.load)
    print(f"1-minute load average before->after each judge: {loads}")
    if disagreements:
        print(
            f"\nverdicts that differ from {ref_name} (judge: program: its status vs "
            f"{ref_name}'s; expected):"
        )
        for judge, pid, theirs, ours in disagreements:
            want = {True: "should pass", False: "should fail", None: ""}[expected.get(pid)]
            print(f"  {judge}: {pid}: {theirs} vs {ours}; {want}")
    out["disagreements"] = [list(d) for d in disagreements]
    if out["goals"]:
        print("\ngoals:")
        for goal, g in out["goals"].items():
            print(f"  {goal}: {'met' if g['met'] else 'MISSED'} ({g['value']:.2f})")
    return out


# ------------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sandbox_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--judges",
        default=",".join(JUDGES),
        help=f"comma-separated judges, run in this order (default: {','.join(JUDGES)})",
    )
    parser.add_argument(
        "--trivial",
        type=int,
        default=100,
        metavar="N",
        help="trivial programs in the workload (default 100; 0: none)",
    )
    parser.add_argument(
        "--trivial-tests",
        type=int,
        default=10,
        metavar="K",
        help="tests per trivial program (default 10)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=4.0,
        metavar="S",
        help="seconds per test, the same for every judge (default 4)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=os.cpu_count() or 1,
        metavar="C",
        help="programs (ours, LCB-style) or tests (Cobalt-style) at once, the "
        "same for every judge (default: CPU count)",
    )
    parser.add_argument(
        "--cobalt-sample",
        type=float,
        default=0.3,
        metavar="F",
        help="fraction of the trivial programs the (slow) Cobalt-style judge "
        "runs; its tests/s is their rate and its 'all' wall time is "
        "extrapolated (default 0.3; 1: all). Real programs always run in full",
    )
    parser.add_argument(
        "--overhead-tests",
        type=int,
        default=100,
        metavar="K",
        help="tests of the trivial program used to measure per-test overhead "
        "on one worker (default 100)",
    )
    parser.add_argument(
        "--overhead-reps",
        type=int,
        default=5,
        metavar="R",
        help="repetitions of that measurement (default 5; Cobalt-style: 1)",
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip the single-worker overhead measurement"
    )
    parser.add_argument(
        "--sample",
        type=Path,
        default=SAMPLE,
        help="TACO/APPS rows with solutions and generated_solutions (JSONL)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="OUT",
        help="also write every figure and per-program verdict to OUT (JSON)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    judges = [j.strip() for j in args.judges.split(",") if j.strip()]
    unknown = [j for j in judges if j not in JUDGES]
    if unknown:
        print(f"unknown judge(s) {unknown}; choose from {', '.join(JUDGES)}", file=sys.stderr)
        return 2
    if args.concurrency < 1 or args.timeout <= 0 or not 0 < args.cobalt_sample <= 1:
        print("--concurrency >= 1, --timeout > 0 and 0 < --cobalt-sample <= 1", file=sys.stderr)
        return 2
    workload = load_workload(args.sample, args.trivial, args.trivial_tests)
    info = machine_info()
    began = time.perf_counter()
    runs = []
    for name in judges:
        print(f"[{time.perf_counter() - began:6.1f}s] {name} ...", file=sys.stderr)
        load = os.getloadavg()[0]
        try:
            if name in ("docker", "namespace"):
                runs.append(asyncio.run(run_ours(name, workload, args)))
            else:
                why = CobaltStyleJudge.available() if name == "cobalt" else None
                if why:
                    raise RuntimeError(why)
                runs.append(run_peer(name, workload, args))
        except Exception as e:  # one judge failing must not hide the others
            runs.append(JudgeRun(name, error=f"{type(e).__name__}: {e}"))
            print(f"{name} failed: {type(e).__name__}: {e}", file=sys.stderr)
        runs[-1].load = (load, os.getloadavg()[0])
    print(f"[{time.perf_counter() - began:6.1f}s] done", file=sys.stderr)
    result = report(runs, args, info, workload)
    result["benchmark_seconds"] = time.perf_counter() - began
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(not r.error for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
