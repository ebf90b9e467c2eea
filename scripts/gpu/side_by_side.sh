#!/usr/bin/env bash
# N embedded-default pipelines at once on an N-GPU host: `worker.sh pipeline` on each
# card, each with its own storage (/tmp/runs-pipeline-<i>: its own reference fit) and Prefect home,
# and none pinned to cores (no taskset: as N users' runs would be), which is where torch's one
# thread per core made three runs' reference fits thrash. Each run's files are packed into
# $OUT/pipeline-<i>.tgz (a call brings back few files); its exit and wall time are printed.
#
#   bash scripts/gpu/side_by_side.sh 3 [PIPELINE ARGS]      # three runs, GPUs 0-2
#
# Environment: STEP_TIMEOUT_S (default 560) stops a run that would outlive the call; PAIR_WORKER
# (default scripts/gpu/worker.sh) is the script each run starts.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
device_setup  # installs the bundle's pieces once, for every run
runs="${1:-3}"; shift || true
gpus=$(gpu_count)
[ "$runs" -le "$gpus" ] || { echo "side_by_side: $runs runs for $gpus GPUs"; exit 2; }
echo "side_by_side: $runs pipelines at once, one per GPU, on $(nproc) shared cores"
for i in $(seq 0 $(( runs - 1 ))); do
  (
    tag="pipeline-$i"; started=$(date +%s)
    mkdir -p "$OUT/$tag"
    OUT="$OUT/$tag" CUDA_VISIBLE_DEVICES="$i" PIPELINE_TAG="$tag" PREFECT_HOME="/tmp/prefect-home-$i" \
      timeout "${STEP_TIMEOUT_S:-560}" bash "${PAIR_WORKER:-scripts/gpu/worker.sh}" pipeline "$@" >"$OUT/$tag/step.log" 2>&1
    code=$?
    echo "[$tag] exit $code on GPU $i after $(( $(date +%s) - started )) s"
    tail -12 "$OUT/$tag/step.log"
    tar -czf "$OUT/$tag.tgz" -C "$OUT" "$tag" && rm -rf "${OUT:?}/$tag"
  ) &
done
wait
