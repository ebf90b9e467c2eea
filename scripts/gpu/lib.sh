# The GPU scripts' shared pieces, sourced from the repository root by scripts/gpu/*.sh: paths and
# $OUT, the offline bundle installed on a worker without a package index, nvidia-smi traces, a
# worker.sh step on one card, a run detached from the call that starts it and collected by a later
# one, the models and data the recipes train on, and result files named and recorded (recipe,
# commit) as benchmarks/results keeps them. Sourcing defines; device_setup acts.

WORK="${RECIPE_WORK:-/root}"  # models, prepared data, runs: kept on a warm machine across calls
OUT="${OUT:-/tmp/out}"        # what comes back from the call
MODEL_8B="$WORK/model-8b" MODEL_07B="$WORK/model-07b" TINY="$WORK/tiny-random"

device_setup() {  # $OUT made, the bundle's pieces carried so far installed (once per call), the env
  mkdir -p "$OUT"
  if [ -z "${BUNDLE_READY:-}" ]; then
    bash infra/gpu-bundle/install.sh || echo "bundle: install.sh exit $?"
    export BUNDLE_READY=1
  fi
  export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}" NCCL_NVLS_ENABLE=0
  export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  export VLLM_USE_FLASHINFER_SAMPLER=0  # the bundle has no FlashInfer: PyTorch's top-p/top-k sampling
  [ -d /tmp/site/bin ] && export PATH="/tmp/site/bin:$PATH"  # the bundle's console scripts
  export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
  # Prefect's UI needs a newer FastAPI than vLLM allows: servers run their API alone (docs/DEPLOYMENT.md)
  export PREFECT_UI_ENABLED=false
}

missing_modules() {  # MODULE...: the ones python3 cannot import, on one line
  python3 -c 'import importlib.util as u, sys
print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' "$@" 2>/dev/null
}

gpu_count() { nvidia-smi -L 2>/dev/null | wc -l; }

gpu_kind() {  # h100, h200, ... from the first GPU's name (result file names)
  local kind
  kind=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z' |
    grep -oE '\b(h100|h200|h20|b200|b100|gb200|a100|a10g|l40s|l4)\b' | head -1)
  echo "${kind:-gpu}"
}

gpu_trace() {  # FILE [FIELDS]: nvidia-smi every 0.5 s into FILE until the printed pid is killed;
  # FIELDS default index,timestamp,memory.used (the step report's), add utilization.gpu for
  # flow_times.py; TRACE_GPUS: these GPUs only (nvidia-smi -i)
  setsid nohup nvidia-smi ${TRACE_GPUS:+-i "$TRACE_GPUS"} \
    --query-gpu="${2:-index,timestamp,memory.used}" --format=csv,noheader,nounits -lms 500 \
    >"$1" 2>/dev/null </dev/null &
  echo $!
}

