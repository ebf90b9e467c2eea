"""Per-stage wall time and peak GPU memory of the pipeline's flow runs, read from the Prefect API
(the server of PREFECT_API_URL, or the ephemeral one of PREFECT_HOME) and an nvidia-smi trace
(`timestamp, memory.used MiB` every 0.5 s, or every GPU's `index, timestamp, memory.used,
utilization.gpu`: then each stage also lists the GPUs it computed on; gpu_trace in
scripts/gpu/lib.sh). Used by the GPU runs of the pipeline and of the GPU plan.

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


def memory_trace(path: Path | None) -> list[tuple[float, str, float, int]]:
    """(epoch seconds, GPU index, GiB used, utilisation %) from nvidia-smi's csv (timestamp like
    2026/11/25 10:00:00.123); a trace of one GPU without an index column reads as GPU "0"."""
    if path is None or not path.exists():
        return []
    points = []
    for line in path.read_text().splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) == 2:
            fields = ["0", *fields, "0"]
        try:
            gpu, stamp, used, util = fields[:4]
            when = dt.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f")
            point = (
                when.replace(tzinfo=dt.UTC).timestamp(),
                gpu,
                float(used) / 1024,
                int(util or 0),
            )
        except ValueError:
            continue
        points.append(point)
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
        inside = [p for p in trace if row["start"] <= p[0] <= row["end"]]
        row["peak_gpu_gib"] = round(max(p[2] for p in inside), 1) if inside else None
        peaks: dict[str, float] = {}
        for _, gpu, gib, util in inside:
            if util > 0:  # computed on it at least once during the stage
                peaks[gpu] = round(max(peaks.get(gpu, 0.0), gib), 1)
        row["gpus_computing"] = dict(sorted(peaks.items()))
    print(f"{'flow run':36} {'state':10} {'wall s':>8} {'peak GPU GiB':>13}  GPUs computing (GiB)")
    for row in rows:
        print(
            f"{row['flow'] + '/' + row['run']:36.36} {row['state']:10} {row['wall_s']:8} "
            f"{row['peak_gpu_gib']!s:>13}  {row['gpus_computing']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
