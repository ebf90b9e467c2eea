#!/usr/bin/env bash
# GPU recipes: bash scripts/gpu/recipe.sh NAME [ARGS]. --help lists them; NAME --help tells what
# one runs, what it needs, how long it takes and where its results land.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib.sh
RECIPES=(paper4 verl parity lora1 default)
VERL_ANCHOR=(1544 "verl (published, 8x H100)")  # verl's Qwen2-7B GRPO, tokens/s/GPU

usage() {
  cat <<'EOF'
usage: bash scripts/gpu/recipe.sh NAME [ARGS]      (NAME --help: the recipe's own help)

EOF
  local r; for r in "${RECIPES[@]}"; do "help_$r" | head -1 | sed 's/^/  /'; done
  echo; common
}

common() {
  cat <<'EOF'
Every recipe installs what the offline bundle's pieces carried so far (infra/gpu-bundle: carry
.gpu/site-train.tar.xz and .gpu/site-core.tar.xz in one call, the vLLM parts and .gpu/PARTS in
the next ones) and refuses to start without what it needs; then it starts its run detached
(models, data and runs under RECIPE_WORK, default /root, kept while the machine stays warm) and
waits up to RECIPE_WAIT_S (540) s into the call. A run still going exits 75: rerun the same
command to collect it. --fresh: start over.

Results in $OUT (a copy for benchmarks/results), STEM = <recipe and arguments>_<N>x<gpu>_<date>:
  STEM.json         the recipe's result (a step report, the parity table, stage times)
  STEM.recipe.json  the recipe, its arguments, the commit (git's; where the checkout has no .git,
                    pass RECIPE_COMMIT=<hash>), the source's digest (recipe.sh --digest here gives
                    this checkout's), the machine, start, end, exit code, the files
  STEM.logs.tgz     logs, nvidia-smi traces, the launch and vLLM server logs
EOF
}

# --- paper4 -------------------------------------------------------------------------------------

help_paper4() {
  cat <<'EOF'
paper4   the paper's recipe on 4 GPUs: full fine-tuning of the 8B shape under FSDP at its lengths

  bash scripts/gpu/recipe.sh paper4 [--groups N] [FLOWS.TRAINING ARGS]
  bash scripts/gpu/recipe.sh paper4 --pipeline [FLOWS.PIPELINE ARGS]

Runs python -m flows.training --preset paper --mode single_turn --gpus 4 --sharding fsdp
--max-steps 3 (vLLM colocated, no checkpoints) on the Qwen3-8B shape (random bf16 weights, 152k
vocabulary) over 4 problems of ~9,600-token statements (--max-prompt-tokens 10240): one group of
16 completions a step, every response 6,144 tokens (ignore_eos); then
benchmarks/grpo_step_report.py over its stage: phases, tokens/s/GPU, MFU, each GPU's peak.
  --groups N   N groups a step (16 x N completions) over 2N problems; goal 3's step:
               --groups 8 --share-prompts --max-steps 2
  other ARGS   to flows.training (--share-prompts, --packing, --max-steps N, --set K=V)
  --pipeline   instead, the whole pipeline as a user starts it on the 8B shape, small limits:
               flows.pipeline --gpus 4 --sharding fsdp --mode single_turn --train-limit 16
               --eval-limit 16 --n 4 --eval-samples 4 --turns 1 --eval-turns 1
               --max-new-tokens 256 --max-steps 2 (result: each stage's time and GPU memory)

Needs: 4 GPUs of 80 GB or more, ~183 GiB of free host memory while the processes load, ~40 GB
of disk; the bundle's site-train, site-core, every vLLM part (--pipeline: site-remote too).
Takes: ~4 min to build the model and the data, then ~7 min of training (3 steps of ~78 s on
4xH100 after ~3 min of start-up): two calls. --pipeline: ~16 min (each generating stage ~3 min
of vLLM start-up): two or three calls.
Result: STEM.json, the step report (--pipeline: the stages).
EOF
}

plan_paper4() {  # ARGS: GPUs used, modules needed
  case " $* " in *" --pipeline "*) echo "4 vllm litellm" ;; *) echo "4 vllm" ;; esac
}

