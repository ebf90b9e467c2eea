#!/usr/bin/env bash
# A multi-GPU host's device call used whole: the CPU seed scan (scripts/gpu/seed_scan.sh) on
# most of its cores and, beside it, worker.sh steps on its GPUs (the product's GPU entry points),
# one step per card, each on STEP_CPUS (default 8) cores of its own at the top of the CPU list.
#
#   bash scripts/gpu/scan_and_steps.sh SEEDS SECONDS PLAN [STEP ...]
#   e.g.  28-73 540 scripts/gpu/params/scan3.txt "pipeline" "learning lc 0,1 --smoke"
#
# The scan's results as seed_scan.sh's ($OUT/scan.json, seed logs); each step's as pair.sh's
# ($OUT/<tag>.tgz). Steps are stopped 20 s after the scan's deadline (STEP_TIMEOUT_S).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
device_setup  # installs the bundle's pieces once, for the scan and the steps
seeds="$1"; seconds="$2"; plan="$3"; shift 3
cpus=$(nproc); per_step="${STEP_CPUS:-8}"; gpus=$(gpu_count)
[ "$#" -le "$gpus" ] || { echo "scan_and_steps: $# steps for $gpus GPUs"; exit 2; }
step=0
for spec in "$@"; do
  top=$(( cpus - 1 - step * per_step ))
  STEP_TIMEOUT_S=$(( seconds + 20 )) run_step "$step" "$(( top - per_step + 1 ))-$top" "$spec" &
  step=$(( step + 1 ))
done
scan_cpus="0-$(( cpus - 1 - step * per_step ))"
echo "scan_and_steps: $step step(s) on the first GPUs, the scan on CPUs $scan_cpus"
taskset -c "$scan_cpus" bash scripts/gpu/seed_scan.sh "$seeds" "$seconds" "$plan"
wait
