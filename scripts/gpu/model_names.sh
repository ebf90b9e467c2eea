#!/usr/bin/env bash
# Model names on a GPU, one device call (about 8 min): a Hub id resolved offline from the Hub cache
# (the embedded fitted model laid out as cobalt-test/fitted, tests/hub_cache.py), the pipeline on
# it (engine auto: vLLM where installed, loading the cache's symlinked snapshot), the trained
# policy evaluated by the name the run printed with the pipeline's protocol (it must land in the
# pipeline's own 'evaluation after' directory: the same stage keys), then compared with the
# reference's evaluation. Results in $OUT/names-*.log.
#
#   bash scripts/gpu/model_names.sh [PIPELINE ARGS]      # e.g. --engine transformers
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
device_setup
export PREFECT_HOME=/tmp/prefect-home HF_HUB_CACHE=/tmp/hf-hub
runs=/tmp/runs-names
common=(--backend namespace --storage "$runs")
python3 - <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "tests")
from hub_cache import lay_out  # noqa: E402

from cobalt.reference import fit_embedded  # noqa: E402

commit = "a" * 40
lay_out(Path("/tmp/hf-hub"), "cobalt-test/fitted", {commit: fit_embedded("/tmp/fitted")},
        {"main": commit})
PY
python3 -m flows.pipeline --model cobalt-test/fitted --preset tiny --train-limit 16 \
  --eval-limit 12 --max-steps 4 "${common[@]}" "$@" >"$OUT/names-pipeline.log" 2>&1
echo "pipeline exit $?"
grep -E "^pipeline:|^trained policy|^trajectories \(|model cobalt-test" "$OUT/names-pipeline.log" \
  | cut -c1-300
policy=$(sed -n 's/^trained policy (a name --model takes): //p' "$OUT/names-pipeline.log")
where() { grep "| $1" "$OUT/names-pipeline.log" | grep -o "$runs/trajectories/evaluation/[0-9a-f]*"; }
before=$(where "evaluation before"); after=$(where "evaluation after")
python3 -m flows.trajectories --evaluation --preset tiny --model "$policy" --limit 12 \
  "${common[@]}" "$@" >"$OUT/names-eval.log" 2>&1
echo "evaluation exit $?"
mine=$(sed -n 's/^evaluation (for --compare, --trajectories): //p' "$OUT/names-eval.log")
if [ -n "$mine" ] && [ "$mine" = "$after" ]; then
  echo "the pipeline's own evaluation after: $mine"
else
  echo "NOT the pipeline's evaluation: '$mine' vs '$after'"
fi
python3 -m flows.trajectories --compare "$before" "$mine" --storage "$runs" 2>&1 \
  | tee "$OUT/names-compare.log"