body_paper4() {
  local groups=1 pipeline=0 rest=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --groups) groups="$2"; shift 2 ;;
      --pipeline) pipeline=1; shift ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  MODEL=$MODEL_8B
  if [ $pipeline = 1 ]; then
    model_8b || return 1
    # each stage's vLLM server log, kept (the engine removes its own when the stage ends)
    (while sleep 5; do cp /tmp/cobalt-vllm-serve-*/*.log "$FILES/" 2>/dev/null; done) &
    local copier=$!
    OUT="$FILES" PREFECT_HOME="$RUN/prefect" VLLM_LOGGING_LEVEL=INFO pipeline_run pipeline \
      "$RUN/runs" --model "$MODEL" --gpus 4 --sharding fsdp --mode single_turn --train-limit 16 \
      --eval-limit 16 --n 4 --eval-samples 4 --turns 1 --eval-turns 1 --max-new-tokens 256 \
      --max-steps 2 --set num_generations=4 --set generation_batch_size=16 \
      --set max_completion_length=256 --report-to none "${rest[@]}"
    local rc=$?; kill "$copier"
    tr '\r' '\n' <"$FILES/pipeline.log" | grep -a -E "Pass@1|policy|Error|Finished in state" | tail -8
    cp "$FILES/pipeline.stages.json" "$RUN/result.json" 2>/dev/null
    return $rc
  fi
  local count=$(( 2 * groups > 4 ? 2 * groups : 4 ))
  problems "paper-$count" 9600 "$count" & local data=$!
  model_8b || return 1
  wait "$data" || return 1
  storage "paper-$count"
  GPUS=4 train paper4 --max-prompt-tokens 10240 --set "generation_batch_size=$((16 * groups))" \
    --set 'generation_kwargs={"ignore_eos": true}' "${rest[@]}"
  step_report paper4 4
}

# --- verl ---------------------------------------------------------------------------------------

help_verl() {
  cat <<'EOF'
verl     verl's GRPO shape: the 8B shape fully fine-tuned under FSDP on every GPU, against verl

  bash scripts/gpu/recipe.sh verl [--split | --two-nodes | --deployment] [FLOWS.TRAINING ARGS]

Runs python -m flows.training --preset paper --mode single_turn --gpus G --sharding fsdp
--max-steps 3 (G: every GPU of the machine, vLLM colocated) on the Qwen3-8B shape at verl's
published shape: 340 problems of ~100-token statements without a system prompt (prompts of ~147
tokens, max_prompt_length 512), 5 samples a prompt, 64 prompts a GPU a step (generation batch
320 x G), responses of mean ~200 tokens capped at 1,024 (an end-of-turn bias set by
scripts/gpu/eos_calibrate.py); then benchmarks/grpo_step_report.py against verl's 1,544.
  other ARGS     to flows.training (--share-prompts, --packing, --fsdp-gather bfloat16, ...)
  --split        G-1 training processes beside the stage's own vLLM server on the last GPU,
                 --async, 4 steps of 90 prompts x 5 a process (goal 1's run on 4 GPUs:
                 --split --share-prompts)
  --two-nodes    2 "nodes" on this host: two launchers of G/2 GPUs, one rendezvous, one storage
                 (--shared-storage --nodes 2); the report is node 0's, its collectives' bytes
                 feed python -m benchmarks.nodes_projection REPORT --measured
  --deployment   the same run through prefect.yaml's training-multi-gpu deployment (a Prefect
                 server, prefect deploy, a gpu-pool worker: scripts/gpu/worker.sh deploy); no ARGS

Needs: 2 GPUs or more (measured on 4: 118 GiB of 141 on H200s; it fits 80 GB H100s), ~183 GiB of
free host memory on 4; the bundle's site-train, site-core and every vLLM part.
Takes: ~4 min for the model, its calibration and the data, then ~6 min of training (3 steps of
~40 s after ~4 min of start-up on 4xH200): one or two calls.
Result: STEM.json, the step report.
EOF
}

plan_verl() {
  local g; g=$(gpu_count); [ "$g" -ge 2 ] || g=2
  echo "$g vllm"
}

body_verl() {
  local mode=colocated rest=() g name=verl
  while [ $# -gt 0 ]; do
    case "$1" in
      --split) mode=split ;; --two-nodes) mode=nodes ;; --deployment) mode=deployment ;;
      *) rest+=("$1") ;;
    esac
    shift
  done
  [ "$mode" = deployment ] && [ ${#rest[@]} -gt 0 ] && { echo "--deployment takes no ARGS"; return 2; }
  g=$(gpu_count)
  problems verl 100 340 --system-prompt '' & local data=$!
  model_8b && eos_kwargs "$MODEL_8B" || return 1
  wait "$data" || return 1
  MODEL=$MODEL_8B
  storage verl
  echo '{"training": {"max_prompt_length": 512}}' >"$RUN/verl.json"
  local batch=$((320 * g)); [ $mode = split ] && batch=$((450 * (g - 1)))
  local verl=(--config "$RUN/verl.json" --set num_generations=5 --set "max_completion_length=$CAP"
    --set "generation_batch_size=$batch" --set "generation_kwargs=$KWARGS")
  case $mode in
    colocated) GPUS=$g train verl "${verl[@]}" "${rest[@]}" ;;
    split) GPUS=$((g - 1)) train verl "${verl[@]}" --async --vllm-server-gpus 1 --max-steps 4 \
      "${rest[@]}" ;;
    nodes) name=verl-0; two_nodes verl "${verl[@]}" "${rest[@]}" ;;
    deployment) verl_deployment "$g" ;;
  esac
  step_report "$name" "$g" "${VERL_ANCHOR[@]}"
}

two_nodes() {  # NAME ARGS...: flows.training as 2 nodes on this host (two launchers, half the GPUs
  # each, one rendezvous, one storage directory): NAME-0 and NAME-1
  local name="$1" half=$(( $(gpu_count) / 2 )) port=$((29000 + RANDOM % 1000)) r log; shift
  for r in 1 0; do
    CUDA_VISIBLE_DEVICES=$(seq -s, $((r * half)) $((r * half + half - 1))) GPUS=$half \
      train "$name-$r" "$@" --shared-storage --nodes 2 --node-rank "$r" \
      --rdzv-endpoint "127.0.0.1:$port" &
  done
  wait
  log=$(find "$RUN" /tmp -path '*launch-node1/launch.log' -newer "$RUN/recipe.json" 2>/dev/null | head -1)
  [ -n "$log" ] && tail -c 200000 "$log" >"$FILES/$name-1.launch.log"
}

verl_deployment() {  # GPUS: verl's run as the training-multi-gpu deployment's parameters
  local pid rc
  cat >"$RUN/verl.params.json" <<JSON
{"params": {"trajectories": "latest", "model": "$MODEL", "storage": {"url": "$RUN/runs"},
 "sandbox": {"backend": "namespace"},
 "training": {"preset": "paper", "mode": "single_turn", "num_processes": $1, "sharding": "fsdp",
   "max_steps": 3, "max_prompt_length": 512, "report_to": [],
   "overrides": {"num_generations": 5, "max_completion_length": $CAP,
                 "generation_batch_size": $((320 * $1)), "save_strategy": "no",
                 "generation_kwargs": $KWARGS}}}}
JSON
  pid=$(gpu_trace "$FILES/verl.mem.csv"); mkdir -p "$FILES/deploy"
  OUT="$FILES/deploy" PREFECT_HOME="$RUN/prefect-verl" DEPLOYMENT=training/training-multi-gpu \
    DEPLOY_WAIT_S=3600 bash scripts/gpu/worker.sh deploy verl "$RUN/verl.params.json" \
    >"$FILES/verl.log" 2>&1
  rc=$?; kill "$pid" 2>/dev/null; tail -3 "$FILES/verl.log"; return $rc
}

# --- parity -------------------------------------------------------------------------------------

help_parity() {
  cat <<'EOF'
parity   benchmarks/parity.py on GPUs: N processes against one on the same rows (0.7B shape)

  bash scripts/gpu/recipe.sh parity [PARITY ARGS]

Runs python -m benchmarks.parity --model <0.7B shape> --preset paper --precision mixed
--layouts 1 G:fsdp --kill-resume G:fsdp --lr 1e-5 --step 32 --micro-batch 4 --prompts 64
--tolerance 0.1 --loss-abs 0.01 (G: every GPU of the machine; on one GPU the packed passes
instead: --layouts 1 1+pack 1+share 1@8, the last the regrouping yardstick). The 0.7B shape: 24
layers of 1,024, 16/4 heads, 152k vocabulary, drawn in bf16 and saved in float32. The stated
bound: weights_rel <= 0.1 and a step's loss within 0.01 of one process's.
  PARITY ARGS   to benchmarks.parity, the last of a flag winning; --layouts replaces the
                default layouts and their --kill-resume: e.g. --layouts 1 1@8 4:ddp 4:fsdp
                4:zero3 2x2:hybrid --kill-resume 4:fsdp; --precision fp32 --tolerance 1e-3

Needs: any GPUs (~6-12 GiB each); the bundle's site-train and site-core (zero3 layouts:
site-deepspeed).
Takes: ~1 min for the model, ~7 min for the default layouts on 4 GPUs (each more layout ~2
min): one or two calls.
Result: STEM.json, benchmarks.parity's JSON (every layout's losses, gradient norms, weights_rel).
EOF
}

plan_parity() {
  local g modules=""; g=$(gpu_count); [ "$g" -ge 1 ] || g=1
  case " $* " in *zero3*) modules=deepspeed ;; esac
  echo "$g $modules"
}

body_parity() {
  local g pid rc layouts
  g=$(gpu_count)
  model_07b || return 1
  layouts=(--layouts 1 "$g:fsdp" --kill-resume "$g:fsdp")
  [ "$g" -eq 1 ] && layouts=(--layouts 1 1+pack 1+share 1@8)
  case " $* " in *" --layouts "*) layouts=() ;; esac
  pid=$(gpu_trace "$FILES/parity.mem.csv")
  python3 -m benchmarks.parity --model "$MODEL_07B" --preset paper --precision mixed \
    "${layouts[@]}" --lr 1e-5 --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 \
    --loss-abs 0.01 --json "$RUN/result.json" "$@" >"$FILES/parity.log" 2>&1
  rc=$?; kill "$pid" 2>/dev/null
  echo "benchmarks.parity exit $rc"
  grep -a -A12 "^| layout" "$FILES/parity.log"; grep -a verdict "$FILES/parity.log"
  return $rc
}

# --- lora1 --------------------------------------------------------------------------------------

help_lora1() {
  cat <<'EOF'
lora1    LoRA on one GPU: the 8B shape at the paper's lengths (or verl's shape)

  bash scripts/gpu/recipe.sh lora1 [--shape paper|verl] [FLOWS.TRAINING ARGS]

Runs python -m flows.training --preset paper --mode single_turn --gpus 1 --sharding ddp with
LoRA adapters ({"training": {"lora": {}}}, vLLM colocated, no checkpoints) on GPU 0, the
Qwen3-8B shape (random bf16 weights, 152k vocabulary); then benchmarks/grpo_step_report.py.
  --shape paper   (default) the paper's lengths: 4 problems of ~9,600-token statements, one
                  group of 16 completions of 6,144 tokens a step (ignore_eos), 2 steps
  --shape verl    verl's shape (see verl --help): 64 prompts x 5 a step, responses of mean ~200
                  tokens capped at 1,024, 3 steps, against verl's 1,544 tok/s/GPU
  other ARGS      to flows.training (--share-prompts, --packing, --async, --max-steps N);
                  --vllm-server-gpus K: the stage's own vLLM server on GPUs 1..K beside the
                  training on GPU 0 (the split of 2 GPUs: --shape verl --share-prompts --async
                  --vllm-server-gpus 1 --max-steps 4; with --fp8-generation, sampled in fp8)

Needs: one GPU (1 + K with a server); the paper's lengths ~110 GiB at their peak (an H200: the
memory plan refuses an 80 GB card before any work), verl's shape ~67-82 GiB; the bundle's
site-train, site-core and every vLLM part.
Takes: ~2 min for the model and the data, then ~6 min (paper: 2 steps of ~100-125 s after the
start-up) or ~5 min (verl): one or two calls.
Result: STEM.json, the step report.
EOF
}

plan_lora1() { echo "$((1 + $(server_gpus "$@"))) vllm"; }

server_gpus() {  # ARGS: the K of --vllm-server-gpus K, else 0
  local k=0 prev="" a
  for a in "$@"; do [ "$prev" = --vllm-server-gpus ] && k="$a"; prev="$a"; done
  echo "$k"
}

body_lora1() {
  local shape=paper rest=()
  while [ $# -gt 0 ]; do
    case "$1" in --shape) shape="$2"; shift 2 ;; *) rest+=("$1"); shift ;; esac
  done
  local n=$((1 + $(server_gpus "${rest[@]}")))  # GPU 0 trains, the stage's server takes the rest
  export CUDA_VISIBLE_DEVICES; CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))
  MODEL=$MODEL_8B
  case $shape in
    paper)
      problems paper-4 9600 4 & local data=$!
      model_8b || return 1; wait "$data" || return 1
      storage paper-4
      echo '{"training": {"lora": {}}}' >"$RUN/lora.json"
      GPUS=1 SHARDING=ddp train lora1 --config "$RUN/lora.json" --max-prompt-tokens 10240 \
        --max-steps 2 --set generation_batch_size=16 \
        --set 'generation_kwargs={"ignore_eos": true}' "${rest[@]}"
      step_report lora1 "$n" ;;
    verl)
      problems verl 100 340 --system-prompt '' & local data=$!
      model_8b && eos_kwargs "$MODEL_8B" || return 1; wait "$data" || return 1
      storage verl
      echo '{"training": {"max_prompt_length": 512, "lora": {}}}' >"$RUN/lora.json"
      GPUS=1 SHARDING=ddp train lora1 --config "$RUN/lora.json" --set num_generations=5 \
        --set "max_completion_length=$CAP" --set generation_batch_size=320 \
        --set "generation_kwargs=$KWARGS" "${rest[@]}"
      step_report lora1 "$n" "${VERL_ANCHOR[@]}" ;;
    *) echo "--shape paper or verl, not '$shape'"; return 2 ;;
  esac
}

# --- default ------------------------------------------------------------------------------------

help_default() {
  cat <<'EOF'
default  the embedded default on a GPU: python -m flows.pipeline, each stage's time and GPU memory

  bash scripts/gpu/recipe.sh default [FLOWS.PIPELINE ARGS]

Runs python -m flows.pipeline --backend namespace on GPU 0 (the ~1M-parameter model fitted on
the CPU, the bundled problems, 32 GRPO steps: what `make run` runs), under /usr/bin/time, every
GPU traced; then scripts/gpu/flow_times.py: each stage's wall time and the GPU memory it held.
  --gpus N --sharding fsdp   training on N processes, every GPU visible (the summary's
                             per-process peaks from the training stage's manifest)
  other ARGS                 to flows.pipeline (--engine transformers, --async, --packing, ...)

Needs: one GPU (~2-3 GiB with transformers generating; vLLM, where installed, takes the tiny
model only if asked: --engine vllm, 0.9 of the GPU); the bundle's site-train and site-core.
Takes: ~3-5 min (169 s on one H100, ~80 s of it the reference fit on the CPU): one call.
Result: STEM.json, the stages' times and peaks (flow_times.py).
EOF
}

plan_default() {
  local n=1 prev="" a
  for a in "$@"; do [ "$prev" = --gpus ] && n="$a"; prev="$a"; done
  echo "$n"
}

body_default() {
  case " $* " in *" --gpus "*) ;; *) export CUDA_VISIBLE_DEVICES=0 ;; esac
  OUT="$FILES" PREFECT_HOME="$RUN/prefect" pipeline_run default "$RUN/runs" "$@"
  local rc=$? manifest
  tr '\r' '\n' <"$FILES/default.log" | grep -a -E "Pass@1|^training:|Error" | tail -8
  manifest=$(ls -t "$RUN"/runs/training/*/MANIFEST.json 2>/dev/null | head -1)
  [ -n "$manifest" ] && cp "$manifest" "$FILES/training_manifest.json"
  cp "$FILES/default.stages.json" "$RUN/result.json" 2>/dev/null
  return $rc
}

