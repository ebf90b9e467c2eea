#!/usr/bin/env bash
# Screenshots of the Prefect UI for a flow run, for the docs.
#
#   scripts/ui_screenshot.sh OUT.png -- COMMAND [ARG...]
#   scripts/ui_screenshot.sh docs/img/prefect-ui-data-run.png -- \
#       .venv/bin/python -m flows.data --storage /tmp/x --backend namespace
#
# 1. starts a real `prefect server start` (UI included, no scheduler) on a free port of
#    127.0.0.1, with a throwaway PREFECT_HOME (SQLite) and no PREFECT_* variable inherited, as
#    tests/deploy/test_deployment.py does;
# 2. runs COMMAND against it (PREFECT_API_URL set, in the current directory); its output goes
#    to the terminal; a failing COMMAND still gets its screenshots, and its exit status is the
#    script's;
# 3. finds the newest started top-level flow run through the API (POST /api/flow_runs/filter) and takes
#    PNG screenshots with a headless Chromium:
#      OUT.png                    the flow run page, /runs/flow-run/<id> (run graph + logs)
#      OUT-artifacts.png          its Artifacts tab, /v2/runs/flow-run/<id>?tab=Artifacts (the
#                                 V2 UI: the V1 UI drops ?tab=Artifacts while the run loads)
#      OUT-artifact-<key>.png     each keyed artifact of the run, /artifacts/artifact/<id>
#      OUT-deployments.png        /deployments, only when COMMAND created a deployment
#    (OUT-*.png: OUT without its .png suffix);
# 4. stops the server and removes the temporary PREFECT_HOME.
#
# Browser: the first of $BROWSER, chromium-headless-shell, chromium, chromium-browser,
# google-chrome found on PATH; if none and we are root with apt-get, it installs Debian's
# `chromium-headless-shell` (then `chromium`); otherwise it stops with a message saying what
# to install. As root Chromium needs --no-sandbox, which is added then.
#
# Environment knobs: PYTHON (default .venv/bin/python of this repository, else python3),
# WINDOW_SIZE (default 1400,900), TIME_BUDGET_MS (virtual time the page gets to render,
# default 15000), KEEP_HOME=1 (keep the temporary PREFECT_HOME and server log, path printed).
# Screenshots above 300 KB get a warning (keep docs images small).
set -euo pipefail

usage() {
    sed -n '3,6p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[[ $# -ge 3 && $2 == "--" ]] || usage
OUT=$1
shift 2
[[ $OUT == *.png ]] || { echo "ui_screenshot: OUT must end in .png: $OUT" >&2; exit 2; }
BASE=${OUT%.png}
mkdir -p "$(dirname "$OUT")"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $REPO/.venv/bin/python ]]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
WINDOW_SIZE=${WINDOW_SIZE:-1400,900}
TIME_BUDGET_MS=${TIME_BUDGET_MS:-15000}

log() { echo "ui_screenshot: $*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- browser
find_browser() {
    local b
    for b in ${BROWSER:-} chromium-headless-shell chromium chromium-browser google-chrome; do
        if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return 0; fi
    done
    return 1
}

if ! BROWSER_BIN=$(find_browser); then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "no headless Chromium found; installing chromium-headless-shell with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 || true
        apt-get install -y -qq --no-install-recommends chromium-headless-shell >&2 \
            || apt-get install -y -qq --no-install-recommends chromium >&2 \
            || die "apt-get could not install chromium-headless-shell nor chromium"
        BROWSER_BIN=$(find_browser) || die "installed, but no Chromium binary on PATH"
    else
        die "no headless Chromium on PATH. Install one (Debian/Ubuntu: sudo apt-get install
    chromium-headless-shell, or chromium) or set BROWSER=/path/to/chrome, then rerun."
    fi
fi
BROWSER_ARGS=(--headless --hide-scrollbars --no-first-run --mute-audio
    "--window-size=$WINDOW_SIZE" "--virtual-time-budget=$TIME_BUDGET_MS")
# chromium-headless-shell is headless only and takes no --headless value; chromium wants "new"
[[ $(basename "$BROWSER_BIN") == chromium-headless-shell ]] || BROWSER_ARGS[0]=--headless=new
[[ $EUID -ne 0 ]] || BROWSER_ARGS+=(--no-sandbox)
log "browser: $BROWSER_BIN ($("$BROWSER_BIN" --version 2>/dev/null | head -1))"

# ---------------------------------------------------------------- server
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
UI=http://127.0.0.1:$PORT
API=$UI/api
HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ui-screenshot.XXXXXX")
SERVER_PID=

