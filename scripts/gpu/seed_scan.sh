#!/usr/bin/env bash
# Issue 27's settings over many seeds at once on a device machine's CPU cores (16 on the H200
# host: ~7x this project's 2-core VM), the way scripts/embedded_seeds.py runs them here: one
# process per seed, one thread each, each running the settings of PLAN (scripts/gpu/params/scan*.txt)
# in order (one line = the flags of one embedded_seeds.py setting). The GPU is hidden from them: the
# embedded default is a CPU run, and these are CPU figures. Results: $OUT/scan.json (the
# processes add their seeds to one embedded_seeds.py results file, under its lock).
#
#   bash scripts/gpu/seed_scan.sh SEEDS SECONDS PLAN  # e.g. 0-13 520 scripts/gpu/params/scan.txt;
#                                                    # a later call goes on where the last stopped
#                                                    # (storage in /tmp/scan, while the machine is warm)
#
# Needs the bundle's train, vllm and prefect groups (infra/gpu-bundle) and the embedded reference
# carried in .gpu/fitted-seed0 (the one fitted here, so every machine starts from the same model).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device-env.sh
first="${1%-*}"; last="${1#*-}"; seconds="$2"; plan="$3"
scan=/tmp/scan; mkdir -p "$scan/runs/models" "$scan/logs"
if [ -d .gpu/fitted-seed0 ] && [ ! -d "$scan/runs/models/fitted-seed0" ]; then
  cp -r .gpu/fitted-seed0 "$scan/runs/models/"
fi
printf '%s\n' '{"sandbox": {"backend": "namespace", "concurrency": 2}}' >"$scan/config.json"
export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PREFECT_UI_ENABLED=false
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
for seed in $(seq "$first" "$last"); do
  (
    export PREFECT_HOME="$scan/prefect-$seed"
    while read -r flags; do
      [ -z "$flags" ] || [ "${flags:0:1}" = "#" ] && continue
      # shellcheck disable=SC2086  # one line = several flags
      python3 scripts/embedded_seeds.py --seeds "$seed" --storage "$scan/runs" \
        --config "$scan/config.json" --out "$scan/scan.json" $flags \
        >>"$scan/logs/seed-$seed.log" 2>&1
    done <"$plan"
  ) &
done
sleep "$seconds"
cp "$scan/scan.json" "$OUT/" 2>/dev/null
for seed in $(seq "$first" "$last"); do tail -c 3000 "$scan/logs/seed-$seed.log" >"$OUT/seed-$seed.tail.log"; done
grep -h "^pipeline: Pass@1" "$scan"/logs/seed-*.log | wc -l
uptime
