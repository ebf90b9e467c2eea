#!/usr/bin/env bash
# Install and start a Docker engine (docker.io from Debian) on a root-only,
# systemd-less Debian bookworm machine. Idempotent: exits 0 at once when
# `docker info` already works.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
WAIT_SECS="${DOCKERD_WAIT_SECS:-60}"

if docker info >/dev/null 2>&1; then
    echo "install-engine: docker engine already up"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-engine: must run as root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive

# Install docker.io only when the binaries are missing; refresh the apt
# index first only if it has never been fetched or the install fails without it.
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
        apt-get update -q
    fi
    if ! apt-get install -y -q --no-install-recommends docker.io; then
        apt-get update -q
        apt-get install -y -q --no-install-recommends docker.io
    fi
fi

# Start dockerd directly (no systemd/service) unless one is already running
# (e.g. still starting up); its socket is the default /var/run/docker.sock.
dockerd_running() {
    local c
    for c in /proc/[0-9]*/comm; do
        [ "$(cat "$c" 2>/dev/null)" = dockerd ] && return 0
    done
    return 1
}
if ! dockerd_running; then
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    echo "install-engine: starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
fi

# Wait until the daemon answers.
for _ in $(seq "$WAIT_SECS"); do
    if docker info >/dev/null 2>&1; then
        echo "install-engine: docker engine up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
        exit 0
    fi
    sleep 1
done

echo "install-engine: ERROR: dockerd did not come up within ${WAIT_SECS}s; last log lines:" >&2
tail -n 40 "$DOCKERD_LOG" >&2 2>/dev/null || echo "(no log at $DOCKERD_LOG)" >&2
exit 1
