# Sourced by scripts/gpu/pair.sh and scan_and_steps.sh: run_step GPU CPUS "STEP ARGS..." runs one
# worker.sh step on one card and a taskset CPU list (e.g. 0-15); its files land in $OUT/<tag>/ and
# are packed into $OUT/<tag>.tgz (a call brings back few files). STEP_TIMEOUT_S (default 560)
# stops a step that would outlive the call; PAIR_WORKER (default scripts/gpu/worker.sh) is the
# script each step runs.
run_step() {
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