# a clean Prefect environment: nothing from the caller's profile or PREFECT_* variables
while IFS= read -r name; do unset "$name"; done < <(env | sed -n 's/^\(PREFECT_[A-Za-z0-9_]*\)=.*/\1/p')
export PREFECT_HOME=$HOME_DIR/prefect-home
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 PREFECT_CLI_PROMPT=false
export PREFECT_SERVER_UI_API_URL=$API   # what the UI's JS calls (default: port 4200)
export PREFECT_UI_URL=$UI               # links printed in the flow's logs

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
    if [[ ${KEEP_HOME:-0} == 1 ]]; then log "kept $HOME_DIR"; else rm -rf "$HOME_DIR"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "prefect server on $UI (PREFECT_HOME $PREFECT_HOME)"
# its own process group (setsid), so cleanup stops the server and its children, nothing else
setsid "$PYTHON" -m prefect server start --host 127.0.0.1 --port "$PORT" --no-scheduler \
    >"$HOME_DIR/server.log" 2>&1 </dev/null &
SERVER_PID=$!
for i in $(seq 180); do
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -40 "$HOME_DIR/server.log" >&2; die "the server exited"; }
    "$PYTHON" - "$API/health" <<'EOF' 2>/dev/null && break
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2).read()
EOF
    [[ $i -lt 180 ]] || { tail -40 "$HOME_DIR/server.log" >&2; die "no $API/health after 90 s"; }
    sleep 0.5
done

# ---------------------------------------------------------------- the command
log "running: $*"
export PREFECT_API_URL=$API
set +e
"$@"
CMD_RC=$?
set -e
[[ $CMD_RC -eq 0 ]] || log "the command exited with $CMD_RC; taking the screenshots anyway"

# ---------------------------------------------------------------- what to shoot
# prints: RUN <id> <name> <state> / ARTIFACT <id> <key> / DEPLOYMENTS <count>
TARGETS=$("$PYTHON" - "$API" <<'EOF'
import json, sys, urllib.request

api = sys.argv[1]

def post(path, body):
    req = urllib.request.Request(api + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)

runs = post("/flow_runs/filter", {
    # the newest top-level run (a flow run of the command, not one of its subflow runs)
    "flow_runs": {"start_time": {"is_null_": False},
                  "parent_task_run_id": {"is_null_": True}},
    "sort": "START_TIME_DESC", "limit": 1,
})
if not runs:
    sys.exit("no started flow run on the server: did the command run a flow against it?")
run = runs[0]
print("RUN", run["id"], run["name"], run.get("state_type"))
artifacts = post("/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
for a in artifacts:
    if a.get("key"):
        print("ARTIFACT", a["id"], a["key"])
print("DEPLOYMENTS", len(post("/deployments/filter", {"limit": 10})))
EOF
)
read -r _ RUN_ID RUN_NAME RUN_STATE <<<"$(grep '^RUN ' <<<"$TARGETS")"
log "newest flow run: $RUN_NAME ($RUN_ID), $RUN_STATE"

SHOTS=()
shoot() {  # shoot URL FILE
    local url=$1 file=$2 tmp
    tmp=$(mktemp "$HOME_DIR/shot.XXXXXX.png")
    if ! "$BROWSER_BIN" "${BROWSER_ARGS[@]}" "--screenshot=$tmp" "$url" \
            >"$HOME_DIR/browser.log" 2>&1 </dev/null || [[ ! -s $tmp ]]; then
        tail -20 "$HOME_DIR/browser.log" >&2
        die "no screenshot of $url"
    fi
    mv -f "$tmp" "$file"
    chmod 644 "$file"
    SHOTS+=("$file")
    log "$file <- $url"
}

# the SPA must have rendered the run, not just its loading shell: its name is in the DOM
"$BROWSER_BIN" "${BROWSER_ARGS[@]}" --dump-dom "$UI/runs/flow-run/$RUN_ID" \
    >"$HOME_DIR/dom.html" 2>"$HOME_DIR/browser.log" </dev/null || true
grep -qF -- "$RUN_NAME" "$HOME_DIR/dom.html" \
    || log "WARNING: the flow run page did not render '$RUN_NAME' within ${TIME_BUDGET_MS} ms of virtual time; raise TIME_BUDGET_MS and check the PNGs"

shoot "$UI/runs/flow-run/$RUN_ID" "$OUT"
if grep -q '^ARTIFACT ' <<<"$TARGETS"; then
    shoot "$UI/v2/runs/flow-run/$RUN_ID?tab=Artifacts" "$BASE-artifacts.png"
    while read -r _ art_id art_key; do
        shoot "$UI/artifacts/artifact/$art_id" "$BASE-artifact-${art_key//[^A-Za-z0-9_.-]/_}.png"
    done < <(grep '^ARTIFACT ' <<<"$TARGETS")
fi
if [[ $(sed -n 's/^DEPLOYMENTS //p' <<<"$TARGETS") -gt 0 ]]; then
    shoot "$UI/deployments" "$BASE-deployments.png"
fi

for f in "${SHOTS[@]}"; do
    size=$(stat -c %s "$f")
    [[ $size -le 307200 ]] || log "WARNING: $f is $((size / 1024)) KB (> 300 KB); try a smaller WINDOW_SIZE"
done
exit "$CMD_RC"
