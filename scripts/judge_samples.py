"""Judge the bundled APPS sample: every reference solution must pass, and every generated
solution must get the same verdict as the APPS judge recorded. Prints a table; exits 1 if not."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sandbox import JudgeRequest, SandboxConfig, SyncJudge
from sandbox.formats import taco_tests

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "apps_sample.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="auto", choices=["auto", "docker", "namespace"])
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="TACO/APPS rows (JSONL)")
    parser.add_argument(
        "--no-server",
        action="store_true",
        help="judge with workers of this process even if a sandbox server runs",
    )
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.sample.read_text().splitlines() if line.strip()]
    requests, labels = [], {}
    for p, row in enumerate(rows):
        tests = taco_tests(row["input_output"])
        for s, code in enumerate(json.loads(row["solutions"])):
            requests.append(JudgeRequest(id=f"{p}/ref/{s}", code=code, tests=tests))
        for g, gen in enumerate(row.get("generated_solutions", [])):
            requests.append(JudgeRequest(id=f"{p}/gen/{g}", code=gen["code"], tests=tests))
            labels[f"{p}/gen/{g}"] = bool(gen["passed"])
    start = time.perf_counter()
    with SyncJudge(SandboxConfig(backend=args.backend, use_server=not args.no_server)) as judge:
        backend = judge.backend_name + (f" (server {judge.server})" if judge.server else "")
        verdicts = judge.judge_many(requests)
    elapsed = time.perf_counter() - start
    print(f"{len(requests)} programs judged with the {backend} backend in {elapsed:.1f}s\n")
    print(f"{'problem':<48} {'refs passed':>12} {'generated agree':>16}")
    ok, disagreements = True, 0
    for p, row in enumerate(rows):
        refs = [v for v in verdicts if v.id.startswith(f"{p}/ref/")]
        gens = [v for v in verdicts if v.id.startswith(f"{p}/gen/")]
        ref_ok = sum(v.accepted for v in refs)
        agree = sum(v.accepted == labels[v.id] for v in gens)
        ok &= ref_ok == len(refs) and agree == len(gens)
        disagreements += len(refs) - ref_ok + len(gens) - agree
        print(f"{row.get('url', p)[:48]:<48} {ref_ok:>6}/{len(refs):<5} {agree:>9}/{len(gens):<6}")
    verdict = "all references pass and all APPS labels agree" if ok else "MISMATCH (see above)"
    print(f"\n{disagreements} disagreements: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
