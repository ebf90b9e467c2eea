#!/usr/bin/env bash
# The GPU runs of rollouts at the paper's model size, one step per device call, in the
# order they were made: each call carries one part of the offline bundle (infra/gpu-bundle) and
# runs what the parts carried so far allow. Results land in $OUT (JSON + logs).
#
#   bash scripts/gpu/rollout.sh STEP      # STEP: env, roofline-hf, traj-hf, roofline-vllm,
#                                         #       traj-vllm, grpo-8b, roofline-static
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device-env.sh
step="$1"; shift
case "$step" in
  env)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' ;;
  roofline-hf)
    python3 -m benchmarks.rollout_roofline --shapes 8b,1.5b --engines transformers \
      --batches 64,256 --cell-timeout-s 300 --json "$OUT/roofline_hf.json" "$@" ;;
  roofline-static)
    python3 -m benchmarks.rollout_roofline --shapes 8b --engines transformers-static \
      --batches 64 --cell-timeout-s 400 --json "$OUT/roofline_static.json" "$@" ;;
  traj-hf)
    python3 -m benchmarks.trajectory_throughput --modes padded --hidden 4096 --layers 36 \
      --heads 32 --kv-heads 8 --intermediate 12288 --problems 16 --n 16 --turns 2 \
      --chunk-size 16 --lanes 1 --eos-logit 0 --backend namespace --verbose \
      --model-dir /root/model-8b --json "$OUT/traj_hf.json" "$@" ;;
  roofline-vllm)
    python3 -c 'import vllm; print("vllm", vllm.__version__)' || exit 1
    python3 -m benchmarks.rollout_roofline --shapes 8b,1.5b --engines vllm \
      --batches 64,256 --cell-timeout-s 300 --json "$OUT/roofline_vllm.json" "$@" ;;
  traj-vllm)
    python3 -m benchmarks.trajectory_throughput --modes vllm,vllm-served --hidden 4096 \
      --layers 36 --heads 32 --kv-heads 8 --intermediate 12288 --problems 16 --n 16 --turns 2 \
      --chunk-size 16 --lanes 1 --eos-logit 0 --backend namespace --verbose \
      --model-dir /root/model-8b --json "$OUT/traj_vllm.json" "$@" ;;
  grpo-8b)
    python3 -m benchmarks.grpo_scaling --shape 8b --lora --processes 1 --bf16 \
      --generation vllm_colocate,transformers --gradient-checkpointing --per-device 64 \
      --micro-batch 16 --generations 8 --max-completion 256 --steps 5 --warmup 1 \
      --backend namespace --json "$OUT/grpo_8b.json" "$@" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