# --- the call: start the run detached, collect it, its results into $OUT ------------------------

case "${1:-}" in
  ""|-h|--help) usage; exit 0 ;;
  --digest) python3 scripts/gpu/recipe_record.py digest; exit ;;
  --body)  # (the detached run) NAME RUN ARGS
    name="$2" RUN="$3"; FILES="$RUN/files"; shift 3
    device_setup; "body_$name" "$@"; exit ;;
esac
name="$1"; shift
declare -F "body_$name" >/dev/null || { echo "recipe.sh: no recipe '$name'"; usage; exit 2; }
fresh=0 args=()
for a in "$@"; do
  case "$a" in -h|--help) "help_$name"; echo; common; exit 0 ;; --fresh) fresh=1 ;; *) args+=("$a") ;; esac
done
device_setup
id=$(slug "$name" "${args[@]}"); run="$WORK/recipes/$id"
if [ $fresh = 1 ] && [ -d "$run" ]; then
  if [ ! -f "$run/run.rc" ] && kill -0 "$(cat "$run/run.pid" 2>/dev/null)" 2>/dev/null; then
    echo "[$id] still running: --fresh refused"; exit 2
  fi
  rm -rf "$run"
fi
if [ ! -f "$run/recipe.json" ]; then
  read -r used modules <<<"$("plan_$name" "${args[@]}")"
  have=$(gpu_count)
  [ "$have" -ge "$used" ] || { echo "[$id] needs $used GPUs, this machine has $have"; exit 2; }
  missing=$(missing_modules trl prefect $modules)
  if [ -n "$missing" ]; then
    echo "[$id] waiting for the bundle: $missing cannot be imported (trl: .gpu/site-train.tar.xz;"
    echo "  prefect: site-core; vllm: every .gpu/vllm.part-* and .gpu/PARTS; litellm: site-remote;"
    echo "  deepspeed: site-deepspeed): carry them and rerun"
    exit 75
  fi
  mkdir -p "$run/files"
  python3 scripts/gpu/recipe_record.py start "$run/recipe.json" --stem "$(stem "$id" "$used")" \
    -- "$name" "${args[@]}"
fi
if detach "$run" bash scripts/gpu/recipe.sh --body "$name" "$run" "${args[@]}"; then
  echo "[$id] started, detached: $run/run.log"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null
else
  echo "[$id] started before: collecting"
fi
if collect "$run"; then
  tail -25 "$run/run.log"
  finish "$run"
  echo "[$id] exit $(cat "$run/run.rc") at $SECONDS s"
  exit "$(cat "$run/run.rc")"
fi
tail -5 "$run/run.log"
echo "[$id] still running at $SECONDS s: rerun the same command to collect it"
exit 75
