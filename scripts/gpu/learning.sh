#!/usr/bin/env bash
# The learning check of issue 19 on the device (one call): the offline objectives side by side
# and offline_grpo, on the given seeds, three seed processes at once; the output directory comes
# back as one archive ($OUT/NAME.tgz; model weights left out). Aggregate here afterwards:
#   python scripts/learning_check.py --aggregate runs/i19a runs/i19b --out runs/learning_check_i19
#
#   bash scripts/gpu/learning.sh NAME SEEDS [more learning_check.py options]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash infra/gpu-bundle/install.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
name="$1"; seeds="$2"; shift 2
python3 scripts/learning_check.py --out "/tmp/$name" --seeds "$seeds" --parallel 3 \
  --modes offline_rloo,offline_awr,offline_clipped,offline_grpo --deadline-s 545 "$@" \
  >"$OUT/$name.log" 2>&1
echo "learning check exit $?"
tail -5 "$OUT/$name.log"
tar -czf "$OUT/$name.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' -C /tmp "$name"
ls -la "$OUT"
