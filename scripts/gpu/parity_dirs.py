"""benchmarks/parity.py's table recomputed from the run directories a harness left when it was
stopped before printing (its --work, or its /tmp/parity-* directory): each layout's log history
and reduce dtype from its launch's result.json, its weights from its saved policy.

    python scripts/gpu/parity_dirs.py /tmp/parity-XXXX --start /root/model-07b \\
        --layouts 1 2:ddp 2:fsdp 2:zero3          # the first is the base
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.parity import compare, steps_diff, weights  # noqa: E402


def history(directory: Path) -> tuple[dict[str, list[float]], Any, Any]:
    """The layout's per-step loss and gradient norm, reduce dtype and training seconds."""
    found = json.loads((directory / ".launch" / "result.json").read_text())
    steps = [h for h in found["history"] if "loss" in h and "step" in h]
    series = {k: [float(h.get(k, float("nan"))) for h in steps] for k in ("loss", "grad_norm")}
    reduce = (found["extra"].get("numerics") or {}).get("reduce_in_use")
    return series, reduce, found["timing"].get("total_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--start", type=Path, required=True, help="the starting model")
    parser.add_argument("--layouts", nargs="+", required=True)
    args = parser.parse_args(argv)
    start = weights(args.start)
    base, _, _ = history(args.work / args.layouts[0])
    rows = []
    for layout in args.layouts:
        series, reduce, seconds = history(args.work / layout)
        row = {"layout": layout, "train_s": seconds, "reduce": reduce}
        row |= steps_diff(base, series) | compare(
            args.work / args.layouts[0], args.work / layout, start
        )
        rows.append({k: float(f"{v:.3g}") if isinstance(v, float) else v for k, v in row.items()})
    print(json.dumps({"rows": rows, "first": base}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
