#!/usr/bin/env bash
# The paper's recipe on one 4-GPU node, as three device calls in a row on one warm
# machine (the bundle's pieces arrive call by call: infra/gpu-bundle/build.sh). Each phase ends
# inside a 10-minute call; a run that outlives its call goes on detached and the next phase
# collects it. Results land in $OUT (JSON reports, logs, nvidia-smi traces of every GPU).
#
#   bash scripts/gpu/node.sh a   # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#                                #   .gpu/vllm.part-00 .gpu/PARTS
#       the 8B-shaped model (Qwen3-8B shape, 152k vocabulary; the end-of-turn logit_bias that gives
#       responses of mean ~200 tokens at temperature 1: scripts/gpu/eos_calibrate.py) on GPU 0; the two runs' problem sets and
#       trajectories on CPU (flows.data, flows.trajectories with the tiny random model); a
#       sharded run killed and resumed (scripts/gpu/sharded_check.py, fsdp on every GPU)
#   bash scripts/gpu/node.sh b   # carry .gpu/vllm.part-01 .gpu/vllm.part-02 .gpu/vllm.part-03
#       verl's shape (512-token prompts, 1,024-token responses, 5 samples, 256 prompts a step)
#       through the training-multi-gpu deployment (a Prefect server and a gpu-pool worker), full
#       fine-tuning on every GPU (fsdp)
#   bash scripts/gpu/node.sh c   # carry .gpu/site-remote.tar.xz
#       the trajectory stage on 1 GPU and on every GPU
#       (benchmarks/rollout_gpus.py); the embedded default on one GPU with vLLM installed
#   bash scripts/gpu/node.sh scaling    # the same step with LoRA on 1, 2 and 4 GPUs (ddp)
#   bash scripts/gpu/node.sh rollouts   # the rollouts' second round: 512 problems, 1 GPU served
#   bash scripts/gpu/node.sh rollouts4  # ... then every GPU (needs site-remote: LiteLLM)
#   bash scripts/gpu/node.sh paper      # the paper preset at its lengths (10k-token prompts,
#                                       # 6,144-token responses, 16 samples) via flows.training
#
# One GPU plan, parity proven: three calls on one warm 4-GPU machine (the bundle
# built with 27 MiB vLLM parts: bash infra/gpu-bundle/build.sh .gpu 27):
#   bash scripts/gpu/node.sh parity     # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#                                       #   .gpu/site-deepspeed.tar.xz .gpu/vllm.part-02
#       benchmarks/parity.py at a 0.7B shape (fp32 checkpoint, mixed precision, the paper preset):
#       1 process vs 1 in micro-batches of 8 (the yardstick) and 4 under fsdp, fsdp killed after
#       a checkpoint and resumed; beside it `a`'s preparation (the 8B shape built and calibrated
#       on GPU 0, verl's shape's data on the CPU). `default4`: the embedded default as a user
#       starts it with --gpus 4 --sharding fsdp
#   bash scripts/gpu/node.sh parity2    # a 2-GPU machine, carry .gpu/site-train.tar.xz
#       .gpu/site-core.tar.xz .gpu/site-deepspeed.tar.xz: scripts/gpu/fsdp_gather_cost.py, then
#       the 0.7B parity in mixed precision (1, 1@8, ddp, fsdp, fsdp killed and resumed), detached;
#   bash scripts/gpu/node.sh parity2-collect  # it, then fsdp in fp32 on 1 node and on 2 "nodes"
#   bash scripts/gpu/node.sh fsdp-fp32  # (after parity: its 0.7B shape) 1 process vs fsdp in
#       fp32, killed and resumed too: bf16 rounding out, a logic difference would stay
#   bash scripts/gpu/node.sh hybrid     # (after parity) 2 nodes x 2 GPUs on one host, fsdp and
#       hybrid, against 1 node x 4 (training on several machines)
#   bash scripts/gpu/node.sh linear     # --fsdp-gather bf16-linear: its cost at 8B and its 0.7B
#       parity (carry the first call's bundle); then GATHER=bf16-linear bash scripts/gpu/node.sh b
#   bash scripts/gpu/node.sh nodes      # (after parity or a: the 8B shape and verl's data) verl's
#       shape through flows.training on 2 "nodes" x 2 GPUs (--shared-storage, NODE_SHARDING=fsdp
#       or hybrid) then 1 x 4, detached; `nodes-collect` reports both (and their collectives' bytes)
#   bash scripts/gpu/node.sh cost-hybrid  # (after parity) fsdp_gather_cost.py at the 8B shape,
#       then `hybrid`; `cost-paper`: the cost at the paper's lengths (one 16,384-token sequence)
# 2026-11-28 evening, one 4x H200 machine, four calls back to back: parity (410 s, the embedded
# default beside it), b (466 s), cost-hybrid (408 s), cost-paper (44 s): 24 of the 30 minutes.
#   bash scripts/gpu/node.sh b          # carry .gpu/vllm.part-00 .gpu/vllm.part-01 .gpu/PARTS
#       verl's shape again, after the changes (`vllm`: the same carry, installed, nothing run);
#       PASSES=shared (or packed) bash scripts/gpu/node.sh b: with --share-prompts (--packing)
#   bash scripts/gpu/node.sh pipeline8b # carry .gpu/site-remote.tar.xz
#       python -m flows.pipeline --model <8B shape> --gpus 4 --sharding fsdp --mode single_turn
#       with small limits, every GPU traced, each stage's GPUs from the trace; it needs ~16
#       minutes (956 s on 4x H200, 2026-11-28: each generating stage ~3 minutes of vLLM
#       start-up), so it runs detached and the next call collects it:
#   bash scripts/gpu/node.sh pipeline8b-collect
#
# Packed training passes on ONE GPU, three calls on one warm machine:
#   bash scripts/gpu/node.sh pack        # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#       .gpu/vllm.part-00: the runs' data and the 8B shape's weights
#   bash scripts/gpu/node.sh pack-train  # carry .gpu/vllm.part-01 .gpu/PARTS: the 8B shape, then
#       (detached) verl's shape with LoRA through flows.training: --share-prompts, trimmed,
#       --packing
#   bash scripts/gpu/node.sh pack-collect  # their step reports (~5 minutes each run)
#   bash scripts/gpu/node.sh pack-parity  # a fresh GPU, carry .gpu/site-train.tar.xz
#       .gpu/site-core.tar.xz: packing_cost's four paths, then the parity (~7 min, detached);
#   bash scripts/gpu/node.sh pack-parity-collect  # its table and JSON
#   bash scripts/gpu/node.sh cluster     # (after pack-collect) the embedded default with its
#       generating stages on a Dask worker running vLLM (--cluster local:1 --engine vllm);
#   bash scripts/gpu/node.sh cluster-collect  # its outcome, each stage's time and GPU memory
#   bash scripts/gpu/node.sh cluster-prep  # its short form on a fresh GPU: the trajectory stage
#   bash scripts/gpu/node.sh cluster-traj  # alone over --cluster local:1 with vLLM (2 calls)
# 2026-11-29, one H200, one message: pack 158 s, pack-train 566 s, pack-collect 231 s, cluster
# 185 s + cluster-collect 17 s (the pipeline failed: vLLM's forked engine core in the worker);
# then on a fresh machine cluster-prep 57 s, cluster-traj 238 s (exit 0).
# --async (generation overlapped with training, one step off) on ONE GPU, one message
# of three calls (the first GPU runs, 2026-11-29: docs/RESULTS.md):
#   bash scripts/gpu/node.sh async-prep     # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#       .gpu/vllm.part-00: the tiny model's data, verl's data, the 8B weights
#   bash scripts/gpu/node.sh async-train    # carry .gpu/vllm.part-01 .gpu/PARTS: the tiny model
#       with vLLM colocated, synchronous then --async; then verl's shape with LoRA, both ways
#   bash scripts/gpu/node.sh async-collect  # their step reports
#   bash scripts/gpu/node.sh async          # the embedded default, synchronous then --async
#   bash scripts/gpu/node.sh async-lc       # a fresh GPU, carry .gpu/site-train.tar.xz
#       .gpu/site-core.tar.xz .gpu/vllm.part-00: the learning check's cobalt and cobalt_async,
#       seeds 0-2 (detached); the tiny model's data
#   bash scripts/gpu/node.sh async-vllm     # carry .gpu/vllm.part-01 .gpu/PARTS: the check's
#       outputs; the tiny model with vLLM colocated, synchronous then --async
#   bash scripts/gpu/node.sh async-lc2      # seeds 3 and 4 (then --aggregate both here)
#   bash scripts/gpu/node.sh tinyv; bash scripts/gpu/node.sh tinyv-pair  # the vLLM check alone
# 2026-11-29 (third), one H200, one message: async-lc 421 s, async-vllm 317 s (the tiny pair
# failed: a context past the model's positions, refused by the plan since), async-lc2 376 s; then
# a fresh machine: tinyv 87 s, tinyv-pair 274 s (both exit 0): 1,583 s held of the 1,800.
#   bash scripts/gpu/node.sh memory      # a fresh GPU, call 1 (carry .gpu/site-train.tar.xz
#       .gpu/site-core.tar.xz .gpu/vllm.part-00): memory_calibrate.py, the tiny random model
#   bash scripts/gpu/node.sh cluster     # call 2 (carry .gpu/vllm.part-01 .gpu/PARTS), then
#   bash scripts/gpu/node.sh cluster-collect; bash scripts/gpu/node.sh fork-check   # call 3
# 2026-11-29 (later), a fresh H200, one message: memory 60 s, cluster 586 s, cluster-collect +
# fork-check 293 s (the pipeline exit 0 in 607 s; fork fails in a worker, spawn starts).
# Goal 1 and the bytes across nodes on ONE fresh 4-GPU machine, four calls in ONE message:
#   bash scripts/gpu/node.sh goal1         # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#       .gpu/vllm.part-00: the runs' data (detached), the 8B shape's weights; beside them the
#       embedded default with --share-prompts on GPU 1 (no vLLM yet: transformers generation)
#   bash scripts/gpu/node.sh goal1-train   # carry .gpu/vllm.part-01 .gpu/PARTS: vLLM, the
#       response lengths calibrated, then detached one after another through flows.training at
#       verl's shape, full fine-tuning under fsdp: 1 x 4 with --share-prompts, 1 x 4 trimmed
#       (today's default), 2 "nodes" x 2 GPUs trimmed (--shared-storage)
#   bash scripts/gpu/node.sh goal1-collect # the two 1 x 4 runs' step reports
#   bash scripts/gpu/node.sh nodes-collect # the 2 x 2 run's against the 1 x 4 trimmed one
# 2026-11-28 evening: goal1 258 s, goal1-train 469 s, goal1-collect 341 s, nodes-collect 281 s
# (the 2 x 2 run failed at colocated vLLM's start: a compiled artifact of another GPU, fixed
# since by the per-GPU vLLM cache, docs/SCALING.md). Next on a 4-GPU machine, in one message:
# goal1, goal1-train, goal1-collect, nodes-collect (the 2 x 2 run after the 1 x 4 ones: the
# sequence that failed); every `train` run has torch's flight recorder on (FR=20000), so each
# report also gives the GB a process puts through collectives a step, and
# `python -m benchmarks.nodes_projection REPORT --measured` projects from it. Since 2026-11-29
# the memory plan counts FSDP's whole gradients: the --share-prompts run plans 64 x 5 reducing
# every micro-batch (40 x 8 before), the trimmed runs 16 x 20 as before; compare each run's
# nvidia-smi peak with its plan's estimate (docs/RESULTS.md, "The memory plan against what a GPU
# allocates"). On an H100 node, `node.sh paper`: the paper's lengths now reduce every micro-batch.
# The 4-GPU goals and 2 nodes on ONE fresh 4-GPU machine, four calls in ONE message (2026-11-29, the
# sixth session): g4 (carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00),
# g4-train (carry .gpu/vllm.part-01 .gpu/PARTS), g4-collect, g4-nodes: the 8B split (3 training
# processes + the stage's vLLM server, --async), the synchronous 1 x 4, then 2 x 2, each bounded in
# time. Measured: 182 s, 564 s, 371 s, 332 s (1,723 s held with a fifth call); the first two runs
# were ended by their bounds (480 s, 360 s) in the final save: raised since (600 s, 480 s).
# Goal 2 (NeMo-RL's shape, not yet run), ONE message on a fresh 4-GPU machine: g4
# (carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz), `bash infra/gpu-bundle/install.sh`
# (carry .gpu/vllm.part-00 .gpu/vllm.part-02 .gpu/PARTS), g4-nemo (carry .gpu/vllm.part-01; the
# synchronous 1 x 4, ~12 min), g4-nemo-collect twice (the split 2 + 2, ~15 min): most of a
# session's 30 device minutes. CARRY: since 2026-12-01 the bundle's vLLM is three 27 MiB parts
# and the checkout 10.5 MB, so a call holds the two groups, or two parts, not both (a refused
# first call of a chain still lets the next ones run: 450 s lost that day). Goal 3 (the
# paper's lengths, 128 completions a step) the same way with g4-paper, g4-paper-collect after
# the vLLM calls (~20 device minutes: a session of its own).
# fp8 generation on ONE GPU (2026-12-01, one message): fp8 (carry the two groups), the install
# call (parts 00 and 02), fp8-gen (part 01), fp8-collect: 51 s, 6 s, 167 s, 586 s + 265 s. On a
# 2-GPU machine, fp8-split after async-diag and split-train: the flag through the product.
# 2026-12-02, one H200, one message of four calls: mem-shared (the two groups and .gpu/fitted,
# 92 s), the install call (site-remote, parts 02 + PARTS), the install call (part 00),
# fp8-rewards (part 01; 443 s: vLLM 110 s, each evaluation ~70 s). Its first attempt served
# with --max-model-len 4096 past the fitted model's 2,048 positions: vLLM refused to start and
# the evaluations ran against nothing (since, such a call stops the trajectory stage).
# Its rerun with independent seeds (project c492ca0, same day, one message of the same four
# calls): 7, 4, 1 and 596 s (vLLM up in 137 s for bf16, 70 s for fp8; evaluations ~95 s each).
# Then tiny-server in the same way (a fresh machine): 5, 4, 0.4 and 344 s; its rerun
# (MODELS=tiny-random BOUND=440, the machine still warm) found the GPU held by the first run's
# orphaned engine core and ran out its call (520 s): 1,757 of the 1,800 device s used.
# 2026-12-02 (second session), one H200, two messages: the two install calls and tiny-fp8 (6,
# 0.4 and 312 s: fp8 server up in 140 s, bf16 in 101 s); then, on a fresh machine, paper1 (102
# s: 8B weights 42 s, the paper set's data 94 s), the install call, paper1-train (431 s: the
# shared run 354 s of stage), paper1-collect (392 s): 1,505 of the 1,800 device s.
# 2026-12-02 (third session), one H200, one message: the two install calls (5 and 0.4 s),
# gen-paper (590 s: weights 60 s, the bf16 server up in 143 s, 1 x 16 in 65.5 s), gen-paper-collect
# twice (586 s, 216 s); then on a fresh machine the two install calls and BOUND=200
# gen-kv-quick (247 s: the fp8 KV cache up, its batch not finished): 1,764 of the 1,800 device s.
# 2026-12-02 (fourth session), one H200, one message of six calls: the two install calls (4.5,
# 0.5 s), GEN_KV=1 gen-paper (555 s: weights 50 s, the fp8 KV server up in 119 s, 1 x 16 and
# 8 x 16), gen-paper-collect (182 s: bf16's 1 x 16), MEM_SHARED=0 mem-shared (carrying
# .gpu/fitted and site-remote; its `while pgrep -f fp8_generation.py` matched its own command
# line and ran out its 400 s: wait on a .rc file instead), PRECISIONS=fp8-kv fp8-rewards (212 s);
# 1,406 device s. A second message on a fresh machine lost its first call (no machine could be
# started) and the rest ran without site-core: check each call's output before chaining more.
# 2026-12-03, one H200, after five refused starts: MEM_SHARED=0 mem-shared (4.7 s), the two
# install calls (4.1, 0.4 s), PRECISIONS="bf16 fp8-kv" SEEDS=0 fp8-rewards (299 s), the same with
# SEEDS=1 (249 s): the fp8 KV cache's Pass@1 paired with bf16 on one fitted model (docs/RESULTS.md).
# The 8B LoRA --async run that died of a CUDA fault (below), on a fresh machine of 1
# or 2 GPUs, in ONE message: `async-diag` (carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
# .gpu/vllm.part-00), `async-diag-train` (carry .gpu/vllm.part-01 .gpu/PARTS),
# `async-diag-blocking` (the same run under CUDA_LAUNCH_BLOCKING=1, for the faulting kernel).
# 2026-11-29 evening, 1x H200: async-diag 114 s, async-diag-train 368 s (the --async run ran its
# 3 steps), async-diag-blocking 245 s (the synchronous run on the same GPU).
# The split of GPUs (a vLLM server of the stage's) on a 2-GPU machine, ONE message:
#   async-diag (carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00),
#   split-train (carry .gpu/vllm.part-01 .gpu/PARTS), split-sync. 2026-11-29 on 2x H200: 114 s,
#   400 s (the server up in 145 s), 291 s (with the one-GPU async-diag calls before: 1,648 s held).
# --async and 2 nodes on a 2-GPU machine, four calls in ONE message (2026-11-29, fourth session):
#   bash scripts/gpu/node.sh duo          # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#       .gpu/vllm.part-00: the runs' data, the 8B weights
#   bash scripts/gpu/node.sh duo-train    # carry .gpu/vllm.part-01 .gpu/PARTS: vLLM, the 8B
#       shape calibrated; verl's shape with LoRA synchronous (GPU 0) beside --async (GPU 1),
#       then (detached) the 8B shape on 2 "nodes" x 1 GPU and on 1 node x 2
#   bash scripts/gpu/node.sh duo-collect; bash scripts/gpu/node.sh duo-collect  # their reports
# duo 229 s, duo-train 537 s, duo-collect 581 s + 266 s: the 8B pairs ran (docs/RESULTS.md); the
# LoRA --async run died at step 2 in both attempts (a CUDA fault in both threads); the
# synchronous one's first attempt collided on MASTER_PORT 29500 (fixed: launch.one_node_env).
# Packing and 2 nodes on a 2-GPU machine (when no 4-GPU one is lent), three calls in ONE message:
#   bash scripts/gpu/node.sh two          # carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
#       .gpu/vllm.part-00: the 0.7B parity at packed micro-batches of 40 rows on GPU 1
#       (detached), the 8B weights on GPU 0, the runs' data on the CPU
#   bash scripts/gpu/node.sh two-train    # carry .gpu/vllm.part-01 .gpu/PARTS: vLLM, the 8B
#       shape calibrated, the tiny model on 2 "nodes" x 1 GPU with vLLM colocated, then
#       (detached) verl's shape at 8B on 2 "nodes" x 1 GPU and on 1 node x 2
#   bash scripts/gpu/node.sh two-collect  # both 8B runs' step reports, node 1's logs
# 2026-11-28 night: two 199 s, two-train 546 s, two-collect 241 s (1 x 2 failed: a vLLM compile
# artifact of another GPU, fixed by the per-GPU cache); then, on a fresh machine, in ONE message:
#   bash scripts/gpu/node.sh fix          # carry call 1's bundle: the tiny model, verl's data
#   bash scripts/gpu/node.sh fix-train    # carry call 2's: tiny on 2 x 1, then 1 x 2
# The machine goes back 30 s after a call ends: send the calls of one plan in ONE message (they
# run back to back), never one call, read, then the next. 2026-11-28: `pack` (567 s) and then,
# in one message, `pack-parity` (448 s) + `pack-parity-collect`; the embedded default with
# --packing (216 s); two other calls found a fresh machine (sent after reading the previous one).
#
# Measured on 2026-11-27 (docs/RESULTS.md): every phase (4x H100: c, paper, rollouts,
# rollouts4, scripts/gpu/side_by_side.sh; 4x H200: a, b, scaling; scaling4 stopped after 2 of 3
# steps). `rollouts` took 546 s, `rollouts4` 290 s (a fresh machine: the bundle's three calls first).
#
# Reports: benchmarks/grpo_step_report.py over each training stage (tokens/s/GPU, time split,
# MFU, peak memory per GPU); docs/RESULTS.md has the figures.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device-env.sh
export BUNDLE_READY=1 PATH="/tmp/site/bin:$PATH" PREFECT_SERVER_ANALYTICS_ENABLED=false
export DO_NOT_TRACK=1 PREFECT_UI_ENABLED=false
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
MODEL=/root/model-8b NODE=/root/node
mkdir -p "$NODE"
G=$(nvidia-smi -L 2>/dev/null | wc -l)  # this machine's GPUs (the GPU plan's phases use them all)
trace() {  # every GPU's memory every 0.5 s into $1, until the returned pid is killed
  setsid nohup nvidia-smi --query-gpu=index,timestamp,memory.used --format=csv,noheader,nounits \
    -lms 500 >"$1" 2>/dev/null </dev/null & echo $!
}
bounded() {  # SECONDS CMD...: CMD in a process group of its own, the whole group ended after
  # SECONDS (0: never); a stage's vLLM server follows its stage (engines/reaper.py)
  local limit="$1"; shift
  setsid "$@" & local pid=$! guard=""
  if [ "$limit" -gt 0 ]; then
    # the guard's first sleep ended early (CMD done) ends the guard: nothing is signalled
    (sleep "$limit" && { echo "bounded: $1 ended after $limit s" >&2
     kill -TERM -- "-$pid" 2>/dev/null; sleep 20; kill -KILL -- "-$pid" 2>/dev/null; }) & guard=$!
  fi
  wait "$pid"; local rc=$?
  [ -n "$guard" ] && pkill -P "$guard" sleep 2>/dev/null
  return $rc
}
train() {  # NAME STORAGE ARGS...: flows.training on $GPUS GPUs (4) with $SHARDING (fsdp), traced
  # ($TRAIN_TIMEOUT: its whole process group ended after that many seconds)
  local name="$1" storage="$2"; shift 2
  rm -f "$NODE/$name.rc"
  local pid; pid=$(trace "$NODE/$name.mem.csv")
  # torch's flight recorder on: each step's collective GB in the stage's timing (FR=0: off)
  bounded "${TRAIN_TIMEOUT:-0}" env TORCH_FR_BUFFER_SIZE=${FR:-20000} \
    TORCH_NCCL_TRACE_BUFFER_SIZE=${FR:-20000} PREFECT_HOME="$NODE/prefect-$name" \
    python3 -m flows.training --storage "$storage" \
    --model "$MODEL" --preset paper --mode single_turn --gpus "${GPUS:-4}" \
    --sharding "${SHARDING:-fsdp}" --max-steps 3 --backend namespace --report-to none \
    --set save_strategy=no "$@" >"$NODE/$name.log" 2>&1
  echo $? >"$NODE/$name.rc"; kill "$pid"
}
report() {  # NAME STORAGE [ANCHOR NAME]: the stage's step report into $OUT
  local name="$1" storage="$2"; shift 2
  cp "$NODE/$name.log" "$OUT/" 2>/dev/null  # the memory trace is in the report
  echo "[$name] exit $(cat "$NODE/$name.rc" 2>/dev/null || echo running) at $(elapsed) s"
  tr '\r' '\n' <"$NODE/$name.log" | grep -v '^\s*$' | tail -12
  # the stage this run trained (its summary names it), else the newest in the storage
  local stage; stage=$(grep -ao "policy (--model): [^ ]*" "$NODE/$name.log" | tail -1 | cut -d' ' -f3)
  [ -n "$stage" ] || stage=$(ls -td "$storage"/training/*/ 2>/dev/null | head -1)
  [ -n "$stage" ] && [ -f "$stage/MANIFEST.json" ] || {
    tail -c 6000 "$storage"/training/*/.launch/launch.log >"$OUT/$name.launch_tail.log" 2>/dev/null
    return 1; }
  local anchor=(); [ $# -ge 2 ] && anchor=(--anchor "$1" --anchor-name "$2")
  python3 -m benchmarks.grpo_step_report "$stage" --gpus "${GPUS:-4}" --trace "$NODE/$name.mem.csv" \
    "${anchor[@]}" --json "$OUT/$name.report.json" 2>&1 >/dev/null | tail -2
}
prep() {  # NAME PROBLEMS [TRAJECTORY ARGS]: a problem set and its turn-0 trajectories (CPU)
  local name="$1" problems="$2"; shift 2
  export PREFECT_HOME="$NODE/prefect-prep-$name" CUDA_VISIBLE_DEVICES=""
  python3 -m flows.data --source "$problems:taco" --storage "/root/runs-$name" \
    --backend namespace >"$NODE/prep-$name.log" 2>&1 &&
  python3 -m flows.trajectories --storage "/root/runs-$name" --model /root/tiny-random \
    --engine transformers --device cpu --n 2 --turns 0 --max-new-tokens 8 \
    --max-prompt-tokens 10240 --backend namespace "$@" >>"$NODE/prep-$name.log" 2>&1
  echo "prep $name exit $? at $(elapsed) s"
}
verl_sampling() {  # the end-of-turn bias from eos_calibrate.py, else every response 200 tokens
  # ($CALIBRATION: another calibration's file, $CAP_TOKENS its cap)
  local calibration=${CALIBRATION:-$MODEL/eos_calibration.json}
  if [ -f "$calibration" ]; then
    CAP=${CAP_TOKENS:-1024} KWARGS=$(python3 -c 'import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["generation_kwargs"]))' "$calibration")
  else
    CAP=200 KWARGS='{"ignore_eos": true}'; echo "no eos_calibration.json: responses of 200 tokens"
  fi
}
host_run() {  # GPU TAG [ARGS]: the embedded default on one GPU, its files in $OUT/TAG
  local gpu="$1" tag="$2"; shift 2
  mkdir -p "$OUT/$tag"
  OUT="$OUT/$tag" CUDA_VISIBLE_DEVICES="$gpu" PIPELINE_TAG="$tag" PREFECT_HOME="/tmp/prefect-$tag" \
    timeout "${HOST_TIMEOUT:-540}" bash scripts/gpu/worker.sh pipeline "$@" >"$OUT/$tag/step.log" 2>&1
  echo "[$tag] exit $? on GPU $gpu at $(elapsed) s"; grep -E "Elapsed|engine auto" "$OUT/$tag/step.log"
}
wait_for() {  # FILE SECONDS: until FILE exists or the call's time (since start) passes SECONDS
  while [ ! -f "$1" ] && [ "$(elapsed)" -lt "$2" ]; do sleep 5; done
}
build_07b() {  # the 0.7B shape of the parity runs: weights drawn in bf16, saved as float32
  python3 -c 'import torch
from engines.tiny import build_tiny_model as b
from transformers import AutoModelForCausalLM as M
b("/root/model-07b", seed=0, hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=4,
  intermediate_size=4096, pad_vocab_to=151936, device="cuda", dtype="bfloat16")
M.from_pretrained("/root/model-07b", dtype=torch.float32).save_pretrained("/root/model-07b")' \
    >"$NODE/model-07b.log" 2>&1
  echo "0.7B shape built at $(elapsed) s: $(du -sh /root/model-07b | cut -f1)"
}
build_8b_weights() {  # the 8B shape (Qwen3-8B's, 152k vocabulary) on GPU 0, once
  [ -f /root/model-8b/config.json ] || CUDA_VISIBLE_DEVICES=0 python3 -c '
from engines.tiny import build_tiny_model as b
b("/root/model-8b", seed=0, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
  intermediate_size=12288, max_position_embeddings=32768, pad_vocab_to=151936, device="cuda",
  dtype="bfloat16")'
}
build_8b() {  # the 8B shape, then its mean response length set (~200 tokens, cap 1,024; vLLM)
  build_8b_weights && CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu/eos_calibrate.py "$MODEL" \
    --mean 200 --cap 1024
  echo $? >"$NODE/model.rc"
}
prep_runs() {  # the runs' problems: 4 of ~9,600-token statements; 340 of ~100 tokens, no system prompt
  python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
  python3 scripts/gpu/long_problems.py --tokens 9600 --count 4 --out /root/long.jsonl
  python3 scripts/gpu/long_problems.py --tokens 100 --count 340 --out /root/short.jsonl
  prep paper /root/long.jsonl
  prep verl /root/short.jsonl --system-prompt ''
  for g in 1 2 4; do cp -r /root/runs-verl "/root/runs-verl-$g"; done  # the scaling runs'
  touch "$NODE/prep.done"
}
verl_data() {  # the tiny random model and verl's runs' data alone (340 problems of ~100 tokens)
  python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
  python3 scripts/gpu/long_problems.py --tokens 100 --count 340 --out /root/short.jsonl
  prep verl /root/short.jsonl --system-prompt ''
}
verl_args() {  # verl's shape as flows.training options, in the array `verl`
  verl_sampling
  echo '{"training": {"max_prompt_length": 512}}' >"$NODE/verl.json"
  verl=(--config "$NODE/verl.json" --set num_generations=5 --set "max_completion_length=$CAP" \
    --set "generation_batch_size=${VERL_BATCH:-1280}" --set "generation_kwargs=$KWARGS")
}
fresh_runs() {  # NAME...: /root/runs-verl-NAME, each a fresh copy of verl's prepared storage
  for run in "$@"; do rm -rf "/root/runs-verl-$run"; cp -r /root/runs-verl "/root/runs-verl-$run"; done
}
two_nodes() {  # verl's shape on 2 "nodes" (two launchers, this machine's GPUs cut in halves:
  # 0-1 and 2-3 on four, 0 and 1 on two; one rendezvous, one storage directory: --shared-storage)
  # under $NODE_SHARDING (fsdp); $NODES_NAME names the runs (nodes), $NODES_ARGS the options
  local port=$((29000 + RANDOM % 1000)) r half=$((G / 2)) name=${NODES_NAME:-nodes}
  local args=("${verl[@]}"); [ -n "${NODES_ARGS+x}" ] && args=("${NODES_ARGS[@]}")
  for r in 1 0; do
    CUDA_VISIBLE_DEVICES=$(seq -s, $((r * half)) $((r * half + half - 1))) GPUS=$half \
      SHARDING=${NODE_SHARDING:-fsdp} train "$name-$r" "/root/runs-verl-$name" \
      "${args[@]}" --shared-storage --nodes 2 --node-rank "$r" \
      --rdzv-endpoint "127.0.0.1:$port" &
  done
  wait
}
node_logs() {  # NAME: node 1's flow log and its launch log (each process's output) into $OUT
  cp "$NODE/$1-1.log" "$OUT/" 2>/dev/null
  local log; log=$(find /root /tmp -path "*launch-node1/launch.log" -newer "$NODE/$1-1.log" \
    2>/dev/null | head -1)
  [ -n "$log" ] || log=$(ls -t $(find /root /tmp -path "*launch-node1/launch.log" 2>/dev/null) \
    2>/dev/null | head -1)
  [ -n "$log" ] && tail -c 20000 "$log" >"$OUT/$1-1.launch.log"
  echo "[$1-1] exit $(cat "$NODE/$1-1.rc" 2>/dev/null || echo running)"
  tr '\r' '\n' <"$NODE/$1-1.log" | grep -a -E "Error|error|exit" | grep -v errors.html | tail -5
}
tiny_args() {  # the tiny model through flows.training with vLLM colocated, in the array `tiny`
  echo '{"training": {"max_prompt_length": 512, "generation": "vllm_colocate"}}' >"$NODE/tiny.json"
  tiny=(--config "$NODE/tiny.json" --set num_generations=5 --set max_completion_length=64 \
    --set generation_batch_size=80 "$@")
}
gpu_trace() {  # NAME: every GPU's memory and utilisation every 0.5 s into $OUT/NAME.gpus.csv
  setsid nohup nvidia-smi --query-gpu=index,timestamp,memory.used,utilization.gpu \
    --format=csv,noheader,nounits -lms 500 >"$OUT/$1.gpus.csv" 2>/dev/null </dev/null & echo $!
}
gpus_used() {  # NAME: per GPU, the most memory it held and the samples it computed in
  python3 - "$OUT/$1.gpus.csv" <<'PY'
import collections, sys
peak, busy, seen = collections.Counter(), collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 4 or not parts[2].isdigit():
        continue
    gpu, mem, util = parts[0], int(parts[2]), int(parts[3] or 0)
    peak[gpu] = max(peak[gpu], mem); seen[gpu] += 1; busy[gpu] += util > 0
for gpu in sorted(seen):
    print(f"GPU {gpu}: peak {peak[gpu]} MiB, busy in {busy[gpu]} of {seen[gpu]} samples")
PY
}
lora_args() {  # verl's shape with LoRA and --share-prompts (64 prompts x 5), in the array `lora`
  verl_sampling
  echo '{"training": {"max_prompt_length": 512, "lora": {}}}' >"$NODE/lora.json"
  lora=(--config "$NODE/lora.json" --set num_generations=5 \
    --set "max_completion_length=$CAP" --set generation_batch_size=320 \
    --set "generation_kwargs=$KWARGS" --share-prompts)
}
tinyv_prep() {  # the tiny random model, the embedded problems and 32 turn-0 trajectories (CPU)
  python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
  export PREFECT_HOME="$NODE/prefect-tinyv"
  CUDA_VISIBLE_DEVICES="" python3 -m flows.data --storage /root/runs-tinyv --backend namespace \
    >"$NODE/tinyv-prep.log" 2>&1 &&
  CUDA_VISIBLE_DEVICES="" python3 -m flows.trajectories --storage /root/runs-tinyv \
    --model /root/tiny-random --engine transformers --device cpu --limit 32 --n 2 --turns 0 \
    --max-new-tokens 8 --backend namespace >>"$NODE/tinyv-prep.log" 2>&1
  echo "tiny prep exit $? at $(elapsed) s"; tail -2 "$NODE/tinyv-prep.log"
}
tinyv_pair() {  # the tiny model through flows.training with vLLM colocated, 8 steps synchronous
  # then 8 --async (each generation batch sampled while the step before trains); the prompt
  # limit is the tiny model's 4,096 positions less the tiny preset's 24-token completion
  echo '{"training": {"generation": "vllm_colocate", "max_prompt_length": 4072}}' >"$NODE/tinyv.json"
  for run in sync async; do
    flag=(); [ "$run" = async ] && flag=(--async)
    PREFECT_HOME="$NODE/prefect-tinyv" timeout 200 python3 -m flows.training \
      --storage /root/runs-tinyv --model /root/tiny-random --preset tiny --mode single_turn \
      --max-steps 8 --config "$NODE/tinyv.json" --backend namespace --report-to none \
      "${flag[@]}" >"$OUT/tiny-vllm-$run.log" 2>&1
    echo $? >"$NODE/tinyv-$run.rc"; echo "[tiny-vllm-$run] exit $(cat "$NODE/tinyv-$run.rc") at $(elapsed) s"
    tr '\r' '\n' <"$OUT/tiny-vllm-$run.log" | grep -a -o -E "one step off[^;']*|'overlap': \{[^}]*\}|'step_s': \[[^]]*\]|[A-Za-z]*Error: [^\\]*" \
      | grep -v errors.html | sort -u | head -6
  done
}
lc_start() {  # NAME SEEDS PARALLEL DEADLINE_S: the learning check's cobalt and cobalt_async, detached
  rm -f "$NODE/$1.rc"; rm -rf "/root/$1"
  setsid nohup bash -c "python3 -m experiments.learning_check --out /root/$1 --seeds $2 \
    --parallel $3 --deadline-s $4 --modes cobalt,cobalt_async >$NODE/$1.log 2>&1; echo \$? >$NODE/$1.rc" \
    </dev/null >/dev/null 2>&1 &
}
lc_collect() {  # NAME: its log and outputs (no weights) into $OUT, and its verdict
  echo "[$1] exit $(cat "$NODE/$1.rc" 2>/dev/null || echo running) at $(elapsed) s"
  cp "$NODE/$1.log" "$OUT/" 2>/dev/null; tail -4 "$NODE/$1.log"
  tar -czf "$OUT/$1.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    --exclude='tensorboard' -C /root "$1" 2>/dev/null
  grep -a -E "^\| (comparison|cobalt)" "/root/$1/REPORT.md" 2>/dev/null | head -12
}
fork_probe() {  # a GPU counted, not used (as a Dask worker before vLLM): can a forked child use CUDA?
  python3 -c 'import os, torch
torch.cuda.device_count(); print("CUDA initialised after device_count:", torch.cuda.is_initialized())
if (pid := os.fork()) == 0:
    try: torch.zeros(1, device="cuda"); print("forked child: CUDA works")
    except RuntimeError as e: print("forked child:", str(e)[:60])
    os._exit(0)
os.waitpid(pid, 0)'
}
case "${1:-}" in
  parity)
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    echo "cores $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB"
    (build_8b) >"$NODE/model.log" 2>&1 &
    (prep_runs) >"$NODE/prep.log" 2>&1 &
    # the 0.7B shape's weights drawn in bf16 and saved as float32: every layout's float32
    # master copy starts from the same values (DeepSpeed's bf16 mode builds its master copy from
    # bf16 weights: an fp32 checkpoint's low bits would be lost at its start alone)
    CUDA_VISIBLE_DEVICES=1 build_07b
    # beside it, the embedded default as a user starts it with --gpus G --sharding fsdp
    rm -f "$NODE/default4.done"
    (OUT="$OUT" bash scripts/gpu/node.sh default4; touch "$NODE/default4.done") \
      >"$NODE/default4.out" 2>&1 &
    # the stated mixed-precision tolerance: weights_rel <= 0.1, a step's loss within 0.01; the
    # yardstick (1@8: one process, micro-batches of 8 instead of 4) was measured on 4x H200 on
    # 2026-11-28 (weights_rel 0.038): a one-process run repeats bit for bit on the same card
    timeout 480 python3 -m benchmarks.parity --model /root/model-07b --preset paper \
      --precision mixed --layouts 1 "$G:fsdp" --kill-resume "$G:fsdp" \
      --lr 1e-5 --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 --loss-abs 0.01 \
      --json "$OUT/parity_${G}gpu.json" >"$NODE/parity.log" 2>&1
    echo "parity exit $? at $(elapsed) s"; grep -A12 "^| layout" "$NODE/parity.log"
    grep -a "verdict" "$NODE/parity.log"; tail -c 3000 "$NODE/parity.log" >"$OUT/parity_tail.log"
    wait_for "$NODE/model.rc" 560; wait_for "$NODE/prep.done" 560
    wait_for "$NODE/default4.done" 575
    echo "8B model exit $(cat "$NODE/model.rc" 2>/dev/null) at $(elapsed) s"; tail -2 "$NODE/model.log"
    tail -3 "$NODE/prep.log"; tail -25 "$NODE/default4.out" ;;
  parity2)  # a 2-GPU machine (2026-11-28 afternoon): what the float32 gather costs,
    # then the 0.7B parity in mixed precision, detached (parity2-collect gathers it)
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    timeout 200 torchrun --nproc_per_node "$G" scripts/gpu/fsdp_gather_cost.py \
      --json "$OUT/fsdp_gather_cost.json" >"$NODE/gather.log" 2>&1
    echo "gather cost exit $? at $(elapsed) s"; tail -c 2500 "$NODE/gather.log"
    build_07b
    rm -f "$NODE/parity.rc"
    setsid nohup bash -c "timeout 1200 python3 -m benchmarks.parity --model /root/model-07b \
      --preset paper --precision mixed --layouts 1 1@8 $G:ddp $G:fsdp --kill-resume $G:fsdp \
      --lr 1e-5 --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 --loss-abs 0.01 \
      --json $NODE/parity_mixed.json >$NODE/parity.log 2>&1; echo \$? >$NODE/parity.rc" \
      >/dev/null 2>&1 </dev/null &
    wait_for "$NODE/parity.rc" 560
    echo "parity: $(cat "$NODE/parity.rc" 2>/dev/null || echo running) at $(elapsed) s"
    cat "$NODE/parity_mixed.json" 2>/dev/null | head -c 4000 ;;
  parity2-product)  # the product's fsdp in mixed precision with the autocast cache off: the
    # same numbers as parity2's (bit-identical: a GPU repeat is), its peak memory
    bash infra/gpu-bundle/install.sh >/dev/null
    build_07b
    python3 -m benchmarks.parity --model /root/model-07b --preset paper --precision mixed \
      --layouts 1 "$G:fsdp" --lr 1e-5 --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 \
      --loss-abs 0.01 --json "$OUT/parity_mixed_nocache.json" >"$NODE/parity-nc.log" 2>&1
    echo "parity exit $? at $(elapsed) s"; grep -A4 "^| layout" "$NODE/parity-nc.log" ;;
  parity2-collect)  # parity2's run, the gather's cost at the 4B shape, then fsdp in fp32 on 1
    # node and over 2 "nodes" of G/2 GPUs
    [ -f "$NODE/parity.log" ] && wait_for "$NODE/parity.rc" 400  # a fresh machine has none
    timeout 200 torchrun --nproc_per_node "$G" scripts/gpu/fsdp_gather_cost.py --hidden 2560 \
      --layers 36 --heads 32 --json "$OUT/fsdp_gather_cost_4b.json" >"$NODE/gather4b.log" 2>&1
    echo "gather cost (4B shape) exit $? at $(elapsed) s"; grep -E '"(policy|step_s|peak_gib|forward_peak_gib)"' "$NODE/gather4b.log"
    echo "parity exit $(cat "$NODE/parity.rc" 2>/dev/null || echo running) at $(elapsed) s"
    grep -A10 "^| layout" "$NODE/parity.log"; grep -a verdict "$NODE/parity.log"
    cp "$NODE/parity_mixed.json" "$NODE/parity.log" "$OUT/" 2>/dev/null
    [ -f /root/model-07b/config.json ] || build_07b
    timeout $((560 - $(elapsed))) python3 -m benchmarks.parity --model /root/model-07b \
      --preset paper --precision fp32 --layouts 1 "$G:fsdp" "2x$((G / 2)):fsdp" --lr 1e-5 \
      --step 32 --micro-batch 4 --prompts 64 --tolerance 1e-3 \
      --json "$OUT/parity_fp32.json" >"$NODE/parity-fp32.log" 2>&1
    echo "parity fp32 exit $? at $(elapsed) s"; grep -A6 "^| layout" "$NODE/parity-fp32.log" ;;
  fsdp-fp32)  # fsdp against one process in fp32 (no bf16 rounding): what is left is logic
    timeout 560 python3 -m benchmarks.parity --model /root/model-07b --preset paper \
      --precision fp32 --layouts 1 "$G:fsdp" --kill-resume "$G:fsdp" --lr 1e-5 --step 32 \
      --micro-batch 4 --prompts 64 --tolerance 1e-3 --json "$OUT/parity_fsdp_fp32.json" \
      >"$NODE/parity-fp32.log" 2>&1
    echo "parity fp32 exit $? at $(elapsed) s"; grep -A6 "^| layout" "$NODE/parity-fp32.log" ;;
  hybrid)  # (after parity: its 0.7B shape) several nodes on one host: 2 "nodes" (two launchers,
    # GPUs 0-1 and 2-3) under full shard and hybrid shard against 1 node of every GPU
    timeout 560 python3 -m benchmarks.parity --model /root/model-07b --preset paper \
      --precision mixed --layouts "$G:fsdp" "2x$((G / 2)):fsdp" "2x$((G / 2)):hybrid" --lr 1e-5 \
      --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 --loss-abs 0.01 \
      --json "$OUT/parity_hybrid.json" >"$NODE/parity-hybrid.log" 2>&1
    echo "parity hybrid exit $? at $(elapsed) s"; grep -A6 "^| layout" "$NODE/parity-hybrid.log" ;;
  cost-hybrid)  # (after parity) what the float32 gather costs at the 8B shape (time and peak
    # memory against the bf16 gather, micro-batches of 2 x 4,096 tokens), then `hybrid`
    bash infra/gpu-bundle/install.sh >/dev/null
    timeout 220 torchrun --nproc_per_node "$G" scripts/gpu/fsdp_gather_cost.py --hidden 4096 \
      --layers 36 --heads 32 --tokens 4096 --micro-batch 2 --steps 3 --warmup 1 \
      --policies bf16-gather fp32-gather-nocache \
      --json "$OUT/fsdp_gather_cost_8b.json" >"$NODE/gather8b.log" 2>&1
    echo "gather cost (8B shape) exit $? at $(elapsed) s"; tail -c 2000 "$NODE/gather8b.log"
    [ -f /root/model-07b/config.json ] || build_07b
    timeout $((580 - $(elapsed))) python3 -m benchmarks.parity --model /root/model-07b \
      --preset paper --precision mixed --layouts "$G:fsdp" "2x$((G / 2)):fsdp" \
      "2x$((G / 2)):hybrid" --lr 1e-5 --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 \
      --loss-abs 0.01 --json "$OUT/parity_hybrid.json" >"$NODE/parity-hybrid.log" 2>&1
    echo "parity hybrid exit $? at $(elapsed) s"; grep -A6 "^| layout" "$NODE/parity-hybrid.log"
    tail -c 2000 "$NODE/parity-hybrid.log" >"$OUT/parity_hybrid_tail.log" ;;
  nodes)  # the bytes across nodes on a 4-GPU host, after `parity`/`a` (the 8B shape, verl's data):
    # verl's shape through flows.training, full fine-tuning, 2 "nodes" x 2 GPUs (two launchers,
    # GPUs 0-1 and 2-3, one rendezvous, a storage directory both use: --shared-storage) under
    # $NODE_SHARDING (fsdp; hybrid), then 1 node x 4 (detached: ~12 minutes; `nodes-collect`)
    bash infra/gpu-bundle/install.sh >/dev/null
    rm -f "$NODE/nodes.done"
    setsid nohup bash scripts/gpu/node.sh nodes-chain </dev/null >"$NODE/nodes-chain.out" 2>&1 &
    wait_for "$NODE/nodes.done" 570; tail -5 "$NODE/nodes-chain.out" ;;
  nodes-chain)  # (detached by `nodes`)
    verl_args; fresh_runs nodes one
    two_nodes; touch "$NODE/nodes-2x2.done"
    GPUS=4 train one-node /root/runs-verl-one "${verl[@]}"
    touch "$NODE/nodes.done" ;;
  vllm-nodes)  # (after the bundle's two calls) vLLM colocated as TRL starts it, over 2 "nodes"
    # (two launchers, GPUs split between them, the static rendezvous accelerate uses: ranks by
    # --node-rank) with the tiny model: every process's own outcome
    python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
    half=$((G / 2)); port=$((29000 + RANDOM % 1000))
    for r in 1 0; do
      devices=$(seq -s, $((r * half)) $((r * half + half - 1)))
      CUDA_VISIBLE_DEVICES=$devices timeout 240 torchrun --nnodes 2 --node-rank "$r" \
        --nproc-per-node "$half" --master-addr 127.0.0.1 --master-port "$port" \
        scripts/gpu/vllm_nodes_check.py /root/tiny-random --out "$OUT/vllm-nodes" \
        >"$OUT/vllm-nodes-$r.log" 2>&1 &
    done
    wait; for f in "$OUT"/vllm-nodes/rank*.txt; do echo "== $f"; tail -25 "$f"; done
    grep -a -E "Error|error" "$OUT"/vllm-nodes-*.log | grep -v errors.html | sort | uniq -c | head -20 ;;
  goal1)  # goal 1 + the bytes across nodes, call 1 of 4 (header)
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    echo "cores $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB"
    rm -f "$NODE/prep.done"
    setsid nohup bash scripts/gpu/node.sh prep </dev/null >"$NODE/prep.log" 2>&1 &
    (HOST_TIMEOUT=330 host_run 1 default-shared --share-prompts) & host=$!
    CUDA_VISIBLE_DEVICES=0 build_8b_weights >"$NODE/model.log" 2>&1
    echo "8B weights exit $? at $(elapsed) s"; wait "$host"
    tr '\r' '\n' <"$OUT/default-shared/default-shared.log" | grep -a -E "forward passes|Pass@1|rewards|Error" | tail -8
    wait_for "$NODE/prep.done" 300; tail -3 "$NODE/prep.log" ;;
  prep)  # (detached by goal1) the runs' problem sets and trajectories on the CPU
    prep_runs ;;
  goal1-train)  # call 2 of 4: vLLM, the 8B shape calibrated, then the chain (detached)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b >>"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    tail -3 "$NODE/model.log"
    wait_for "$NODE/prep.done" 300; [ -f "$NODE/prep.done" ] || tail -5 "$NODE/prep.log"
    rm -f "$NODE/goal1.done" "$NODE/nodes-2x2.done" "$NODE/nodes.done"
    setsid nohup bash scripts/gpu/node.sh goal1-chain </dev/null >"$NODE/goal1-chain.out" 2>&1 &
    wait_for "$NODE/shared.rc" 585
    [ -f "$NODE/shared.rc" ] && report shared /root/runs-verl-shared 1544 "verl (published, 8x H100)" ;;
  goal1-chain)  # (detached by goal1-train) one run after another on every GPU
    verl_args; fresh_runs shared one nodes
    GPUS=4 train shared /root/runs-verl-shared "${verl[@]}" --share-prompts
    GPUS=4 train one-node /root/runs-verl-one "${verl[@]}"
    touch "$NODE/goal1.done"
    two_nodes; touch "$NODE/nodes-2x2.done" "$NODE/nodes.done" ;;
  goal1-collect)  # call 3 of 4: the two 1 x 4 runs (the shared one again if call 2 had it)
    wait_for "$NODE/shared.rc" 300
    GPUS=4 report shared /root/runs-verl-shared 1544 "verl (published, 8x H100)"
    wait_for "$NODE/one-node.rc" 585
    GPUS=4 report one-node /root/runs-verl-one 1544 "verl (published, 8x H100)" ;;
  nodes-collect)  # the 2 x 2 run's and the 1 x 4 run's step reports
    wait_for "$NODE/nodes-2x2.done" 560; node_logs nodes
    GPUS=$G report nodes-0 /root/runs-verl-nodes 1544 "verl (published, 8x H100)"
    wait_for "$NODE/nodes.done" 580
    GPUS=$G report one-node /root/runs-verl-one 1544 "verl (published, 8x H100)" ;;
  two)  # packing and 2 nodes on a 2-GPU machine, call 1 of 3 in ONE message (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00): on GPU 1 (detached) the
    # 0.7B parity of packed micro-batches of 40 rows (`1@40+share` and its regrouping yardstick
    # `1@40` against 1 process in micro-batches of 4); the 8B weights on GPU 0; the runs' data
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    rm -f "$NODE/prep.done" "$NODE/parity40.rc"
    setsid nohup bash scripts/gpu/node.sh prep </dev/null >"$NODE/prep.log" 2>&1 &
    setsid nohup bash -c "$(declare -f build_07b elapsed); started=$started NODE=$NODE
      export CUDA_VISIBLE_DEVICES=1; build_07b
      timeout 1200 python3 -m benchmarks.parity --model /root/model-07b --preset paper \
        --precision mixed --layouts 1 1@40+share 1@40 --lr 1e-5 --step 40 --micro-batch 4 \
        --prompts 64 --tolerance 0.1 --loss-abs 0.01 --json /root/parity40.json \
        >$NODE/parity40.log 2>&1; echo \$? >$NODE/parity40.rc" </dev/null >/dev/null 2>&1 &
    CUDA_VISIBLE_DEVICES=0 build_8b_weights >"$NODE/model.log" 2>&1
    echo "8B weights exit $? at $(elapsed) s"
    wait_for "$NODE/prep.done" 420; tail -3 "$NODE/prep.log"; tail -3 "$NODE/parity40.log" ;;
  two-train)  # call 2 of 3 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM; the 8B shape's lengths
    # calibrated (GPU 0); the tiny model through flows.training on 2 "nodes" x 1 GPU with vLLM
    # colocated (the 2-node failing case at its smallest); then (detached) verl's shape at 8B on
    # 2 "nodes" x 1 GPU and on 1 node x 2 (each GPU the rows one GPU of the 1 x 4 runs had)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b >>"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    tail -2 "$NODE/model.log"
    wait_for "$NODE/parity40.rc" 240; echo "parity40 exit $(cat "$NODE/parity40.rc" 2>/dev/null)"
    grep -A5 "^| layout" "$NODE/parity40.log"; cp /root/parity40.json "$OUT/" 2>/dev/null
    wait_for "$NODE/prep.done" 250; fresh_runs tiny
    tiny_args; (NODES_NAME=tiny MODEL=/root/tiny-random; NODES_ARGS=("${tiny[@]}"); two_nodes)
    for r in 0 1; do echo "[tiny-$r] exit $(cat "$NODE/tiny-$r.rc") at $(elapsed) s"; done
    tr '\r' '\n' <"$NODE/tiny-0.log" | grep -a -E "training plan|Error|steps? " | tail -6
    node_logs tiny
    rm -f "$NODE/two.done"
    setsid nohup bash scripts/gpu/node.sh two-chain </dev/null >"$NODE/two-chain.out" 2>&1 &
    wait_for "$NODE/nodes-0.rc" 585; [ -f "$NODE/nodes-0.rc" ] && node_logs nodes ;;
  two-chain)  # (detached by two-train) 640 completions a step: 320 a GPU, as 1,280 on 4
    VERL_BATCH=640 verl_args; fresh_runs nodes one
    two_nodes; touch "$NODE/nodes-2x2.done"
    GPUS=2 train one-node /root/runs-verl-one "${verl[@]}"
    touch "$NODE/two.done" "$NODE/nodes.done" ;;
  duo)  # --async and 2 nodes on a 2-GPU machine, call 1 of 4 in ONE message (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00): the runs' data (CPU,
    # detached), the 8B weights (GPU 0)
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    rm -f "$NODE/prep.done"
    setsid nohup bash scripts/gpu/node.sh prep </dev/null >"$NODE/prep.log" 2>&1 &
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"
    wait_for "$NODE/prep.done" 420; tail -4 "$NODE/prep.log" ;;
  duo-train)  # call 2 of 4 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM; the 8B shape's lengths
    # calibrated (GPU 0); then `duo-chain` detached; this call reports its LoRA pair
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b >>"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    tail -2 "$NODE/model.log"; wait_for "$NODE/prep.done" 250
    rm -f "$NODE/lora.done" "$NODE/nodes-2x2.done" "$NODE/duo.done"
    setsid nohup bash scripts/gpu/node.sh duo-chain </dev/null >"$NODE/duo-chain.out" 2>&1 &
    wait_for "$NODE/lora.done" 580
    for run in sync async; do
      GPUS=1 report "lora-$run" "/root/runs-verl-$run" 1544 "verl (published, 8x H100)"
    done ;;
  duo-chain)  # (detached by duo-train) verl's shape with LoRA and --share-prompts on one GPU each,
    # synchronous on GPU 0 beside --async on GPU 1 (each its own vLLM cache: both are
    # logical GPU 0); then full fine-tuning of the 8B shape under fsdp at 640 completions a step
    # (320 a GPU, as 1,280 on 4) on 2 "nodes" x 1 GPU, then 1 node x 2 (the bytes across nodes)
    lora_args; fresh_runs sync async
    (CUDA_VISIBLE_DEVICES=0 GPUS=1 SHARDING=ddp train lora-sync /root/runs-verl-sync "${lora[@]}") &
    (CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/root/.cache/vllm-gpu1 GPUS=1 SHARDING=ddp \
      train lora-async /root/runs-verl-async "${lora[@]}" --async) &
    wait; touch "$NODE/lora.done"
    VERL_BATCH=640 verl_args; fresh_runs nodes one
    two_nodes; touch "$NODE/nodes-2x2.done"
    GPUS=2 train one-node /root/runs-verl-one "${verl[@]}"
    touch "$NODE/duo.done" ;;
  duo-collect)  # calls 3 and 4 (the same phase twice: the 8B runs take ~10 minutes): both 8B
    # runs' step reports, as far as they have come (each losses, collective GB a step)
    wait_for "$NODE/nodes-2x2.done" 300; node_logs nodes
    GPUS=2 report nodes-0 /root/runs-verl-nodes 1544 "verl (published, 8x H100)"
    wait_for "$NODE/duo.done" 580
    GPUS=2 report one-node /root/runs-verl-one 1544 "verl (published, 8x H100)" ;;
  async-diag)  # the 8B LoRA --async run that died on 2x H200 (2026-11-29: a CUDA fault
    # in both threads at step 2), call 1 of 3 in ONE message (carry .gpu/site-train.tar.xz
    # .gpu/site-core.tar.xz .gpu/vllm.part-00): verl's data (CPU), the 8B weights (GPU 0)
    bash infra/gpu-bundle/install.sh >/dev/null
    (verl_data) &
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"; wait ;;
  async-diag-train)  # call 2 of 3 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM, the 8B shape
    # calibrated; verl's shape with LoRA and --share-prompts, --async (GPU 0; on a 2-GPU machine
    # the synchronous run beside it on GPU 1), 3 steps; their reports
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b >>"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    lora_args; fresh_runs sync async
    [ "$G" -ge 2 ] && (CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/root/.cache/vllm-gpu1 GPUS=1 \
      SHARDING=ddp train lora-sync /root/runs-verl-sync "${lora[@]}") &
    CUDA_VISIBLE_DEVICES=0 GPUS=1 SHARDING=ddp train lora-async /root/runs-verl-async \
      "${lora[@]}" --async; wait
    for run in async sync; do [ -f "$NODE/lora-$run.rc" ] &&
      GPUS=1 report "lora-$run" "/root/runs-verl-$run" 1544 "verl (published, 8x H100)"; done ;;
  async-diag-blocking)  # call 3 of 3: if the --async run failed again, 2 steps with
    # CUDA_LAUNCH_BLOCKING=1 (each kernel waited for: the first fault raised where it happens);
    # if it ran on a one-GPU machine, the synchronous run on the same GPU for its time split
    lora_args
    if [ "$(cat "$NODE/lora-async.rc" 2>/dev/null)" = 0 ] && [ "$G" -eq 1 ]; then
      fresh_runs sync; GPUS=1 SHARDING=ddp train lora-sync /root/runs-verl-sync "${lora[@]}"
      GPUS=1 report lora-sync /root/runs-verl-sync 1544 "verl (published, 8x H100)"; exit 0
    fi
    fresh_runs blocking
    CUDA_LAUNCH_BLOCKING=1 CUDA_VISIBLE_DEVICES=0 GPUS=1 SHARDING=ddp train lora-blocking \
      /root/runs-verl-blocking "${lora[@]}" --async --max-steps 2
    echo "[lora-blocking] exit $(cat "$NODE/lora-blocking.rc") at $(elapsed) s"
    f=$(ls -t /root/runs-verl-blocking/training/*/.launch/launch.log | head -1)
    tr '\r' '\n' <"$f" | grep -a -v '^\[rank0\]:  *\^' | tail -c 30000 >"$OUT/lora-blocking.launch.log" ;;
  split-train)  # the split of GPUs on a 2-GPU machine, call 2 of 3 (call 1: `async-diag`;
    # carry .gpu/vllm.part-01 .gpu/PARTS): vLLM, the 8B shape calibrated; verl's shape with LoRA
    # and --async, training on GPU 0 beside a vLLM server of the stage's on GPU 1, 4 steps
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b >>"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    lora_args; fresh_runs split
    GPUS=1 SHARDING=ddp train lora-split /root/runs-verl-split "${lora[@]}" --async \
      --vllm-server-gpus 1 --max-steps 4
    GPUS=2 report lora-split /root/runs-verl-split 1544 "verl (published, 8x H100)"
    f=$(ls -t /root/runs-verl-split/training/*/.launch/vllm-server.log | head -1)
    tail -c 20000 "$f" >"$OUT/lora-split.vllm-server.log" ;;
  fp8-split)  # (after split-train, on its machine) the same split with --fp8-generation: the
    # stage's server in fp8, its weights quantized again at each push; the step against
    # split-train's, the rewards and TRL's sampling/importance-sampling figures in the report
    lora_args; fresh_runs fp8
    GPUS=1 SHARDING=ddp train lora-fp8 /root/runs-verl-fp8 "${lora[@]}" --async \
      --vllm-server-gpus 1 --fp8-generation --max-steps 4
    GPUS=2 report lora-fp8 /root/runs-verl-fp8 1544 "verl (published, 8x H100)"
    f=$(ls -t /root/runs-verl-fp8/training/*/.launch/vllm-server.log | head -1)
    tail -c 20000 "$f" >"$OUT/lora-fp8.vllm-server.log" ;;
  split-sync)  # call 3 of 3: the same shape synchronous, vLLM colocated on both GPUs (ddp)
    lora_args; fresh_runs sync2
    GPUS=2 SHARDING=ddp train lora-sync2 /root/runs-verl-sync2 "${lora[@]}" --max-steps 4
    GPUS=2 report lora-sync2 /root/runs-verl-sync2 1544 "verl (published, 8x H100)" ;;
  g4)  # the 4-GPU goals and 2 nodes on ONE fresh 4-GPU machine, call 1 of 4 in ONE message (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00): verl's data and the tiny
    # model's on the CPU, the 8B weights on GPU 0
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    echo "cores $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB"
    (verl_data; tinyv_prep) >"$NODE/g4-prep.log" 2>&1 &
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"
    wait; tail -4 "$NODE/g4-prep.log" ;;
  g4-train)  # call 2 of 4 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM; the 8B shape calibrated
    # on GPU 0 beside the tiny model on GPUs 1-3 (2 processes + the stage's vLLM server, --async);
    # then, detached, verl's shape at 8B, full fine-tuning under fsdp (g4-chain), this call
    # waiting for the first run: 3 processes + a server of the stage's on the 4th GPU, --async
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    (build_8b >>"$NODE/model.log" 2>&1) & calibrating=$!
    echo '{"training": {"max_prompt_length": 4072}}' >"$NODE/tiny-server.json"
    CUDA_VISIBLE_DEVICES=1,2,3 PREFECT_HOME="$NODE/prefect-tinyv" bounded 300 python3 -m \
      flows.training --storage /root/runs-tinyv --model /root/tiny-random --preset tiny \
      --mode single_turn --max-steps 8 --config "$NODE/tiny-server.json" --backend namespace \
      --report-to none --gpus 2 --vllm-server-gpus 1 --async >"$OUT/tiny-server.log" 2>&1
    echo "[tiny-server] exit $? at $(elapsed) s"
    tr '\r' '\n' <"$OUT/tiny-server.log" | grep -a -o -E "one step off[^;']*|'step_s': \[[^]]*\]|vLLM server[^']*|[A-Za-z]*Error: [^\\]*" \
      | grep -v errors.html | sort -u | head -8
    wait "$calibrating"; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    rm -f "$NODE/split.rc" "$NODE/shared.rc" "$NODE/nodes-2x2.done"
    setsid nohup bash scripts/gpu/node.sh g4-chain </dev/null >"$NODE/g4-chain.out" 2>&1 &
    wait_for "$NODE/split.rc" 585
    GPUS=4 report split /root/runs-verl-split 1544 "verl (published, 8x H100)"
    f=$(ls -t /root/runs-verl-split/training/*/.launch/vllm-server.log 2>/dev/null | head -1)
    [ -n "$f" ] && tail -c 20000 "$f" >"$OUT/split.vllm-server.log" ;;
  g4-chain)  # (detached by g4-train) one run after another on every GPU, each bounded in time:
    # the split (3 training processes, a batch of 1,350: 450 rows a process), the synchronous
    # default on 1 node x 4 (vLLM colocated), the same on 2 "nodes" x 2 (--shared-storage)
    fresh_runs split shared nodes
    VERL_BATCH=1350 verl_args
    GPUS=3 TRAIN_TIMEOUT=600 train split /root/runs-verl-split "${verl[@]}" --share-prompts \
      --async --vllm-server-gpus 1 --max-steps 4
    verl_args
    GPUS=4 TRAIN_TIMEOUT=480 train shared /root/runs-verl-shared "${verl[@]}" --share-prompts
    (NODES_ARGS=("${verl[@]}" --share-prompts); TRAIN_TIMEOUT=480; two_nodes)
    touch "$NODE/nodes-2x2.done" ;;
  g4-collect)  # call 3 of 4: the synchronous 1 x 4 run's step report
    wait_for "$NODE/shared.rc" 585
    GPUS=4 report shared /root/runs-verl-shared 1544 "verl (published, 8x H100)" ;;
  g4-nodes)  # call 4 of 4: the 2 x 2 run's step report and node 1's logs
    wait_for "$NODE/nodes-2x2.done" 580; node_logs nodes
    GPUS=4 report nodes-0 /root/runs-verl-nodes 1544 "verl (published, 8x H100)" ;;
  g4-nemo)  # goal 2 (NeMo-RL's shape) on a 4-GPU machine, after `g4` and the install
    # call (carry .gpu/vllm.part-01): vLLM; the 8B shape calibrated to responses of mean
    # ~1,000 tokens capped at 4,096 (kept aside: eos_calibration_1000.json); then, detached
    # (g4-nemo-chain), 64 prompts x 32 samples through flows.training, full fine-tuning under
    # fsdp, --share-prompts: the synchronous 1 x 4, then the split 2 + 2 (--async, 1,024 rows
    # a training process, the stage's server data parallel on 2 GPUs); this call waits for the
    # first
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b >>"$NODE/model.log" 2>&1
    CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu/eos_calibrate.py "$MODEL" --mean 1000 --cap 4096 \
      >>"$NODE/model.log" 2>&1 && mv "$MODEL/eos_calibration.json" "$MODEL/eos_calibration_1000.json"
    echo "calibrated (mean 1,000, cap 4,096): exit $? at $(elapsed) s"; tail -1 "$NODE/model.log"
    rm -f "$NODE/nemo-sync.rc" "$NODE/nemo-split.rc"
    setsid nohup bash scripts/gpu/node.sh g4-nemo-chain </dev/null >"$NODE/g4-nemo-chain.out" 2>&1 &
    wait_for "$NODE/nemo-sync.rc" 585
    GPUS=4 report nemo-sync /root/runs-verl-nemo-sync 3052 "NeMo-RL v0.5 FP8 (published, 16x H100)" ;;
  g4-nemo-chain)  # (detached by g4-nemo) the two runs, each bounded in time: the split is 2 + 2
    # (one H200 generates the 2,048 completions in ~237 s, three train them in ~115 s: a 3 + 1
    # split would wait on its server, docs/RESULTS.md, estimates); on 80 GiB cards the
    # plan refuses the split in seconds (two shards of 8B's state leave no room for a row)
    fresh_runs nemo-sync nemo-split
    nemo=(--set num_generations=32)
    CALIBRATION=$MODEL/eos_calibration_1000.json CAP_TOKENS=4096 VERL_BATCH=2048 verl_args
    GPUS=4 TRAIN_TIMEOUT=900 train nemo-sync /root/runs-verl-nemo-sync "${verl[@]}" "${nemo[@]}" \
      --share-prompts --max-steps 2
    GPUS=2 TRAIN_TIMEOUT=1100 train nemo-split /root/runs-verl-nemo-split "${verl[@]}" \
      "${nemo[@]}" --share-prompts --async --vllm-server-gpus 2 --max-steps 3 ;;
  g4-nemo-collect)  # call 3 of 3 (twice if the split has not ended): the split run's report
    wait_for "$NODE/nemo-split.rc" 585
    GPUS=4 report nemo-split /root/runs-verl-nemo-split 3052 "NeMo-RL v0.5 FP8 (published, 16x H100)" ;;
  fix)  # the per-GPU vLLM cache on a fresh 2-GPU machine, call 1 of 2 (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00): the tiny model, verl's data
    bash infra/gpu-bundle/install.sh >/dev/null
    verl_data ;;
  fix-train)  # call 2 of 2 (carry .gpu/vllm.part-01 .gpu/PARTS): what failed twice before the
    # per-GPU cache (1 node x 2 after 2 nodes x 1, vLLM colocated), with the tiny model
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    fresh_runs tiny tiny-one
    tiny_args --max-steps 2
    (NODES_NAME=tiny MODEL=/root/tiny-random; NODES_ARGS=("${tiny[@]}"); two_nodes)
    for r in 0 1; do echo "[tiny-$r] exit $(cat "$NODE/tiny-$r.rc") at $(elapsed) s"; done
    MODEL=/root/tiny-random GPUS=2 train tiny-one /root/runs-verl-tiny-one "${tiny[@]}"
    echo "[tiny-one] exit $(cat "$NODE/tiny-one.rc") at $(elapsed) s"
    tr '\r' '\n' <"$NODE/tiny-one.log" | grep -a -E "failed|Error" | cut -c1-300 | tail -3
    cp "$NODE/tiny-one.log" "$OUT/"; find /root/.cache/vllm -maxdepth 5 -name "rank_*" | sort ;;
  two-collect)  # call 3 of 3: both 8B runs' step reports (2 x 1 against 1 x 2)
    wait_for "$NODE/nodes-2x2.done" 300; node_logs nodes
    GPUS=2 report nodes-0 /root/runs-verl-nodes 1544 "verl (published, 8x H100)"
    wait_for "$NODE/two.done" 585
    GPUS=2 report one-node /root/runs-verl-one 1544 "verl (published, 8x H100)" ;;
  cost-paper)  # the gather's cost at the 8B shape and the paper's lengths (one 16,384-token
    # sequence a micro-batch): the memory the float32 gather adds where an H100 is tightest
    timeout 240 torchrun --nproc_per_node "$G" scripts/gpu/fsdp_gather_cost.py --hidden 4096 \
      --layers 36 --heads 32 --tokens 16384 --micro-batch 1 --steps 2 --warmup 1 \
      --policies bf16-gather fp32-gather-nocache \
      --json "$OUT/fsdp_gather_cost_8b_16k.json" >"$NODE/gather16k.log" 2>&1
    echo "gather cost (8B shape, 16k tokens) exit $? at $(elapsed) s"; tail -c 1500 "$NODE/gather16k.log" ;;
  vllm)  # the bundle's vLLM parts only (the second call on a fresh machine)
    bash infra/gpu-bundle/install.sh >/dev/null; python3 -c 'import vllm; print("vllm", vllm.__version__)' ;;
  default4)  # the embedded default with --gpus G --sharding fsdp (per-process memory in its stats)
    pid=$(gpu_trace default4)
    PREFECT_HOME="$NODE/prefect-default4" timeout 560 python3 -m flows.pipeline --gpus "$G" \
      --sharding fsdp --storage /root/runs-default4 --backend namespace >"$NODE/default4.log" 2>&1
    echo "[default4] exit $? at $(elapsed) s"; kill "$pid"
    cp "$NODE/default4.log" "$OUT/"; grep -a -A8 "^settings:" "$NODE/default4.log" | head -14
    tr '\r' '\n' <"$NODE/default4.log" | grep -a -E "Pass@1|policy|error|Error" | tail -8
    gpus_used default4
    PREFECT_HOME="$NODE/prefect-default4" python3 scripts/gpu/flow_times.py \
      --mem "$OUT/default4.gpus.csv" --json "$OUT/default4.stages.json" 2>&1 | tail -12
    manifest=$(ls -t /root/runs-default4/training/*/MANIFEST.json 2>/dev/null | head -1)
    [ -n "$manifest" ] && python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))["stats"]
print("training processes:", s.get("processes"), "peaks by process (GiB):",
      s.get("gpu_peaks_by_process_gib"), "plan:", (s.get("plan") or {}).get("sharding"))' "$manifest"
    cp "$manifest" "$OUT/default4.training_manifest.json" 2>/dev/null ;;
  pipeline8b|pipeline8b-collect)  # ~15 minutes (each generating stage ~3 of vLLM start-up):
    # started detached by `pipeline8b`, collected by `pipeline8b-collect` in the next call
    if [ "$1" = pipeline8b ]; then
      bash infra/gpu-bundle/install.sh; python3 -c 'import vllm, litellm; print("vllm", vllm.__version__)'
      rm -f "$NODE/pipeline8b.rc"
      setsid nohup bash -c 'nvidia-smi --query-gpu=index,timestamp,memory.used,utilization.gpu \
          --format=csv,noheader,nounits -lms 500 >"$0/pipeline8b.gpus.csv" 2>/dev/null & pid=$!
        mkdir -p "$0/serve-logs"  # each vllm serve log, kept (the engine removes its own)
        while sleep 5; do cp /tmp/cobalt-vllm-serve-*/*.log "$0/serve-logs/" 2>/dev/null; done &
        copier=$!
        PREFECT_HOME="$0/prefect-8b" VLLM_LOGGING_LEVEL=INFO timeout 1500 python3 -m flows.pipeline --model "$1" \
          --gpus "$2" --sharding fsdp --mode single_turn --storage /root/runs-8b --backend namespace \
          --train-limit 16 --eval-limit 16 --n 4 --eval-samples 4 --turns 1 --eval-turns 1 \
          --max-new-tokens 256 --max-steps 2 --set num_generations=4 \
          --set generation_batch_size=16 --set max_completion_length=256 --report-to none \
          >"$0/pipeline8b.log" 2>&1; echo $? >"$0/pipeline8b.rc"; kill $pid $copier' \
        "$NODE" "$MODEL" "$G" >/dev/null 2>&1 </dev/null &
    fi
    wait_for "$NODE/pipeline8b.rc" 560
    echo "[pipeline8b] exit $(cat "$NODE/pipeline8b.rc" 2>/dev/null || echo "running: collect it with pipeline8b-collect") at $(elapsed) s"
    cp "$NODE/pipeline8b.log" "$NODE/pipeline8b.gpus.csv" "$OUT/" 2>/dev/null
    grep -a -A8 "^settings:" "$NODE/pipeline8b.log" | head -14
    tr '\r' '\n' <"$NODE/pipeline8b.log" | grep -a -E "Pass@1|policy|error|Error|Finished in state" | tail -12
    for log in "$NODE"/serve-logs/*.log; do  # where each engine's start-up went
      [ -f "$log" ] || continue; cp "$log" "$OUT/pipeline8b.$(basename "$log")"
      echo "$(basename "$log"):"; grep -a -E "took|takes|finished in|Compil|capturing|KV cache" "$log" \
        | sed -E 's/^.*\] //' | sort | uniq -c | sort -rn | head -12
    done
    gpus_used pipeline8b
    PREFECT_HOME="$NODE/prefect-8b" python3 scripts/gpu/flow_times.py \
      --mem "$OUT/pipeline8b.gpus.csv" --json "$OUT/pipeline8b.stages.json" 2>&1 | tail -12 ;;
  a)
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    echo "cores $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB"
    (build_8b) >"$NODE/model.log" 2>&1 &
    (prep_runs) >"$NODE/prep.log" 2>&1 &
    timeout 360 python3 scripts/gpu/sharded_check.py --processes 4 --sharding fsdp --steps 8 \
      --json "$OUT/sharded_fsdp.json" >"$NODE/sharded_fsdp.log" 2>&1
    echo "sharded check (fsdp, 4 GPUs, killed and resumed) exit $? at $(elapsed) s"
    tail -c 1500 "$NODE/sharded_fsdp.log"
    wait_for "$NODE/model.rc" 540; wait_for "$NODE/prep.done" 540
    cp "$NODE"/*.log "$OUT/" 2>/dev/null
    echo "model exit $(cat "$NODE/model.rc" 2>/dev/null)"; tail -3 "$NODE/model.log"
    cat "$NODE/prep.log"; du -sh "$MODEL"; df -h /root | tail -1 ;;
  b)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    echo '{"training": {"max_prompt_length": 512}}' >"$NODE/verl.json"
    # verl's published shape: prompts up to 512 tokens, responses up to 1,024 (mean ~200 here),
    # 5 samples; 256 prompts x 5 a step (verl's run: 1,024 x 5)
    # through the training-multi-gpu deployment of prefect.yaml: a Prefect server, `prefect
    # deploy`, `prefect deployment run`, a gpu-pool worker (the options as a deployment takes them)
    # PASSES=packed / shared: the same run with --packing / --share-prompts (goal 1)
    packing=false share=false; case "${PASSES:-}" in packed) packing=true ;;
      shared) packing=true share=true ;; esac
    verl_sampling; pid=$(trace "$NODE/verl.mem.csv")
    cat >"$NODE/verl.params.json" <<JSON
{"params": {"trajectories": "latest", "model": "$MODEL", "storage": {"url": "/root/runs-verl"},
 "sandbox": {"backend": "namespace"},
 "training": {"preset": "paper", "mode": "single_turn", "num_processes": 4, "sharding": "fsdp",
   "fsdp_gather": "${GATHER:-float32}", "packing": $packing, "share_prompts": $share,
   "max_steps": 3, "max_prompt_length": 512, "report_to": [],
   "overrides": {"num_generations": 5, "max_completion_length": $CAP,
                 "generation_batch_size": 1280, "save_strategy": "no",
                 "generation_kwargs": $KWARGS}}}}
JSON
    DEPLOYMENT=training/training-multi-gpu DEPLOY_WAIT_S=420 \
      bash scripts/gpu/worker.sh deploy verl "$NODE/verl.params.json" >"$NODE/verl.log" 2>&1
    grep -q "worker exit 0" "$NODE/verl.log"; echo $? >"$NODE/verl.rc"; kill "$pid"
    cp /root/deploy-verl/*.log "$OUT/" 2>/dev/null
    report verl /root/runs-verl 1544 "verl GRPO Qwen2-7B FSDP, 8x H100 (published)" ;;
  linear)  # --fsdp-gather bf16-linear on the GPUs (the linear layers cast to bf16 before the
    # gather): its cost at the 8B shape against both other gathers, then the 0.7B parity against
    # one process and the float32 gather; then `GATHER=bf16-linear bash scripts/gpu/node.sh b`
    bash infra/gpu-bundle/install.sh >/dev/null
    timeout 150 torchrun --nproc_per_node "$G" scripts/gpu/fsdp_gather_cost.py --hidden 4096 \
      --layers 36 --heads 32 --tokens 4096 --micro-batch 2 --steps 3 --warmup 1 \
      --policies bf16-gather fp32-gather-nocache as-one-process \
      --json "$OUT/fsdp_gather_cost_linear_8b.json" >"$NODE/linear8b.log" 2>&1
    echo "gather cost (8B shape) exit $? at $(elapsed) s"
    grep -E '"(policy|step_s|peak_gib|loss|grad_norm)"' "$NODE/linear8b.log"
    [ -f /root/model-07b/config.json ] || CUDA_VISIBLE_DEVICES=1 build_07b
    timeout $((580 - $(elapsed))) python3 -m benchmarks.parity --model /root/model-07b \
      --preset paper --precision mixed --layouts 1 "$G:fsdp" "$G:fsdp/bf16-linear" --lr 1e-5 \
      --step 32 --micro-batch 4 --prompts 64 --tolerance 0.1 --loss-abs 0.01 \
      --json "$OUT/parity_linear.json" >"$NODE/parity-linear.log" 2>&1
    echo "parity exit $? at $(elapsed) s"; grep -A6 "^| layout" "$NODE/parity-linear.log" ;;
  pack)  # packed passes through the product on ONE GPU, call 1 (carry .gpu/site-train.tar.xz
    # .gpu/site-core.tar.xz .gpu/vllm.part-00): the runs' data (CPU) and the 8B shape's weights
    bash infra/gpu-bundle/install.sh >/dev/null
    (prep_runs) >"$NODE/prep.log" 2>&1 &
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"
    wait_for "$NODE/prep.done" 560; [ -f "$NODE/prep.done" ] || tail -5 "$NODE/prep.log" ;;
  pack-parity)  # packed passes on ONE fresh GPU, the correctness half alone (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz): packing_cost's padded, trimmed, packed
    # (varlen) and shared paths at the 8B shape, then, detached, the 0.7B parity of `pack`
    bash infra/gpu-bundle/install.sh >/dev/null
    timeout 300 python3 scripts/gpu/packing_cost.py --paths padded trimmed packed shared \
      --json "$OUT/packing_cost_8b.json" >"$NODE/packing_cost.log" 2>&1
    echo "packing cost (8B shape) exit $? at $(elapsed) s"; grep -a '^{' "$NODE/packing_cost.log"
    rm -f "$NODE/parity-pack.rc"
    setsid nohup bash -c "$(declare -f build_07b elapsed); started=$started NODE=$NODE
      [ -f /root/model-07b/config.json ] || build_07b
      timeout 900 python3 -m benchmarks.parity --model /root/model-07b --preset paper \
        --precision mixed --layouts 1 1+pack 1+share 1@8 --lr 1e-5 --step 32 --micro-batch 4 \
        --prompts 64 --tolerance 0.1 --loss-abs 0.01 --json /root/parity_pack.json \
        >$NODE/parity-pack.log 2>&1; echo \$? >$NODE/parity-pack.rc" </dev/null >/dev/null 2>&1 &
    wait_for "$NODE/parity-pack.rc" 585; cat "$NODE/parity-pack.rc" 2>/dev/null
    grep -A6 "^| layout" "$NODE/parity-pack.log" ;;
  pack-parity-collect)  # its next call: the parity's table and JSON
    wait_for "$NODE/parity-pack.rc" 500; echo "parity exit $(cat "$NODE/parity-pack.rc")"
    tail -c 3000 "$NODE/parity-pack.log"; cp /root/parity_pack.json "$OUT/" ;;
  pack-train)  # call 2 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM; the 8B shape's response
    # lengths calibrated; then, detached, the chain below (`pack-collect` reports it)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    [ -f "$NODE/prep.log" ] || (prep_runs) >"$NODE/prep.log" 2>&1 &  # a fresh machine
    build_8b >"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    tail -3 "$NODE/model.log"
    wait_for "$NODE/prep.done" 400; [ -f "$NODE/prep.done" ] || cat "$NODE/prep.log"
    rm -f "$NODE/pack-chain.done"
    setsid nohup bash scripts/gpu/node.sh pack-chain </dev/null >"$NODE/pack-chain.out" 2>&1 &
    wait_for "$NODE/pack-chain.done" 560; tail -5 "$NODE/pack-chain.out" ;;
  pack-chain)  # (detached by pack-train) verl's shape with LoRA through flows.training, one
    # run after another: --share-prompts, today's trimmed passes, --packing
    verl_sampling
    echo '{"training": {"max_prompt_length": 512, "lora": {}}}' >"$NODE/lora.json"
    lora=(--config "$NODE/lora.json" --set num_generations=5 \
      --set "max_completion_length=$CAP" --set generation_batch_size=320 \
      --set "generation_kwargs=$KWARGS")
    for run in shared trimmed packed; do cp -r /root/runs-verl "/root/runs-verl-$run"; done
    GPUS=1 SHARDING=ddp train lora-shared /root/runs-verl-shared "${lora[@]}" --share-prompts
    GPUS=1 SHARDING=ddp train lora-trimmed /root/runs-verl-trimmed "${lora[@]}"
    GPUS=1 SHARDING=ddp train lora-packed /root/runs-verl-packed "${lora[@]}" --packing
    touch "$NODE/pack-chain.done" ;;
  pack-collect)  # call 3: the chain's runs (waits for them within the call)
    for run in shared:300 trimmed:450 packed:575; do
      wait_for "$NODE/lora-${run%:*}.rc" "${run#*:}"
      GPUS=1 report "lora-${run%:*}" "/root/runs-verl-${run%:*}" 1544 "verl (published, 8x H100)"
    done ;;
  memory)  # a fresh GPU, call 1 (carry .gpu/site-train.tar.xz .gpu/site-core.tar.xz
    # .gpu/vllm.part-00): what a training pass allocates against the memory plan's estimate
    # (scripts/gpu/memory_calibrate.py: verl's and the paper's lengths, 4 and 12 layers of the 8B
    # width), and the tiny random model `cluster` and worker_fork_check.py use
    bash infra/gpu-bundle/install.sh >/dev/null
    python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
    timeout 420 python3 scripts/gpu/memory_calibrate.py --json "$OUT/memory_calibrate.json" \
      >"$NODE/calibrate.log" 2>&1
    echo "calibrate exit $? at $(elapsed) s"; grep -a '^{' "$NODE/calibrate.log" || tail -20 "$NODE/calibrate.log" ;;
  fork-check)  # (after `memory` and the vLLM parts, e.g. after cluster-collect) vLLM's engine
    # core forked and spawned in a --cluster local:1 worker: which one starts
    bash infra/gpu-bundle/install.sh >/dev/null
    timeout 400 python3 scripts/gpu/worker_fork_check.py /root/tiny-random fork spawn 2>&1 \
      | grep -a -E "^(fork|spawn):|Error" | tail -6
    echo "fork-check exit ${PIPESTATUS[0]} at $(elapsed) s; GPU memory now: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)" ;;
  cluster-prep)  # the short form of `cluster` on a fresh machine, call 1 of 2 (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00): the tiny random model and
    # the embedded default's problem sets
    bash infra/gpu-bundle/install.sh >/dev/null
    python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
    PREFECT_HOME="$NODE/prefect-ctraj" CUDA_VISIBLE_DEVICES="" python3 -m flows.data \
      --storage /root/runs-ctraj --backend namespace >"$NODE/ctraj-data.log" 2>&1
    echo "data exit $? at $(elapsed) s" ;;
  cluster-traj)  # call 2 of 2 (carry .gpu/vllm.part-01 .gpu/PARTS): the trajectory stage's
    # shards on a Dask worker running vLLM (--cluster local:1 --engine vllm), the GPU traced
    bash infra/gpu-bundle/install.sh; fork_probe
    pid=$(gpu_trace ctraj)
    PREFECT_HOME="$NODE/prefect-ctraj" timeout 480 python3 -m flows.trajectories \
      --storage /root/runs-ctraj --model /root/tiny-random --engine vllm --cluster local:1 \
      --limit 32 --n 4 --turns 1 --max-new-tokens 128 --shard-size 16 --chunk-size 8 \
      --backend namespace >"$OUT/ctraj.log" 2>&1
    echo "[cluster-traj] exit $? at $(elapsed) s"; sleep 2; kill "$pid"
    tr '\r' '\n' <"$OUT/ctraj.log" | grep -a -E "Pass@1|daemonic|spawn|Error|Finished in state" \
      | grep -v errors.html | tail -12
    gpus_used ctraj; echo "GPU memory now: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)" ;;
  cluster|cluster-collect)  # vLLM on a Dask worker on ONE GPU, after pack-collect (vLLM installed):
    # the embedded default through flows.pipeline with every generating stage's shards on a Dask
    # worker (--cluster local:1) running vLLM there (--engine vllm), then training on the GPU the
    # worker gave back; detached by `cluster`, collected by `cluster-collect`
    if [ "$1" = cluster ]; then
      bash infra/gpu-bundle/install.sh  # a fresh machine: call 1 carries .gpu/site-train.tar.xz
      # .gpu/site-core.tar.xz .gpu/vllm.part-00 (`bash infra/gpu-bundle/install.sh`), this one the rest
      [ -f "$NODE/pack-chain.out" ] && wait_for "$NODE/pack-chain.done" 300  # LoRA runs' GPU
      fork_probe
      rm -f "$NODE/cluster.rc"
      setsid nohup bash -c 'nvidia-smi --query-gpu=index,timestamp,memory.used,utilization.gpu \
          --format=csv,noheader,nounits -lms 500 >"$0/cluster.gpus.csv" 2>/dev/null & pid=$!
        PREFECT_HOME="$0/prefect-cluster" timeout 1500 python3 -m flows.pipeline --engine vllm \
          --cluster local:1 --storage /root/runs-cluster --backend namespace \
          >"$0/cluster.log" 2>&1; echo $? >"$0/cluster.rc"; kill $pid' "$NODE" \
        >/dev/null 2>&1 </dev/null &
    fi
    wait_for "$NODE/cluster.rc" 560
    echo "[cluster] exit $(cat "$NODE/cluster.rc" 2>/dev/null || echo "running: collect it with cluster-collect") at $(elapsed) s"
    cp "$NODE/cluster.log" "$NODE/cluster.gpus.csv" "$OUT/" 2>/dev/null
    tr '\r' '\n' <"$NODE/cluster.log" | grep -a -E "engine|daemonic|Pass@1|Error|error|Finished in state" \
      | grep -v errors.html | tail -20
    gpus_used cluster
    PREFECT_HOME="$NODE/prefect-cluster" python3 scripts/gpu/flow_times.py \
      --mem "$OUT/cluster.gpus.csv" --json "$OUT/cluster.stages.json" 2>&1 | tail -14 ;;
  async)  # --async on ONE GPU: the embedded default synchronous, then with --async on
    # the same storage (only training and the evaluation after it run again; the tiny model
    # samples with transformers: a copy of the policy in the background thread); carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz on a fresh machine
    bash infra/gpu-bundle/install.sh >/dev/null
    for run in sync async; do
      flag=(); [ "$run" = async ] && flag=(--async)
      pid=$(gpu_trace "default-$run")
      PREFECT_HOME="$NODE/prefect-default" timeout 330 python3 -m flows.pipeline \
        --storage /root/runs-default --backend namespace "${flag[@]}" >"$OUT/default-$run.log" 2>&1
      echo "[default-$run] exit $? at $(elapsed) s"; kill "$pid"
      tr '\r' '\n' <"$OUT/default-$run.log" | grep -a -E "Pass@1|one step off|Error" \
        | grep -v errors.html | tail -8
    done ;;
  async-lc)  # the learning check's cobalt_async against cobalt, and the vLLM path, on
    # ONE fresh GPU, call 1 of 3 in ONE message (carry .gpu/site-train.tar.xz
    # .gpu/site-core.tar.xz .gpu/vllm.part-00): seeds 0-2 at once, detached (it ends in call 2),
    # the tiny model's data for async-vllm on the CPU beside it
    bash infra/gpu-bundle/install.sh >/dev/null
    lc_start lc-async-a 0,1,2 3 "${LC_DEADLINE_S:-700}"
    tinyv_prep
    wait_for "$NODE/lc-async-a.rc" 585; tail -3 "$NODE/lc-async-a.log" ;;
  async-vllm)  # call 2 of 3 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM installed while the check
    # ends, its outputs collected; then the tiny model with vLLM colocated, sync then --async
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    wait_for "$NODE/lc-async-a.rc" 250; lc_collect lc-async-a
    tinyv_pair ;;
  tinyv)  # the vLLM --async check alone on a fresh GPU, call 1 of 2 (carry .gpu/site-train.tar.xz
    # .gpu/site-core.tar.xz .gpu/vllm.part-00): the tiny model's data
    bash infra/gpu-bundle/install.sh >/dev/null; tinyv_prep ;;
  tinyv-pair)  # call 2 of 2 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM, then the pair
    bash infra/gpu-bundle/install.sh; tinyv_pair ;;
  async-lc2)  # call 3 of 3: seeds 3 and 4 at once, within the call
    lc_start lc-async-b 3,4 2 "${LC_DEADLINE_S:-480}"
    wait_for "$NODE/lc-async-b.rc" 500; lc_collect lc-async-b ;;
  async-prep)  # --async with vLLM on ONE fresh GPU, call 1 of 3 in ONE message (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/vllm.part-00): the tiny random model, the
    # embedded problems and 32 of their turn-0 trajectories (CPU); detached, verl's data (CPU)
    # and the 8B weights
    bash infra/gpu-bundle/install.sh >/dev/null
    rm -f "$NODE/prep.done"; (prep_runs) >"$NODE/prep.log" 2>&1 &
    (build_8b_weights >"$NODE/model.log" 2>&1) &
    tinyv_prep
    wait_for "$NODE/prep.done" 585; [ -f "$NODE/prep.done" ] || tail -5 "$NODE/prep.log" ;;
  async-train)  # call 2 of 3 (carry .gpu/vllm.part-01 .gpu/PARTS): vLLM; the tiny model through
    # flows.training with vLLM colocated, synchronous then --async (8 steps each: the engine
    # generating on a CUDA stream of its own while the trainer trains); the 8B shape's response
    # lengths calibrated; then, detached, verl's shape with LoRA and --share-prompts through
    # flows.training, synchronous then --async (the second only if the tiny --async ran)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    tinyv_pair
    build_8b >"$NODE/model.log" 2>&1; echo "8B shape exit $(cat "$NODE/model.rc") at $(elapsed) s"
    wait_for "$NODE/prep.done" 420; [ -f "$NODE/prep.done" ] || cat "$NODE/prep.log"
    rm -f "$NODE/async-chain.done"
    setsid nohup bash scripts/gpu/node.sh async-chain </dev/null >"$NODE/async-chain.out" 2>&1 &
    wait_for "$NODE/lora-sync.rc" 585; tail -3 "$NODE/async-chain.out" ;;
  async-chain)  # (detached by async-train) the two runs one after the other
    lora_args; fresh_runs sync async
    GPUS=1 SHARDING=ddp train lora-sync /root/runs-verl-sync "${lora[@]}"
    if [ "$(cat "$NODE/tinyv-async.rc" 2>/dev/null)" = 0 ]; then  # the vLLM path ran small
      GPUS=1 SHARDING=ddp train lora-async /root/runs-verl-async "${lora[@]}" --async
    else echo "skipped: the tiny model's vLLM run one step off failed" >"$NODE/lora-async.log"
      echo 1 >"$NODE/lora-async.rc"; fi
    touch "$NODE/async-chain.done" ;;
  async-collect)  # call 3 of 3: both runs' step reports (waits for them within the call)
    for run in sync:200 async:560; do
      wait_for "$NODE/lora-${run%:*}.rc" "${run#*:}"
      GPUS=1 report "lora-${run%:*}" "/root/runs-verl-${run%:*}" 1544 "verl (published, 8x H100)"
    done ;;
  c)
    bash infra/gpu-bundle/install.sh
    ROLLOUT_TIMEOUT_S=330 bash scripts/gpu/worker.sh rollout-gpus --problems 128 \
      --gpu-memory-utilization 0.85
    [ "$(elapsed)" -lt 300 ] && PIPELINE_TAG=pipeline-vllm timeout $(( 560 - $(elapsed) )) \
      bash scripts/gpu/worker.sh pipeline ;;
  scaling|scaling4)  # item 5: verl's shape with LoRA (ddp) on 1 and 2 GPUs at once, then on 4
    verl_sampling
    echo '{"training": {"max_prompt_length": 512, "lora": {}}}' >"$NODE/lora.json"
    lora=(--config "$NODE/lora.json" --set num_generations=5 \
      --set "max_completion_length=$CAP" --set generation_batch_size=320 \
      --set "generation_kwargs=$KWARGS")
    if [ "$1" = scaling ]; then
      CUDA_VISIBLE_DEVICES=0 GPUS=1 SHARDING=ddp train lora1 /root/runs-verl-1 "${lora[@]}" &
      CUDA_VISIBLE_DEVICES=1,2 GPUS=2 SHARDING=ddp train lora2 /root/runs-verl-2 "${lora[@]}" &
      CUDA_VISIBLE_DEVICES=3 python3 scripts/gpu/seed_check.py /root/tiny-random \
        --json "$OUT/seed_check.json" >"$NODE/seed_check.log" 2>&1 &
      wait; tail -c 1500 "$NODE/seed_check.log"
      for g in 1 2; do GPUS=$g report "lora$g" "/root/runs-verl-$g"; done
    else
      GPUS=4 SHARDING=ddp train lora4 /root/runs-verl-4 "${lora[@]}"
      GPUS=4 report lora4 /root/runs-verl-4
    fi ;;
  rollouts|rollouts4)  # item 4, second round: 4x the work (four calls of 1,024 conversations on
    # 4 GPUs), one GPU through the same `vllm serve` (the server's own overhead apart from the
    # scaling); a call each (~2 min of start-up, ~2.5 min of generation on 1 GPU). Meanwhile in
    # `rollouts`, on GPUs 1-3: the embedded default as a user runs it (vLLM installed),
    # with its generation on the CPU, and under py-spy (carry .whl: py-spy's wheel)
    gpus=1 more=(); [ "$1" = rollouts4 ] && gpus=all more=(--baseline /root/rollout-gpus/last.json)
    if [ "$1" = rollouts ]; then
      export CUDA_VISIBLE_DEVICES=0
      host_run 1 pipeline-default & host_run 2 pipeline-cpu --device cpu &
      PIPELINE_PROFILE=1 host_run 3 pipeline-profile &
    fi
    ROLLOUT_TIMEOUT_S=560 bash scripts/gpu/worker.sh rollout-gpus --gpus "$gpus" --serve-one \
      --problems 512 --gpu-memory-utilization 0.85 "${more[@]}"
    wait ;;
  fp8)  # fp8 generation on ONE fresh GPU, call 1 of 4 in ONE message (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz; then `bash infra/gpu-bundle/install.sh`
    # carrying .gpu/vllm.part-00 .gpu/vllm.part-02 .gpu/PARTS: with the repository's 10 MB a call
    # holds two parts of three at most): the 8B weights; detached
    # beside them, the embedded default with --async (no vLLM yet: transformers samples from a
    # copy, each batch sampled ahead judged ahead: its summary counts them), collected by fp8-gen
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    rm -f "$NODE/default-async.rc"
    setsid nohup bash -c "PREFECT_HOME=$NODE/prefect-default timeout 900 python3 -m flows.pipeline \
      --storage /root/runs-default --backend namespace --async >$NODE/default-async.log 2>&1
      echo \$? >$NODE/default-async.rc" </dev/null >/dev/null 2>&1 &
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s" ;;
  fp8-gen)  # call 3 of 4 (carry .gpu/vllm.part-01): vLLM; the 8B shape calibrated to
    # responses of mean ~200 (cap 1,024) and ~1,000 (cap 4,096); then, detached,
    # scripts/gpu/fp8_generation.py: the stage's server in bf16, then in fp8, verl's split batch
    # (270 prompts x 5) and NeMo-RL's (64 x 32) on the one GPU; this call reports the default
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu/eos_calibrate.py "$MODEL" --mean 1000 --cap 4096 \
      >>"$NODE/model.log" 2>&1 && cp "$MODEL/eos_calibration.json" "$MODEL/eos_calibration_1000.json"
    build_8b >>"$NODE/model.log" 2>&1
    echo "calibrated (1,000, then 200): exit $(cat "$NODE/model.rc") at $(elapsed) s"
    tail -1 "$NODE/model.log"
    rm -f "$NODE/fp8.rc"
    setsid nohup bash -c "timeout 1500 python3 scripts/gpu/fp8_generation.py $MODEL \
      --shape verl:270:5:147:1024:$MODEL/eos_calibration.json \
      --shape nemo:64:32:147:4096:$MODEL/eos_calibration_1000.json --json /root/fp8.json \
      >$NODE/fp8.log 2>&1; echo \$? >$NODE/fp8.rc" </dev/null >/dev/null 2>&1 &
    wait_for "$NODE/default-async.rc" 420; echo "[default-async] exit $(cat "$NODE/default-async.rc" 2>/dev/null)"
    cp "$NODE/default-async.log" "$OUT/" 2>/dev/null
    tr '\r' '\n' <"$NODE/default-async.log" | grep -a -E "Pass@1|one step off|judged|Error" \
      | grep -v errors.html | tail -8
    tail -3 "$NODE/fp8.log" ;;
  fp8-collect)  # call 4 of 4: the comparison's JSON and log
    wait_for "$NODE/fp8.rc" 585; echo "fp8_generation exit $(cat "$NODE/fp8.rc" 2>/dev/null)"
    cp /root/fp8.json "$NODE/fp8.log" "$OUT/" 2>/dev/null; tail -12 "$NODE/fp8.log" ;;
  mem-shared)  # shared-prompt memory on ONE fresh GPU, call 1 of 4 in ONE message (MEM_SHARED=0:
    # the fitted model alone, for fp8-rewards; carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz .gpu/fitted, the embedded default's fitted
    # model: `python -c 'import cobalt.reference as r; r.fit_embedded(".gpu/fitted")'`; call 2
    # `bash infra/gpu-bundle/install.sh` carrying .gpu/site-remote.tar.xz .gpu/vllm.part-02
    # .gpu/PARTS; call 3 the same carrying .gpu/vllm.part-00; call 4 `fp8-rewards` carrying
    # .gpu/vllm.part-01): what a micro-batch of --share-prompts allocates at the paper's lengths
    # against the memory plan (memory_calibrate.py --shared)
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    rm -rf /root/fitted; cp -r .gpu/fitted /root/fitted
    [ "${MEM_SHARED:-1}" = 0 ] && exit 0
    timeout 480 python3 scripts/gpu/memory_calibrate.py --shared --cases 9897:6144:1,2,4,8,16 \
      --json "$OUT/memory_calibrate_shared.json" >"$NODE/calibrate-shared.log" 2>&1
    echo "calibrate --shared exit $? at $(elapsed) s"
    grep -a '^{' "$NODE/calibrate-shared.log" || tail -20 "$NODE/calibrate-shared.log" ;;
  fp8-rewards)  # call 4 of 4 (carry .gpu/vllm.part-01): vLLM; the fitted model served by
    # `vllm serve` in bf16, then with --quantization fp8 (what a user's server for
    # --fp8-generation runs), each evaluated through the product's trajectories flow (the
    # pipeline's evaluation protocol and tiny preset on the embedded default's test problems, 32
    # samples a problem, LiteLLM to the server)
    # (PRECISIONS="bf16" then "fp8": one a call, where two in one call ran 593 of its 600 s;
    # PRECISIONS=fp8-kv: the KV cache in fp8, what a user's server for --fp8-kv-cache runs;
    # PRECISIONS="bf16 fp8-kv" SEEDS=0: both on one machine and one fitted model within a call)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm, litellm; print("vllm", vllm.__version__)'
    for q in ${PRECISIONS:-bf16 fp8}; do
      quant=(); [ "$q" = fp8 ] && quant=(--quantization fp8)
      [ "$q" = fp8-kv ] && quant=(--kv-cache-dtype fp8)  # --fp8-kv-cache's server
      # INFO: the server names its attention backend and its KV cache's size in the call's output
      VLLM_LOGGING_LEVEL=INFO setsid python3 -m vllm.entrypoints.openai.api_server --model /root/fitted --port 8100 \
        --served-model-name "fitted-$q" --dtype bfloat16 --max-model-len 2048 --enforce-eager \
        --gpu-memory-utilization 0.3 --seed 0 "${quant[@]}" >"$NODE/serve-$q.log" 2>&1 </dev/null &
      server=$!
      until python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8100/health", timeout=2)' \
        2>/dev/null || [ "$(elapsed)" -gt 400 ] || ! kill -0 "$server" 2>/dev/null; do sleep 3; done
      if ! kill -0 "$server" 2>/dev/null; then
        echo "[serve $q] exited at $(elapsed) s:"; tail -5 "$NODE/serve-$q.log"; cp "$NODE/serve-$q.log" "$OUT/"; break
      fi
      echo "[serve $q] up at $(elapsed) s"
      grep -a -i -E "quantiz|fp8|error|backend|kv cache" "$NODE/serve-$q.log" | sed -E 's/^.*\] //' | head -12
      for seed in ${SEEDS:-0 1}; do  # two sampling seeds a precision: the yardstick of sampling noise
        PREFECT_HOME="$NODE/prefect-fp8r" timeout 200 python3 -m flows.trajectories \
          --storage /root/runs-fp8r --backend namespace --evaluation --preset tiny --n 32 \
          --seed "$seed" --problems samples/synthetic_test.jsonl:taco --engine litellm \
          --model "openai/fitted-$q" --api-base http://127.0.0.1:8100/v1 --llm-concurrency 64 \
          >"$NODE/eval-$q-$seed.log" 2>&1
        echo "[evaluation $q seed $seed] exit $? at $(elapsed) s"
        tr '\r' '\n' <"$NODE/eval-$q-$seed.log" | grep -a -E "^trajectories|^\| all|Error" | tail -5
        cp "$NODE/eval-$q-$seed.log" "$OUT/"
      done
      kill -- -"$server" 2>/dev/null; wait "$server" 2>/dev/null; cp "$NODE/serve-$q.log" "$OUT/"
    done ;;
  tiny-server)  # call 4 of 4 after mem-shared (MEM_SHARED=0) and the two install calls (carry
    # .gpu/vllm.part-01): the training stage's own vLLM server (`generation_server`, as
    # --vllm-server-gpus starts it) with the tiny default's model, bf16 then fp8, on GPU 0: how
    # long it takes to answer, and TRL's client's batch from it (the split needs a second GPU
    # for the trainer: NCCL refuses two ranks on one GPU)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
    # MODELS (default both), BOUND (s a model, default 250): on 2026-12-02 the tiny model's bf16
    # server answered after 135 s, its fp8 one not within the 250 s; the fitted model's then
    # found the GPU still held by it (a script killed by `timeout` leaves its server to end on
    # its parent's death), hence the wait for a free GPU between models
    for model in ${MODELS:-tiny-random fitted}; do
      [ "$(elapsed)" -gt 330 ] && { echo "[$model] skipped: $(elapsed) s gone"; continue; }
      until [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] || \
        [ "$(elapsed)" -gt 560 ]; do sleep 2; done
      timeout "${BOUND:-250}" python3 scripts/gpu/fp8_generation.py "/root/$model" --rows 64 \
        --shape "batch:64:8:64:24:ignore-eos" --json "$OUT/server_$model.json" \
        >"$NODE/server-$model.log" 2>&1
      echo "[$model] exit $? at $(elapsed) s"; grep -a -E "server up|^bf16 batch \{|^fp8 batch \{|fp8 / bf16|failed" \
        "$NODE/server-$model.log" | cut -c1-300; cp "$NODE/server-$model.log" "$OUT/"
    done ;;
  tiny-fp8)  # ONE fresh GPU, call 3 of 3 in ONE message (call 1 `bash infra/gpu-bundle/install.sh`
    # carrying .gpu/site-train.tar.xz .gpu/site-core.tar.xz; call 2 the same carrying
    # .gpu/vllm.part-00 .gpu/vllm.part-02 .gpu/PARTS; this one carrying .gpu/vllm.part-01): the
    # tiny model's own server in fp8 as the machine's first vLLM start (its start did not end
    # within ~110 s on 2026-12-02), then in bf16 as the second; each server's log kept (vLLM's
    # own account of where its start goes at INFO, which device-env.sh lowers to WARNING)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
    VLLM_LOGGING_LEVEL=INFO timeout 540 python3 scripts/gpu/fp8_generation.py /root/tiny-random \
      --precisions fp8 bf16 \
      --shape "batch:64:8:64:24:ignore-eos" --json "$OUT/server_tiny_fp8.json" \
      --log-dir "$OUT/server-logs" >"$OUT/tiny-fp8.log" 2>&1
    echo "exit $? at $(elapsed) s"; grep -a -E "server up|batch \{|failed" "$OUT/tiny-fp8.log" | cut -c1-300
    for q in fp8 bf16; do  # vLLM's start, step by step, with its clock
      grep -a -h -E "took|seconds|Loading|compile|graph|KV cache|Starting|startup|Error" \
        "$OUT/server-logs/$q/vllm-server.log" 2>/dev/null | cut -c1-220 | head -30
    done ;;
  gen-paper)  # goal 3's generation on ONE fresh GPU, call 3 of 4 in ONE message (call 1
    # `bash infra/gpu-bundle/install.sh` carrying .gpu/site-train.tar.xz .gpu/site-core.tar.xz;
    # call 2 the same carrying .gpu/vllm.part-00 .gpu/vllm.part-02 .gpu/PARTS; this one carrying
    # .gpu/vllm.part-01; call 4 `gen-paper-collect`): the 8B shape's weights, then, detached, the
    # stage's server (as --vllm-server-gpus starts it, the whole GPU) at the paper's lengths
    # (~9,900-token prompts, 16 samples of 6,144 tokens each) with 1, 8, 4 and 2 prompts a batch
    # in bf16 (16 to 128 sequences decoding at once: what one server GPU of a split generates a
    # step), then 8 prompts in fp8; vLLM at INFO, its logs kept (its KV cache, where its start
    # goes). GEN_KV=1: the KV cache in fp8 (--fp8-kv-cache) with 1 and 8 prompts, then bf16's 1
    # again on the same machine (bf16's 8 measured 2026-12-02: 326.2 s)
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"
    rm -f "$NODE"/gen-paper*.rc
    setsid nohup bash scripts/gpu/node.sh gen-paper-chain </dev/null >"$NODE/gen-paper.out" 2>&1 &
    wait_for "$NODE/gen-paper-first.rc" 585
    echo "first exit $(cat "$NODE/gen-paper-first.rc" 2>/dev/null || echo running) at $(elapsed) s"
    grep -a -h -E "server up|\{|failed" "$NODE"/gen-paper-*.log | cut -c1-400 ;;
  gen-kv-quick)  # call 3 of 3 on a fresh GPU with little device time (carry .gpu/vllm.part-01,
    # after the two install calls): the 8B weights, then the stage's server with its KV cache in
    # fp8 (--fp8-kv-cache) for one batch of 1 x 16 at the paper's lengths (bf16's: 65.5 s on
    # 2026-12-02), its log in $OUT as it goes: whether the bundle's vLLM runs an fp8 KV cache,
    # the tokens it caches, and the batch's time if the call lasts
    bash infra/gpu-bundle/install.sh >/dev/null
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"
    VLLM_LOGGING_LEVEL=INFO timeout "${BOUND:-220}" python3 scripts/gpu/fp8_generation.py "$MODEL" \
      --rows 0 --precisions fp8-kv --shape p16:1:16:9900:6144:ignore-eos \
      --json "$OUT/gen_kv_quick.json" --log-dir "$OUT/server-logs" >"$OUT/gen-kv-quick.log" 2>&1
    echo "exit $? at $(elapsed) s"; grep -a -E "server up|\{|failed" "$OUT/gen-kv-quick.log" | cut -c1-400
    grep -a -h -E "KV cache|concurrency|took|Error|fp8" "$OUT/server-logs/fp8-kv/vllm-server.log" \
      2>/dev/null | grep -v loggers.py | cut -c1-220 | head -20 ;;
  gen-paper-chain)  # (detached by gen-paper) the first server's batches, then the second's
    p16=p16:1:16:9900:6144:ignore-eos p128=p128:8:16:9900:6144:ignore-eos
    if [ "${GEN_KV:-0}" = 1 ]; then
      first=(fp8-kv --shape "$p16" --shape "$p128") second=(bf16 --shape "$p16")
    else
      first=(bf16 --shape "$p16" --shape "$p128" --shape p64:4:16:9900:6144:ignore-eos
        --shape p32:2:16:9900:6144:ignore-eos) second=(fp8 --shape "$p128")
    fi
    VLLM_LOGGING_LEVEL=INFO timeout 1100 python3 scripts/gpu/fp8_generation.py "$MODEL" \
      --rows 0 --precisions "${first[@]}" --json "/root/gen-paper-${first[0]}.json" \
      --log-dir /root/gen-paper-logs >"$NODE/gen-paper-${first[0]}.log" 2>&1
    echo $? >"$NODE/gen-paper-first.rc"
    VLLM_LOGGING_LEVEL=INFO timeout 600 python3 scripts/gpu/fp8_generation.py "$MODEL" \
      --rows 0 --precisions "${second[@]}" --json "/root/gen-paper-${second[0]}.json" \
      --log-dir /root/gen-paper-logs >"$NODE/gen-paper-${second[0]}.log" 2>&1
    echo $? >"$NODE/gen-paper.rc" ;;
  gen-paper-collect)  # call 4 of 4: both JSONs, the logs, the servers' start and KV cache lines
    wait_for "$NODE/gen-paper.rc" 585
    echo "first exit $(cat "$NODE/gen-paper-first.rc" 2>/dev/null), second exit $(cat "$NODE/gen-paper.rc" 2>/dev/null || echo running) at $(elapsed) s"
    cp /root/gen-paper-*.json "$NODE"/gen-paper-*.log "$OUT/" 2>/dev/null
    grep -a -h -E "server up|\{|failed" "$NODE"/gen-paper-*.log | cut -c1-400
    for q in bf16 fp8 fp8-kv; do  # vLLM's start and its KV cache, with its clock
      [ -f "/root/gen-paper-logs/$q/vllm-server.log" ] || continue
      tail -c 200000 "/root/gen-paper-logs/$q/vllm-server.log" >"$OUT/vllm-server-$q.log"
      grep -a -h -E "took|seconds|KV cache|concurrency|Starting|Error" \
        "/root/gen-paper-logs/$q/vllm-server.log" | grep -v loggers.py | cut -c1-220 | head -30
    done ;;
  g4-paper)  # goal 3 (the paper's lengths) on a 4-GPU machine after `g4`, the install
    # call and `g4-nemo`'s vLLM (or `fp8-gen`'s on its machine): 16 problems of ~9,600-token
    # statements, 8 prompts x 16 samples a step (128 completions: 32 a GPU, where the measured
    # 831 tokens/s/GPU decoded 4 a GPU), every response 6,144 tokens; detached, --share-prompts
    # (the plan now counts a micro-batch's prompt once) then the trimmed default, 2 steps each
    python3 scripts/gpu/long_problems.py --tokens 9600 --count 16 --out /root/long16.jsonl
    (prep paper16 /root/long16.jsonl); rm -f "$NODE/paper-shared.rc" "$NODE/paper-trimmed.rc"
    setsid nohup bash scripts/gpu/node.sh g4-paper-chain </dev/null >"$NODE/g4-paper.out" 2>&1 &
    wait_for "$NODE/paper-shared.rc" 585
    GPUS=4 report paper-shared /root/runs-paper16-shared 831 "this project, 2026-11-27 (4x H100)" ;;
  g4-paper-chain)  # (detached by g4-paper) each run bounded in time
    for run in shared trimmed; do rm -rf "/root/runs-paper16-$run"; cp -r /root/runs-paper16 \
      "/root/runs-paper16-$run"; done
    paper=(--max-prompt-tokens 10240 --set generation_batch_size=128 --max-steps 2
      --set 'generation_kwargs={"ignore_eos": true}')
    TRAIN_TIMEOUT=900 train paper-shared /root/runs-paper16-shared "${paper[@]}" --share-prompts
    TRAIN_TIMEOUT=900 train paper-trimmed /root/runs-paper16-trimmed "${paper[@]}" ;;
  g4-paper-collect)  # the next call: the trimmed run's report
    wait_for "$NODE/paper-trimmed.rc" 585
    GPUS=4 report paper-trimmed /root/runs-paper16-trimmed 831 "this project, 2026-11-27 (4x H100)" ;;
  paper1)  # goal 3's passes on ONE fresh GPU, call 1 of 4 in ONE message (carry
    # .gpu/site-train.tar.xz .gpu/site-core.tar.xz; call 2 `bash infra/gpu-bundle/install.sh`
    # carrying .gpu/vllm.part-00 .gpu/vllm.part-02 .gpu/PARTS; call 3 `paper1-train` carrying
    # .gpu/vllm.part-01; call 4 `paper1-collect`): the 8B shape's weights; the paper set's data
    # (4 problems of ~9,600-token statements) on the CPU
    bash infra/gpu-bundle/install.sh >/dev/null
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
    (python3 -c 'from engines.tiny import build_tiny_model as b; b("/root/tiny-random", seed=0)'
     python3 scripts/gpu/long_problems.py --tokens 9600 --count 4 --out /root/long.jsonl
     prep paper /root/long.jsonl; touch "$NODE/paper1-prep.done") >"$NODE/paper1-prep.log" 2>&1 &
    build_8b_weights >"$NODE/model.log" 2>&1; echo "8B weights exit $? at $(elapsed) s"
    wait_for "$NODE/paper1-prep.done" 400; tail -3 "$NODE/paper1-prep.log" ;;
  paper1-train)  # call 3 of 4 (carry .gpu/vllm.part-01): vLLM; then, detached, the paper
    # preset at its lengths with LoRA on the one GPU through flows.training (vLLM colocated, 1
    # prompt x 16 samples a step, every response 6,144 tokens): --share-prompts, then the
    # trimmed default; this call waits for the first
    bash infra/gpu-bundle/install.sh; python3 -c 'import vllm; print("vllm", vllm.__version__)'
    rm -f "$NODE/paper1-shared.rc" "$NODE/paper1-trimmed.rc"
    setsid nohup bash scripts/gpu/node.sh paper1-chain </dev/null >"$NODE/paper1-chain.out" 2>&1 &
    wait_for "$NODE/paper1-shared.rc" 585
    GPUS=1 report paper1-shared /root/runs-paper-shared ;;  # LoRA on 1 GPU: no peer of its own
  paper1-chain)  # (detached by paper1-train) each run bounded in time
    echo '{"training": {"lora": {}}}' >"$NODE/lora-paper.json"
    for run in shared trimmed; do rm -rf "/root/runs-paper-$run"; cp -r /root/runs-paper \
      "/root/runs-paper-$run"; done
    paper=(--config "$NODE/lora-paper.json" --max-prompt-tokens 10240 --max-steps 2
      --set generation_batch_size=16 --set 'generation_kwargs={"ignore_eos": true}')
    GPUS=1 SHARDING=ddp TRAIN_TIMEOUT=560 train paper1-shared /root/runs-paper-shared \
      "${paper[@]}" --share-prompts
    GPUS=1 SHARDING=ddp TRAIN_TIMEOUT=560 train paper1-trimmed /root/runs-paper-trimmed "${paper[@]}" ;;
  paper1-collect)  # call 4 of 4: the trimmed run's report
    wait_for "$NODE/paper1-trimmed.rc" 585
    GPUS=1 report paper1-trimmed /root/runs-paper-trimmed ;;
  paper)  # 1 prompt x 16 samples a step, every response 6,144 tokens (no end-of-turn)
    train paper /root/runs-paper --max-prompt-tokens 10240 --set generation_batch_size=16 \
      --set 'generation_kwargs={"ignore_eos": true}'
    report paper /root/runs-paper ;;
  *) echo "usage: bash scripts/gpu/node.sh goal1|goal1-train|goal1-collect|a|b|linear|pack|pack-train|pack-collect|c|scaling|scaling4|rollouts|rollouts4|paper|parity|fsdp-fp32|hybrid|cost-hybrid|vllm|default4|pipeline8b|pipeline8b-collect|nodes|nodes-collect"; exit 2 ;;
esac
echo "node.sh $1 done at $(elapsed) s"
