#!/usr/bin/env bash
# The embedded default's settings over many seeds at once on a device machine's CPU cores (16 on the
# H200 host: ~7x this project's 2-core VM), the way scripts/embedded_seeds.py runs them here: one
# process per seed, one thread each, each running the settings of PLAN
# (scripts/gpu/params/scan*.txt) in order (one line = the flags of one embedded_seeds.py setting).
# The GPU is hidden from them: the embedded default is a CPU run, and these are CPU figures.
# Results: $OUT/scan.json (the processes add their seeds to one embedded_seeds.py results file,
# under its lock).
#
#   bash scripts/gpu/seed_scan.sh SEEDS SECONDS PLAN  # e.g. 0-13 520 scripts/gpu/params/scan.txt
#
# It returns when every seed has run the whole plan, or after SECONDS (a device call's limit):
# then the seeds still running are stopped, and a later call goes on where they stopped (the
# stages are content-keyed; a seed already in the results file is not run again) while the
# machine keeps SCAN_DIR (default /tmp/scan). Needs the bundle's train, vllm and prefect groups
# (infra/gpu-bundle) and the embedded reference carried in .gpu/fitted-seed0 (the one fitted on
# the VM, so every machine starts from the same model; a plan's own --config may name another).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
device_setup
first="${1%-*}"; last="${1#*-}"; seconds="$2"; plan="$(realpath "$3")"
scan="${SCAN_DIR:-/tmp/scan}"; mkdir -p "$scan/runs/models" "$scan/logs"
if [ -d .gpu/fitted-seed0 ] && [ ! -d "$scan/runs/models/fitted-seed0" ]; then
  cp -r .gpu/fitted-seed0 "$scan/runs/models/"
fi
printf '%s\n' '{"sandbox": {"backend": "namespace", "concurrency": 2}}' >"$scan/config.json"
export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PREFECT_UI_ENABLED=false
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 SCAN="$scan" PLAN="$plan"
# one seed: the plan's settings in order (a process group of its own, stopped as one)
one_seed='
  export PREFECT_HOME="$SCAN/prefect-$0"
  while read -r flags; do
    [ -z "$flags" ] || [ "${flags:0:1}" = "#" ] && continue
    python3 scripts/embedded_seeds.py --seeds "$0" --storage "$SCAN/runs" \
      --config "$SCAN/config.json" --out "$SCAN/scan.json" $flags >>"$SCAN/logs/seed-$0.log" 2>&1
  done <"$PLAN"'
seeds=0
for seed in $(seq "$first" "$last"); do
  setsid bash -c "$one_seed" "$seed" </dev/null &
  seeds=$((seeds + 1))
done
deadline=$((SECONDS + seconds))
while [ "$SECONDS" -lt "$deadline" ] && [ -n "$(jobs -rp)" ]; do sleep 2; done
running=$(jobs -rp | wc -l)
for pid in $(jobs -rp); do kill -TERM -- "-$pid" 2>/dev/null; done
cp "$scan/scan.json" "$OUT/" 2>/dev/null
for seed in $(seq "$first" "$last"); do
  tail -c 3000 "$scan/logs/seed-$seed.log" >"$OUT/seed-$seed.tail.log" 2>/dev/null
done
echo "seed_scan: $running of $seeds seeds stopped at the deadline; seeds per setting:"
python3 -c 'import json, sys
for label, entry in json.load(open(sys.argv[1]))["settings"].items():
    print("  " + label + ":", len(entry["seeds"]))' "$scan/scan.json" 2>/dev/null
uptime
