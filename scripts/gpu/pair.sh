#!/usr/bin/env bash
# Two worker.sh steps at once on a two-GPU machine, one per card, each on half of the CPUs (one
# device call, twice the work); one after the other where only one GPU is visible. Each step's
# files land in $OUT/<tag>/ and are packed into $OUT/<tag>.tgz (a call brings back few files).
#
#   bash scripts/gpu/pair.sh "learning i25a 30,31,32 --modes cobalt" "paper --steps 3"
#
# Environment: STEP_TIMEOUT_S, PAIR_WORKER (run_step in scripts/gpu/lib.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
device_setup  # installs the bundle's pieces once, for both steps
gpus=$(gpu_count)
cpus=$(nproc)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
half=$(( cpus / 2 ))
if [ "$gpus" -ge 2 ] && [ "$#" -ge 2 ] && [ "$half" -ge 1 ]; then
  run_step 0 "0-$(( half - 1 ))" "$1" & run_step 1 "$half-$(( cpus - 1 ))" "$2" & wait
else
  for spec in "$@"; do run_step 0 "0-$(( cpus - 1 ))" "$spec"; done
fi
