"""Per-stage wall time and peak GPU memory of the pipeline's flow runs, read from the Prefect API
(the server of PREFECT_API_URL, or the ephemeral one of PREFECT_HOME) and an nvidia-smi trace
(`timestamp, memory.used MiB` every 0.5 s, scripts/gpu/worker.sh). Used by the GPU runs of issue 24.

    python scripts/gpu/flow_times.py --mem trace.csv --json stages.json
    python scripts/gpu/flow_times.py --wait-api 120      # wait for PREFECT_API_URL to answer
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import time
import urllib.request
from pathlib import Path


def wait_api(seconds: float) -> int:
    url = os.environ["PREFECT_API_URL"].rstrip("/") + "/health"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    print(f"Prefect API up at {url}")
                    return 0
        except OSError:
            time.sleep(1)
    print(f"Prefect API at {url} did not answer in {seconds} s", file=sys.stderr)
    return 1


def memory_trace(path: Path | None) -> list[tuple[float, float]]:
    """(epoch seconds, GiB used) from nvidia-smi's csv (timestamp like 2026/11/25 10:00:00.123)."""
    if path is None or not path.exists():
        return []
    points = []
    for line in path.read_text().splitlines():
        try:
            stamp, used = (x.strip() for x in line.split(","))
            when = dt.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f")
        except ValueError:
            continue
        points.append((when.replace(tzinfo=dt.UTC).timestamp(), float(used) / 1024))
    return points


async def flow_runs() -> list[dict]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        runs = await client.read_flow_runs(limit=200)
        flows = {f.id: f.name for f in await client.read_flows(limit=200)}
    out = []
    for run in runs:
        if run.start_time is None:
            continue
        end = run.end_time or dt.datetime.now(dt.UTC)
        out.append(
            {
                "flow": flows.get(run.flow_id, "?"),
                "run": run.name,
                "state": run.state_name,
                "start": run.start_time.timestamp(),
                "end": end.timestamp(),
                "wall_s": round(end.timestamp() - run.start_time.timestamp(), 1),
            }
        )
    return sorted(out, key=lambda r: r["start"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wait-api", type=float, help="only wait for the API (seconds)")
    parser.add_argument("--mem", type=Path, help="nvidia-smi memory trace (csv)")
    parser.add_argument("--json", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    if args.wait_api:
        return wait_api(args.wait_api)
    trace = memory_trace(args.mem)
    rows = asyncio.run(flow_runs())
    for row in rows:
        inside = [gib for t, gib in trace if row["start"] <= t <= row["end"]]
        row["peak_gpu_gib"] = round(max(inside), 1) if inside else None
    print(f"{'flow run':36} {'state':10} {'wall s':>8} {'peak GPU GiB':>13}")
    for row in rows:
        print(
            f"{row['flow'] + '/' + row['run']:36.36} {row['state']:10} {row['wall_s']:8} "
            f"{row['peak_gpu_gib']!s:>13}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
