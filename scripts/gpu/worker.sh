#!/usr/bin/env bash
# The GPU worker as a researcher runs it, one step per call (scripts/gpu/pair.sh runs two at once,
# side_by_side.sh N pipelines, scan_and_steps.sh steps beside the seed scan). Each call installs
# what the offline bundle's pieces carried so far; results land in $OUT. The measured recipes:
# scripts/gpu/recipe.sh.
#
#   bash scripts/gpu/worker.sh env                  # what the image has (pip list, GPU, sandbox)
#   bash scripts/gpu/worker.sh pipeline [ARGS]      # python -m flows.pipeline (embedded default):
#                                                   # PIPELINE_TAG names its files and storage,
#                                                   # PIPELINE_PROFILE=1 runs it under py-spy
#   bash scripts/gpu/worker.sh model-8b             # the Qwen3-8B-shaped random model, built once
#   bash scripts/gpu/worker.sh deploy NAME PARAMS   # Prefect server + prefect deploy pipeline-gpu
#                                                   # (or DEPLOYMENT=FLOW/NAME of prefect.yaml) + a
#                                                   # gpu-pool worker running it with PARAMS (JSON,
#                                                   # or a file of it: scripts/gpu/params/)
#   bash scripts/gpu/worker.sh wait NAME            # a deployment that outlived its call: wait for
#                                                   # its worker, then collect its logs
#   bash scripts/gpu/worker.sh paper [ARGS]         # benchmarks.paper_preset (8B, 10k + 6k tokens)
#   bash scripts/gpu/worker.sh learning NAME SEEDS [ARGS]  # experiments.learning_check, 3 at once
#   bash scripts/gpu/worker.sh rollout-gpus [ARGS]  # benchmarks.rollout_gpus: the trajectory stage
#                                                   # on 1 GPU, then on every visible GPU
#
#   bash scripts/gpu/worker.sh deploy tiny "$(cat scripts/gpu/params/deploy-tiny.json)"
#   bash scripts/gpu/worker.sh deploy 8b scripts/gpu/params/deploy-8b.json
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
device_setup
export PREFECT_HOME="${PREFECT_HOME:-/tmp/prefect-home}"
trace() { TRACE_GPUS="${CUDA_VISIBLE_DEVICES:-}" gpu_trace "$OUT/$1.mem.csv" timestamp,memory.used; }
build_8b() {  # the Qwen3-8B shape with the tiny tokenizer, no end-of-turn taste, built once
  [ -f /root/model-8b/config.json ] && return 0
  python3 -c 'from engines.tiny import build_tiny_model as b
b("/root/model-8b", seed=0, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
  intermediate_size=12288, max_position_embeddings=32768, eos_logit=0.0, device="cuda",
  dtype="bfloat16")'
  du -sh /root/model-8b
}
wait_deploy() {  # until the detached worker ends or the call's time is nearly spent; logs to $OUT
  local name="$1" logs="/root/deploy-$1" waited=0
  while [ ! -f "$logs/worker.rc" ] && [ "$waited" -lt "${DEPLOY_WAIT_S:-520}" ]; do
    sleep 5; waited=$((waited + 5))
  done
  if [ -f "$logs/worker.rc" ]; then
    echo "worker exit $(cat "$logs/worker.rc") after $(( $(date +%s) - $(cat "$logs/started") )) s"
    kill "$(cat "$logs/trace.pid")" 2>/dev/null
  else
    echo "worker still running after $(( $(date +%s) - $(cat "$logs/started") )) s:" \
      "bash scripts/gpu/worker.sh wait $name (within 30 s of this call's end)"
  fi
  cp "$logs"/*.log "$logs"/*.csv "$OUT/" 2>/dev/null
  python3 scripts/gpu/flow_times.py --mem "$OUT/$name.mem.csv" --json "$OUT/$name.stages.json"
  tail -30 "$OUT/$name.worker.log"
}
step="$1"; shift
case "$step" in
  env)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -m pip list --format=freeze >"$OUT/pip-list.txt" 2>/dev/null
    python3 -c 'import prefect, trl, torch; print("prefect", prefect.__version__, "trl", trl.__version__, "torch", torch.__version__)'
    python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -1
    cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null
    printf '%s\n' '{"id": "a", "code": "print(int(input()) * 2)", "tests": {"inputs": ["3"], "outputs": ["6"]}}' >/tmp/p.jsonl
    python3 -m sandbox judge -i /tmp/p.jsonl -o /tmp/v.jsonl --backend namespace -q; cat /tmp/v.jsonl ;;
  pipeline)
    tag="${PIPELINE_TAG:-pipeline}"
    pipeline_run "$tag" "/tmp/runs-$tag" "$@"
    tail -40 "$OUT/$tag.log" ;;
  model-8b) build_8b ;;
  deploy)
    # a fresh server and database (a run left scheduled by an earlier call would run beside this
    # one: --run-once starts every scheduled run), the worker detached, its logs in /root/deploy-NAME
    name="$1"; params="$2"; logs="/root/deploy-$name"
    [ -f "$params" ] && params="$(cat "$params")"
    case "$params" in *'"/root/model-8b"'*) build_8b || exit 1 ;; esac
    pkill -f "prefect (server|worker) start" 2>/dev/null; sleep 2
    rm -rf "$PREFECT_HOME" "$logs"; mkdir -p "$logs"
    export PREFECT_API_URL=http://127.0.0.1:4200/api COBALT_REPO=$PWD
    OUT="$logs" trace "$name" >"$logs/trace.pid"
    setsid nohup python3 -m prefect server start --host 127.0.0.1 --port 4200 \
      >"$logs/$name.server.log" 2>&1 </dev/null &
    python3 scripts/gpu/flow_times.py --wait-api 120 || { tail -20 "$logs/$name.server.log"; exit 1; }
    prefect work-pool create gpu-pool --type process >/dev/null 2>&1 || true
    deployment="${DEPLOYMENT:-pipeline/pipeline-gpu}"  # FLOW/NAME of prefect.yaml
    prefect --no-prompt deploy --name "${deployment#*/}" >"$logs/$name.deploy.log" 2>&1
    echo "prefect deploy exit $?"
    prefect deployment run "$deployment" --params "$params" >"$logs/$name.run.log" 2>&1
    echo "deployment run exit $?"
    date +%s >"$logs/started"
    setsid nohup bash -c 'python3 -m prefect worker start --pool gpu-pool --run-once; echo $? >"$0/worker.rc"' \
      "$logs" >"$logs/$name.worker.log" 2>&1 </dev/null &
    wait_deploy "$name" ;;
  wait) export PREFECT_API_URL=http://127.0.0.1:4200/api; wait_deploy "$1" ;;
  paper)
    # vLLM's share of the card: half of an H200's 141 GB; 0.3 of an 80 GB H100 (the memory plan
    # needs ~50 GB beside it for the bf16 base, one 16k-token sequence and the fp32 log-softmax)
    total=$(nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} \
      --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    share=0.5; [ "${total:-0}" -lt 100000 ] && share=0.3
    pid=$(trace paper)
    rm -rf /root/paper-work
    timeout "${PAPER_TIMEOUT_S:-540}" python3 -m benchmarks.paper_preset --model-dir /root/model-8b-v152k \
      --work /root/paper-work --vllm-memory "$share" --json "$OUT/paper_preset.json" "$@" >"$OUT/paper_preset.log" 2>&1
    echo "paper preset exit $?"; kill "$pid"
    tr '\r' '\n' </root/paper-work/out/.launch/launch.log | grep -v "^\s*$" | tail -60 >"$OUT/paper_launch_tail.log"
    tail -25 "$OUT/paper_launch_tail.log"; tail -30 "$OUT/paper_preset.log" ;;
  learning)
    name="$1"; seeds="$2"; shift 2
    python3 -m experiments.learning_check --out "/tmp/$name" --seeds "$seeds" --parallel 3 \
      --deadline-s "${LEARNING_DEADLINE_S:-545}" "$@" >"$OUT/$name.log" 2>&1
    echo "learning check exit $?"; tail -5 "$OUT/$name.log"
    tar -czf "$OUT/$name.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
      --exclude='tensorboard' -C /tmp "$name" ;;
  rollout-gpus)
    # the 8B shape: /root/model-8b's weights where `model-8b` built them, else vLLM's dummy weights
    # (config only, built in seconds); records and logs stay in /root/rollout-gpus, so a later
    # call can add runs to this one's: rollout-gpus --gpus 4 --baseline /root/rollout-gpus/last.json
    model=(); [ -f /root/model-8b/config.json ] && model=(--model-dir /root/model-8b)
    mkdir -p /root/rollout-gpus
    pid=$(trace rollout_gpus)
    timeout "${ROLLOUT_TIMEOUT_S:-500}" python3 -m benchmarks.rollout_gpus "${model[@]}" \
      --work /root/rollout-gpus --json "$OUT/rollout_gpus.json" "$@" >"$OUT/rollout_gpus.log" 2>&1
    echo "rollout-gpus exit $?"; kill "$pid"
    cp "$OUT/rollout_gpus.json" /root/rollout-gpus/last.json 2>/dev/null
    tar -czf "$OUT/rollout_gpus_logs.tgz" -C /root/rollout-gpus --exclude=model --exclude='*.jsonl' .
    tail -25 "$OUT/rollout_gpus.log" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