run_step() {  # GPU CPUS "STEP ARGS...": one worker.sh step on one card and a taskset CPU list (e.g.
  # 0-15); its files land in $OUT/<tag>/, packed into $OUT/<tag>.tgz (a call brings back few
  # files). STEP_TIMEOUT_S (560) stops a step that would outlive the call; PAIR_WORKER
  # (scripts/gpu/worker.sh) is the script each step runs.
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

# --- a run detached from its call: DIR/run.log, DIR/run.rc when it ends --------------------------

detach() {  # DIR CMD...: CMD in a session of its own that outlives the call; 1 (nothing started)
  # if DIR's run is running or has ended
  local dir="$1"; shift
  if [ -f "$dir/run.rc" ] || { [ -f "$dir/run.pid" ] && kill -0 "$(cat "$dir/run.pid")" 2>/dev/null; }
  then return 1; fi
  mkdir -p "$dir"
  setsid nohup bash -c '"$@"; echo $? >"$0.rc"' "$dir/run" "$@" </dev/null >"$dir/run.log" 2>&1 &
  echo $! >"$dir/run.pid"
}

collect() {  # DIR: wait for its run until RECIPE_WAIT_S (540) s into this call; 0 once it ended
  # (a run that died without its exit code, killed or its machine restarted, reads as 137)
  local dir="$1"
  while [ ! -f "$dir/run.rc" ] && [ "$SECONDS" -lt "${RECIPE_WAIT_S:-540}" ]; do
    if ! kill -0 "$(cat "$dir/run.pid" 2>/dev/null)" 2>/dev/null && [ ! -f "$dir/run.rc" ]; then
      echo 137 >"$dir/run.rc"
    fi
    [ -f "$dir/run.rc" ] || sleep 5
  done
  [ -f "$dir/run.rc" ]
}

# --- result files: STEM.json, STEM.recipe.json (recipe, commit, machine, times), STEM.logs.tgz ---

slug() { echo "$*" | tr -cs 'A-Za-z0-9.' '-' | sed 's/^-*//; s/-*$//' | cut -c1-60; }

stem() {  # ID GPUS: ID_<GPUS>x<gpu>_<date>, as benchmarks/results names its files
  echo "${1}_${2}x$(gpu_kind)_$(date -u +%F)"
}

finish() {  # DIR: the run's result.json, its record and its files/ into $OUT
  local dir="$1" name files=()
  name=$(python3 scripts/gpu/recipe_record.py stem "$dir/recipe.json")
  cp "$dir/run.log" "$dir/files/run.log" 2>/dev/null
  if [ -f "$dir/result.json" ]; then cp "$dir/result.json" "$OUT/$name.json"; files+=("$name.json"); fi
  tar -czf "$OUT/$name.logs.tgz" -C "$dir/files" . && files+=("$name.logs.tgz")
  python3 scripts/gpu/recipe_record.py finish "$dir/recipe.json" "$OUT/$name.recipe.json" \
    --exit "$(cat "$dir/run.rc")" --files "${files[@]}"
  echo "results in \$OUT: $name.recipe.json ${files[*]}"
}

# --- models and data, each built once on the machine --------------------------------------------

build_model() {  # DIR PYTHON: DIR built by PYTHON (sys.argv[1]: where) unless it was before
  [ -f "$1/config.json" ] && return 0
  rm -rf "$1" "$1.part" && python3 -c "$2" "$1.part" && mv "$1.part" "$1"
}

tiny_random() {  # engines/tiny.py's model: the prepared data's turn-0 trajectories
  build_model "$TINY" 'import sys; from engines.tiny import build_tiny_model as b; b(sys.argv[1], seed=0)'
}

model_8b() {  # the Qwen3-8B shape (36 layers of 4,096, 32/8 heads, 152k vocabulary), random bf16
  CUDA_VISIBLE_DEVICES=0 build_model "$MODEL_8B" 'import sys
from engines.tiny import build_tiny_model as b
b(sys.argv[1], seed=0, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
  intermediate_size=12288, max_position_embeddings=32768, pad_vocab_to=151936, device="cuda",
  dtype="bfloat16")'
}

model_07b() {  # the parity runs' 0.7B shape: weights drawn in bf16, saved in float32, so every
  # layout's float32 master copy starts from the same values (DeepSpeed builds its own from bf16)
  CUDA_VISIBLE_DEVICES=0 build_model "$MODEL_07B" 'import sys, torch
from engines.tiny import build_tiny_model as b
from transformers import AutoModelForCausalLM as M
b(sys.argv[1], seed=0, hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=4,
  intermediate_size=4096, pad_vocab_to=151936, device="cuda", dtype="bfloat16")
M.from_pretrained(sys.argv[1], dtype=torch.float32).save_pretrained(sys.argv[1])'
}

eos_kwargs() {  # MODEL: its end-of-turn bias for responses of mean ~200 tokens at temperature 1
  # (eos_calibrate.py, once), as generation_kwargs JSON in $KWARGS, the response cap in $CAP
  [ -f "$1/eos_calibration.json" ] ||
    CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu/eos_calibrate.py "$1" --mean 200 --cap 1024 || return 1
  CAP=1024 KWARGS=$(python3 -c 'import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["generation_kwargs"]))' "$1/eos_calibration.json")
}

problems() {  # NAME TOKENS COUNT [TRAJECTORY ARGS]: COUNT problems of ~TOKENS-token statements
  # (long_problems.py), the data stage and the tiny model's turn-0 trajectories on the CPU, in the
  # storage $WORK/data-NAME/runs
  local name="$1" tokens="$2" count="$3" dir="$WORK/data-$1" log="${FILES:-/tmp}/data-$1.log"
  shift 3
  [ -f "$dir/.ready" ] && return 0
  tiny_random || return 1
  rm -rf "$dir" && mkdir -p "$dir"
  (export CUDA_VISIBLE_DEVICES="" PREFECT_HOME="$dir/prefect"
   python3 scripts/gpu/long_problems.py --tokens "$tokens" --count "$count" --out "$dir/problems.jsonl" &&
   python3 -m flows.data --source "$dir/problems.jsonl:taco" --storage "$dir/runs" --backend namespace &&
   python3 -m flows.trajectories --storage "$dir/runs" --model "$TINY" --engine transformers \
     --device cpu --n 2 --turns 0 --max-new-tokens 8 --max-prompt-tokens 10240 \
     --backend namespace "$@") >"$log" 2>&1 && touch "$dir/.ready"
  local rc=$?; echo "data $name: exit $rc"; [ $rc = 0 ] || tail -5 "$log"; return $rc
}

storage() {  # NAME: $RUN/runs, a fresh copy of the prepared storage $WORK/data-NAME/runs
  rm -rf "$RUN/runs" && cp -r "$WORK/data-$1/runs" "$RUN/runs"
}

# --- training, reports, the pipeline ------------------------------------------------------------

train() {  # NAME ARGS...: flows.training of $MODEL on $RUN/runs (the paper preset, single_turn, 3
  # steps, no checkpoints) on $GPUS GPUs (4) under $SHARDING (fsdp), every GPU traced, torch's
  # flight recorder on (each step's collective bytes in the step report; FR=0: off)
  local name="$1" pid rc; shift
  pid=$(gpu_trace "$FILES/$name.mem.csv")
  TORCH_FR_BUFFER_SIZE=${FR:-20000} TORCH_NCCL_TRACE_BUFFER_SIZE=${FR:-20000} \
    PREFECT_HOME="$RUN/prefect-$name" python3 -m flows.training --storage "$RUN/runs" \
    --model "$MODEL" --preset paper --mode single_turn --gpus "${GPUS:-4}" \
    --sharding "${SHARDING:-fsdp}" --max-steps 3 --backend namespace --report-to none \
    --set save_strategy=no "$@" >"$FILES/$name.log" 2>&1
  rc=$?; kill "$pid" 2>/dev/null
  echo "[$name] flows.training exit $rc"; return $rc
}

step_report() {  # NAME GPUS [ANCHOR ANCHOR_NAME]: benchmarks/grpo_step_report.py over the stage
  # NAME trained (phases, tokens/s/GPU, MFU, each GPU's peak) into $RUN/result.json; its
  # launch and vLLM server logs into $FILES
  local name="$1" gpus="$2" stage log anchor=(); shift 2
  stage=$(tr '\r' '\n' <"$FILES/$name.log" | grep -ao "policy (--model): [^ ]*" | tail -1 | cut -d' ' -f3)
  [ -n "$stage" ] || stage=$(ls -td "$RUN"/runs/training/*/ 2>/dev/null | head -1)
  for log in "${stage%/}"/.launch/*.log; do
    [ -f "$log" ] && tail -c 200000 "$log" >"$FILES/$name.$(basename "$log")"
  done
  [ -n "$stage" ] && [ -f "$stage/MANIFEST.json" ] || { echo "[$name] no finished stage"; return 1; }
  [ $# -ge 2 ] && anchor=(--anchor "$1" --anchor-name "$2")
  python3 -m benchmarks.grpo_step_report "$stage" --gpus "$gpus" --trace "$FILES/$name.mem.csv" \
    "${anchor[@]}" --json "$RUN/result.json" 2>&1 >/dev/null | tail -2
}

pipeline_run() {  # TAG STORAGE ARGS...: python -m flows.pipeline on STORAGE, its GPUs traced, into
  # $OUT/TAG.log, TAG.mem.csv, TAG.stages.json (each stage's time and GPU memory, flow_times.py),
  # TAG.fit.json (the reference fit's stats). PIPELINE_PROFILE=1: under py-spy, 20 samples a
  # second of every process, into TAG.pyspy.txt (carry .whl with py-spy's wheel)
  local tag="$1" storage="$2" pid rc profile=(); shift 2
  pid=$(TRACE_GPUS="${CUDA_VISIBLE_DEVICES:-}" gpu_trace "$OUT/$tag.mem.csv" \
    index,timestamp,memory.used,utilization.gpu)
  if [ -n "${PIPELINE_PROFILE:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl &&
      profile=(/tmp/pyspy/bin/py-spy record -r 20 --subprocesses -f raw -o "$OUT/$tag.pyspy.txt" --)
  fi
  /usr/bin/time -v "${profile[@]}" python3 -m flows.pipeline --backend namespace \
    --storage "$storage" "$@" >"$OUT/$tag.log" 2>&1
  rc=$?; echo "pipeline exit $rc"; kill "$pid" 2>/dev/null
  grep -E "Elapsed|Maximum resident" "$OUT/$tag.log"
  grep -E "engine auto|generation auto" "$OUT/$tag.log" | head -2  # what auto chose, and why
  cp "$storage/models/fitted-seed0/fitted_recipe.json" "$OUT/$tag.fit.json" 2>/dev/null &&
    python3 -c 'import json, sys; print("fit:", json.load(open(sys.argv[1]))["stats"])' "$OUT/$tag.fit.json"
  python3 scripts/gpu/flow_times.py --mem "$OUT/$tag.mem.csv" --json "$OUT/$tag.stages.json" || true
  return $rc
}
