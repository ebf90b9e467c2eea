"""Sandbox throughput: our Docker and namespace backends against two peer judges.

Three parts (--parts), each judging with every selected judge, the same concurrency and the same
per-test timeout:

  cli       whole processes, as a user runs them, start-up included: `python -m sandbox judge`
            on --cli-programs programs of `print(input())` with --cli-tests tests each (default
            600 x 2 = 1,200 trivial tests), once with workers of its own ("cold": a new user's
            first run, and every run without a server) and once through a running `python -m
            sandbox serve` ("server": its start-up is reported apart, paid once per machine);
            the peers as `python -m benchmarks.peers {cobalt,lcb}` on the same rows.
            Repeated --cli-reps times, interleaved; the median is reported.
  mixed     in-process, each judge started and warmed up first (start-up reported apart):
              apps     every reference and generated solution in samples/apps_sample.jsonl
                       (real programs; a few time out, which costs every judge the same)
              trivial  --trivial copies of `print(input())` with --trivial-tests tests each
            under --policy: fail-fast (default; a program stops at its first failing test, as
            LiveCodeBench does, so a program that times out pays one timeout) or all (every test
            of every program).
  overhead  per-test cost on a warm worker: a --overhead-tests-test trivial program judged by
            one worker, wall / tests, and the latency of a one-test program.

Judges:

  docker     our Docker backend (warm pool of hardened containers, one fork per test)
  namespace  our namespace backend (warm self-jailed runners, one fork per test)
  cobalt     Cobalt-style evaluator: a new multiprocessing.Process per test, running bubblewrap
             around a fresh python3 (benchmarks/peers.py; needs `bwrap`)
  lcb        LiveCodeBench-style judge: a process pool; per program a Manager and one
             multiprocessing.Process that runs all tests in-process under SIGALRM timers

It prints markdown tables: whole-process wall times and their ratios; per judge and workload
programs, tests, wall seconds, tests/s, p50/p99 per-program latency and how many verdicts
(accepted or not) agree with the Docker backend's; the tests/s ratios; per-test overhead; the
memory of a warm idle Docker worker; and which of the sandbox's speed goals are met.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from benchmarks.peers import CobaltStyleJudge, LcbStyleJudge, PeerResult, Program
from sandbox import Judge, JudgeRequest, Limits, SandboxConfig, TestSuite
from sandbox.formats import taco_tests

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "apps_sample.jsonl"
JUDGES = ("docker", "namespace", "cobalt", "lcb")
LABELS = {
    "docker": "docker (ours)",
    "namespace": "namespace (ours)",
    "cobalt": "Cobalt-style",
    "lcb": "LCB-style",
}
PARTS = ("cli", "mixed", "overhead")
POLICIES = ("fail-fast", "all")
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


async def _ours_phase(judge: Judge, name: str, programs: list[Program], label: str, args) -> Phase:
    # At most `concurrency` programs are handed to the judge at once, like the peers' pools, so a
    # program's latency (and its suite deadline) starts when a worker is free for it.
    gate = asyncio.Semaphore(args.concurrency)
    bar = _bar(f"{label} {name}", len(programs), args.quiet)

    async def one(p: Program) -> Record:
        async with gate:
            start = time.perf_counter()
            v = await judge.judge(_request(p), fail_fast=args.policy == "fail-fast")
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


async def _ours_overhead(backend: str, args) -> dict:
    """Per-test cost on a trivial program, one worker, measured from here (the host)."""
    config = SandboxConfig(
        backend=backend, concurrency=1, limits=Limits(timeout_s=args.timeout), use_server=False
    )
    many = _request(trivial_program(0, args.overhead_tests))
    one = _request(trivial_program(1, 1))
    async with Judge(config) as judge:
        await judge.judge(many)  # warm-up
        per_test = []
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
        "method": f"median of {args.overhead_reps} runs of a {args.overhead_tests}-test "
        "trivial program on 1 warm worker, wall / tests; one-test program: "
        "median of 20",
    }


async def run_ours(backend: str, workload: dict[str, list[Program]], args) -> JudgeRun:
    run = JudgeRun(backend)
    config = SandboxConfig(
        backend=backend,
        concurrency=args.concurrency,
        limits=Limits(timeout_s=args.timeout),
        use_server=False,  # in-process: our own pool (the cli part measures the server)
    )
    start = time.perf_counter()
    judge = Judge(config)
    await judge.__aenter__()
    run.startup_s = time.perf_counter() - start
    try:
        warm = _request(trivial_program(0, 1))
        await asyncio.gather(*(judge.judge(warm) for _ in range(args.concurrency)))
        for name, programs in workload.items():
            run.phases[name] = await _ours_phase(judge, name, programs, backend, args)
        run.replaced_workers = judge.pool.replaced
        if backend == "docker":
            run.memory = await asyncio.to_thread(_container_memory, judge.backend)
    finally:
        await judge.__aexit__(None, None, None)
    if "overhead" in args.parts:
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
            results = judge.judge_many(
                chosen,
                on_done=lambda i, r, bar=bar: bar.update(),
                fail_fast=args.policy == "fail-fast",
            )
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
    if "overhead" in args.parts:
        run.overhead = _peer_overhead(name, args)
    return run


# ------------------------------------------------------------------------------------------------
# Whole processes (the cli part)


@dataclass
class CliRun:
    """One judge run as a whole process, --cli-reps times."""

    judge: str
    mode: str = ""  # ours: "cold" (workers of its own) or "server" (through `sandbox serve`)
    walls: list[float] = field(default_factory=list)
    right: list[int] = field(default_factory=list)  # verdicts right (all accepted) per run
    server_startup_s: float | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{LABELS[self.judge]}, {self.mode}" if self.mode else LABELS[self.judge]

    @property
    def wall(self) -> float:
        return statistics.median(self.walls) if self.walls else float("nan")


def _subprocess_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{path}" if path else str(ROOT)}


def _python_m(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


class ServerProcess:
    """`python -m sandbox serve` on a socket of our own, for the runs through a server."""

    def __init__(self, backend: str, directory: Path, args):
        self.address = str(directory / f"{backend}.sock")
        start = time.perf_counter()
        self.log = (directory / f"{backend}-server.log").open("w")
        self.proc = subprocess.Popen(
            [
                *_python_m("sandbox", "serve", "--socket", self.address, "--backend", backend),
                *("--concurrency", str(args.concurrency), "--timeout", f"{args.timeout:g}"),
            ],
            cwd=ROOT,
            env=_subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        from sandbox.client import request

        while True:
            try:
                asyncio.run(request(self.address, {"op": "status"}, timeout=5))
                break
            except (OSError, TimeoutError, ValueError):
                if self.proc.poll() is not None or time.perf_counter() - start > 120:
                    raise RuntimeError(f"the {backend} server did not start") from None
                time.sleep(0.05)
        self.startup_s = time.perf_counter() - start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.log.close()


def write_cli_rows(path: Path, programs: int, tests: int) -> None:
    with path.open("w") as f:
        for i in range(programs):
            p = trivial_program(i, tests)
            f.write(_request(p).model_dump_json() + "\n")


def _timed_run(cmd: list[str], out: Path) -> tuple[float, int, str | None]:
    """Wall seconds of one whole process, verdicts right, and its error if it failed."""
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_subprocess_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return wall, 0, (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return wall, sum(r["status"] == "accepted" for r in rows), None


def run_cli_part(judges: list[str], args) -> list[CliRun]:
    """Each selected judge as a whole process on the same rows, interleaved repetitions."""
    work = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    os.chmod(work, 0o700)
    rows = work / "programs.jsonl"
    write_cli_rows(rows, args.cli_programs, args.cli_tests)
    common = ["--concurrency", str(args.concurrency), "--timeout", f"{args.timeout:g}"]
    runs: list[tuple[CliRun, list[str] | None, Path]] = []
    servers: dict[str, ServerProcess] = {}
    try:
        for name in judges:
            out = work / f"{name}.jsonl"
            if name in ("docker", "namespace"):
                ours = _python_m("sandbox", "judge", "-i", str(rows), "-o", str(out), "-q")
                ours += ["--backend", name, *common]
                for mode in args.cli_modes:
                    run = CliRun(name, mode)
                    if mode == "server":
                        try:
                            servers[name] = ServerProcess(name, work, args)
                            run.server_startup_s = servers[name].startup_s
                        except (RuntimeError, OSError) as e:
                            run.error = str(e)
                        runs.append(
                            (
                                run,
                                [*ours, "--server", servers[name].address]
                                if name in servers
                                else None,
                                out,
                            )
                        )
                    else:
                        runs.append((run, [*ours, "--no-server"], out))
            else:
                why = CobaltStyleJudge.available() if name == "cobalt" else None
                run = CliRun(name, error=why)
                cmd = _python_m("benchmarks.peers", name, "-i", str(rows), "-o", str(out), *common)
                runs.append((run, None if why else cmd, out))
        for rep in range(args.cli_reps):
            for run, cmd, out in runs:
                if cmd is None or run.error:
                    continue
                if run.judge == "cobalt" and rep >= args.cobalt_cli_reps:
                    continue
                print(f"  cli: {run.label} (run {rep + 1})", file=sys.stderr)
                wall, right, error = _timed_run(cmd, out)
                if error:
                    run.error = error
                    continue
                run.walls.append(wall)
                run.right.append(right)
    finally:
        for server in servers.values():
            server.stop()
    return [run for run, _, _ in runs]


def _times(ratio: float, digits: int) -> str:
    return "n/a" if math.isnan(ratio) else f"{ratio:.{digits}f}x"


def report_cli(cli: list[CliRun], args) -> dict:
    n_tests = args.cli_programs * args.cli_tests
    by = {(r.judge, r.mode): r for r in cli if not r.error and r.walls}
    cobalt, lcb = by.get(("cobalt", "")), by.get(("lcb", ""))
    print(
        f"\n### Whole process: `python -m sandbox judge` and the peers on {args.cli_programs} "
        f"programs x {args.cli_tests} tests ({n_tests:,} trivial tests), start-up included\n"
    )
    print(
        "| judge | wall s (median) | runs (s) | tests/s | vs Cobalt-style | vs LCB-style "
        "| verdicts right |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    out: dict = {"programs": args.cli_programs, "tests": n_tests, "runs": {}, "goals": {}}
    for run in cli:
        if run.error or not run.walls:
            print(f"| {run.label} | (failed: {run.error}) | | | | | |")
            out["runs"][run.label] = {"error": run.error}
            continue
        vs_cobalt = cobalt.wall / run.wall if cobalt else float("nan")
        vs_lcb = lcb.wall / run.wall if lcb else float("nan")
        walls = ", ".join(f"{w:.2f}" for w in run.walls)
        print(
            f"| {run.label} | {run.wall:.2f} | {walls} | {n_tests / run.wall:.0f} | "
            f"{_times(vs_cobalt, 1)} | {_times(vs_lcb, 2)} | {min(run.right)}/{args.cli_programs} |"
        )
        out["runs"][run.label] = {
            "walls_s": run.walls,
            "wall_s": run.wall,
            "tests_per_s": n_tests / run.wall,
            "vs_cobalt": vs_cobalt,
            "vs_lcb": vs_lcb,
            "right": run.right,
            "server_startup_s": run.server_startup_s,
        }
    for run in cli:
        if run.server_startup_s is not None:
            print(
                f"{run.label}: the server's own start-up (once per machine, not in the times "
                f"above): {run.server_startup_s:.2f} s"
            )
    docker = by.get(("docker", "cold"))
    if docker and cobalt:
        ratio = cobalt.wall / docker.wall
        out["goals"][f"docker cold >= {GOAL_COBALT_RATIO:g}x cobalt, whole process"] = {
            "value": ratio,
            "met": ratio >= GOAL_COBALT_RATIO,
        }
    if docker and lcb:
        ratio = lcb.wall / docker.wall
        out["goals"][f"docker cold >= {GOAL_LCB_RATIO:g}x lcb, whole process"] = {
            "value": ratio,
            "met": ratio >= GOAL_LCB_RATIO,
        }
    return out


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


def print_header(info: dict, args) -> None:
    print(f"\n## Sandbox throughput ({info['date']})\n")
    print(
        f"machine: {info['nproc']} CPUs, {info['cpu']}, kernel {info['kernel']}, "
        f"Docker {info['docker']}, Python {info['python']}; 1-minute load at the start "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"parts {','.join(args.parts)}; concurrency {args.concurrency}, timeout "
        f"{args.timeout:g} s/test; mixed workload: policy {args.policy}, trivial programs "
        f"{args.trivial} x {args.trivial_tests} tests"
    )


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

    if workloads:
        print(f"\n### Mixed workload, in-process, policy {args.policy}\n")
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
        for phase in [*run.phases.values(), combined(run)] if run.phases else []:
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
    if workloads:
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
    if pairs and workloads:
        cols = [*workloads, "all"]
        print(f"\n| tests/s ratio (policy {args.policy}) | " + " | ".join(cols) + " |")
        print("| --- | " + " | ".join("---:" for _ in cols) + " |")
        for a, b in pairs:
            ratios = {w: rate(a, w) / rate(b, w) for w in cols}
            out["ratios"][f"{a}/{b}"] = ratios
            print(f"| {a} / {b} | " + " | ".join(f"{ratios[w]:.2f}x" for w in cols) + " |")

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
    if loads:
        print(f"1-minute load average before->after each judge (in-process): {loads}")
    if disagreements:
        print(
            f"\nverdicts that differ from {ref_name} (judge: program: its status vs "
            f"{ref_name}'s; expected):"
        )
        for judge, pid, theirs, ours in disagreements:
            want = {True: "should pass", False: "should fail", None: ""}[expected.get(pid)]
            print(f"  {judge}: {pid}: {theirs} vs {ours}; {want}")
    out["disagreements"] = [list(d) for d in disagreements]
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
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts to run (default: {','.join(PARTS)}; see above)",
    )
    parser.add_argument(
        "--cli-programs",
        type=int,
        default=600,
        metavar="N",
        help="cli part: trivial programs in the rows (default 600)",
    )
    parser.add_argument(
        "--cli-tests",
        type=int,
        default=2,
        metavar="K",
        help="cli part: tests per program (default 2: 1,200 tests in all)",
    )
    parser.add_argument(
        "--cli-reps",
        type=int,
        default=3,
        metavar="R",
        help="cli part: runs of each judge, interleaved; the median counts (default 3)",
    )
    parser.add_argument(
        "--cobalt-cli-reps",
        type=int,
        default=1,
        metavar="R",
        help="cli part: runs of the (slow) Cobalt-style judge (default 1)",
    )
    parser.add_argument(
        "--cli-modes",
        default="cold,server",
        help="cli part: how our judge runs: cold (workers of its own, --no-server) and/or "
        "server (through a `python -m sandbox serve` started for the benchmark) "
        "(default: cold,server)",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="fail-fast",
        help="mixed part: fail-fast (a program stops at its first failing test, as "
        "LiveCodeBench does; default) or all (every test of every program)",
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
        "--no-overhead",
        action="store_true",
        help="skip the overhead part (the same as leaving it out of --parts)",
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
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.cli_modes = [m.strip() for m in args.cli_modes.split(",") if m.strip()]
    if args.no_overhead and "overhead" in args.parts:
        args.parts.remove("overhead")
    if set(args.parts) - set(PARTS) or set(args.cli_modes) - {"cold", "server"}:
        print(f"--parts from {','.join(PARTS)}; --cli-modes from cold,server", file=sys.stderr)
        return 2
    workload = load_workload(args.sample, args.trivial, args.trivial_tests)
    if "mixed" not in args.parts:
        workload = {}
    info = machine_info()
    began = time.perf_counter()
    cli: list[CliRun] = []
    if "cli" in args.parts:
        print(f"[{time.perf_counter() - began:6.1f}s] cli part ...", file=sys.stderr)
        cli = run_cli_part(judges, args)
    runs = []
    for name in judges if workload or "overhead" in args.parts else []:
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
    print_header(info, args)
    cli_out = report_cli(cli, args) if cli else {"goals": {}}
    result = report(runs, args, info, workload)
    result["cli"] = cli_out
    result["goals"] = {**cli_out["goals"], **result["goals"]}
    if result["goals"]:
        print("goals:")
        for goal, g in result["goals"].items():
            print(f"  {goal}: {'met' if g['met'] else 'MISSED'} ({g['value']:.2f})")
    result["benchmark_seconds"] = time.perf_counter() - began
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    failed = [r for r in runs if r.error] + [r for r in cli if r.error]
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
