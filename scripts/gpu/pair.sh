#!/usr/bin/env bash
# Two worker.sh steps at once on a two-GPU machine, one per card, each on half of the CPUs (one
# device call, twice the work); one after the other where only one GPU is visible. Each step's
# files land in $OUT/<tag>/ and are packed into $OUT/<tag>.tgz (a call brings back few files).
#
#   bash scripts/gpu/pair.sh "learning i25a 30,31,32 --modes cobalt" "paper --steps 3"
#
# Environment: STEP_TIMEOUT_S (default 560) stops a step that would outlive the call; PAIR_WORKER
# (default scripts/gpu/worker.sh) is the script each step runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device-env.sh  # installs the bundle's pieces once, for both steps
export BUNDLE_READY=1
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
cpus=$(nproc)
run_step() {  # run_step GPU CPUS "STEP ARGS..."   (CPUS: a taskset list, e.g. 0-15)
  local i="$1" cpu_list="$2" spec="$3" tag
  # the step's name, and its first argument unless that is a flag: learning-i25a, deploy-8b, paper
  tag="$(echo "$spec" | awk '{t = $1; if ($2 != "" && substr($2, 1, 1) != "-") t = t "-" $2; print t}' \
    | tr -c 'A-Za-z0-9_.\n-' '_')"
  mkdir -p "$OUT/$tag"
  # shellcheck disable=SC2086
  OUT="$OUT/$tag" CUDA_VISIBLE_DEVICES="$i" timeout "${STEP_TIMEOUT_S:-560}" \
    taskset -c "$cpu_list" bash "${PAIR_WORKER:-scripts/gpu/worker.sh}" $spec \
    >"$OUT/$tag/step.log" 2>&1
  echo "[$tag] exit $? on GPU $i, CPUs $cpu_list"
  tail -15 "$OUT/$tag/step.log"
  tar -czf "$OUT/$tag.tgz" -C "$OUT" "$tag" && rm -rf "${OUT:?}/$tag"
}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
half=$(( cpus / 2 ))
if [ "$gpus" -ge 2 ] && [ "$#" -ge 2 ] && [ "$half" -ge 1 ]; then
  run_step 0 "0-$(( half - 1 ))" "$1" & run_step 1 "$half-$(( cpus - 1 ))" "$2" & wait
else
  for spec in "$@"; do run_step 0 "0-$(( cpus - 1 ))" "$spec"; done
fi
