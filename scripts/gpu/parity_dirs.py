"""Recompute benchmarks/parity.py's table from the run directories a timed-out harness left (its --work,
or /tmp/parity-*): python scripts/gpu/parity_dirs.py DIR."""
import json, sys
from pathlib import Path
from benchmarks.parity import compare, steps_diff, weights
d = Path(sys.argv[1]); start = weights(Path("/root/model-07b"))
def hist(name):
    h = json.loads((d / name / ".launch" / "result.json").read_text())
    steps = [x for x in h["history"] if "loss" in x and "step" in x]
    return {k: [float(x.get(k, float("nan"))) for x in steps] for k in ("loss", "grad_norm")}, h["extra"].get("numerics", {}).get("reduce_in_use"), h["timing"].get("total_s")
base, _, _ = hist("1")
rows = []
for name in ("1", "2:ddp", "2:fsdp", "2:zero3"):
    hs, reduce, t = hist(name)
    row = {"layout": name, "train_s": t, "reduce": reduce} | steps_diff(base, hs) | compare(d / "1", d / name, start)
    rows.append({k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in row.items()})
print(json.dumps(rows, indent=1)); print("losses", base)
