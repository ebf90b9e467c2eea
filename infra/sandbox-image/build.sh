#!/usr/bin/env bash
# Build the sandbox image (default tag cobalt-sandbox:bookworm) without any
# image registry: debootstrap a minimal Debian bookworm rootfs with python3
# from the host's Debian mirror, strip it, and `docker import` it.
#
# Caching: the recipe hash is the sha256 of this script.
#   - image already tagged with LABEL cobalt.sandbox.recipe=<hash> -> exit 0
#   - rootfs tarball $CACHE_DIR/rootfs-<hash>.tar present -> skip debootstrap
# Env: COBALT_SANDBOX_IMAGE (tag), COBALT_CACHE (cache root).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
IMAGE="${COBALT_SANDBOX_IMAGE:-cobalt-sandbox:bookworm}"
CACHE_DIR="${COBALT_CACHE:-$HOME/.cache/cobalt}/sandbox-image"
RECIPE="$(sha256sum "$SELF" | cut -c1-16)"
TARBALL="$CACHE_DIR/rootfs-$RECIPE.tar"
SUITE=bookworm
# Modules the sandbox must provide (several need shared libs from the rootfs).
CHECK_MODULES="json, decimal, heapq, bisect, fractions, sqlite3, ctypes, multiprocessing, ssl, zlib, lzma, bz2"

T0=$EPOCHREALTIME
log() { printf 'build.sh [%6.1fs] %s\n' "$(echo "$EPOCHREALTIME - $T0" | awk '{print $1 - $3}')" "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "build.sh: must run as root (debootstrap/chroot)" >&2; exit 1; }

# 1. Docker engine (installs and starts dockerd if needed).
bash "$HERE/../docker/install-engine.sh"

# 2. Up to date already? (One build at a time per cache dir.)
mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/.lock"
flock 9
current="$(docker image inspect --format '{{ index .Config.Labels "cobalt.sandbox.recipe" }}' "$IMAGE" 2>/dev/null || true)"
if [ "$current" = "$RECIPE" ]; then
    log "$IMAGE is up to date (recipe $RECIPE); nothing to do"
    exit 0
fi

# mirror_for SUITE: first URI in the host's apt sources (one-line .list or
# deb822 .sources format) that serves SUITE.
mirror_for() {
    local suite=$1 f
    {
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -r "$f" ] || continue
            awk -v s="$suite" '$1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == s) print $i
            }' "$f"
        done
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -r "$f" ] || continue
            awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" } {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (n = 1; n <= NF; n++) {
                    if ($n ~ /^[ \t]*#/ || index($n, ":") == 0) continue
                    k = tolower(substr($n, 1, index($n, ":") - 1))
                    v = substr($n, index($n, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", v)
                    if (k == "types") types = v; else if (k == "uris") uris = v
                    else if (k == "suites") suites = v; else if (k == "enabled") enabled = tolower(v)
                }
                if (enabled == "no" || (" " types " ") !~ / deb /) next
                if ((" " suites " ") ~ (" " s " ")) { split(uris, u, " "); print u[1] }
            }' "$f"
        done
    } | head -n 1
}

# 3. Rootfs tarball (cached).
if [ -s "$TARBALL" ]; then
    log "using cached rootfs $TARBALL"
else
    export DEBIAN_FRONTEND=noninteractive
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap"
        apt-get install -y -q --no-install-recommends debootstrap \
            || { apt-get update -q && apt-get install -y -q --no-install-recommends debootstrap; }
    fi
    MIRROR="$(mirror_for "$SUITE")"; MIRROR="${MIRROR:-http://deb.debian.org/debian}"
    SECURITY="$(mirror_for "$SUITE-security")"; SECURITY="${SECURITY:-http://deb.debian.org/debian-security}"
    # Reuse the host's apt freshness policy (e.g. snapshot mirrors whose
    # Release files are past Valid-Until).
    read -r -a APT_OPTS <<<"$(apt-config dump 2>/dev/null \
        | sed -n 's/^\(Acquire::Check-[A-Za-z-]*\) "\(.*\)";$/-o \1=\2/p' | tr '\n' ' ')"

    WORK="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
    ROOTFS="$WORK/rootfs"
    cleanup() {
        # Unmount anything left under the rootfs before deleting it.
        awk -v r="$ROOTFS/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r \
            | while read -r m; do umount -l "$m" || true; done
        rm -rf --one-file-system "$WORK"
    }
    trap cleanup EXIT

    log "debootstrap --variant=minbase $SUITE from $MIRROR"
    debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -n 30 "$WORK/debootstrap.log" >&2; [ -f "$ROOTFS/debootstrap/debootstrap.log" ] && tail -n 30 "$ROOTFS/debootstrap/debootstrap.log" >&2; exit 1; }

    log "applying $SUITE-updates and $SUITE-security (from $SECURITY)"
    cat >"$ROOTFS/etc/apt/sources.list" <<SRC
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
SRC
    cp /etc/hosts /etc/resolv.conf "$ROOTFS/etc/"   # host name resolution for apt
    mount -t proc proc "$ROOTFS/proc"
    chroot "$ROOTFS" apt-get "${APT_OPTS[@]}" -q update >"$WORK/apt.log" 2>&1 \
        && chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive apt-get -q -y upgrade >>"$WORK/apt.log" 2>&1 \
        || { tail -n 30 "$WORK/apt.log" >&2; exit 1; }
    chroot "$ROOTFS" apt-get clean
    umount "$ROOTFS/proc"

    log "stripping rootfs ($(du -sm "$ROOTFS" | cut -f1) MiB before)"
    r="$ROOTFS"
    rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/cache/debconf/*-old \
        "$r"/var/lib/dpkg/*-old "$r"/usr/share/man/* "$r"/usr/share/info/* \
        "$r"/usr/share/locale/* "$r"/usr/share/lintian "$r"/usr/share/linda \
        "$r"/debootstrap "$r"/dev/* "$r"/run/* "$r"/tmp/* "$r"/var/tmp/* "$r"/root/.??* 2>/dev/null || true
    # Docs: keep only the copyright files.
    find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
    find "$r/var/log" -type f -delete
    # No setuid/setgid binaries in a sandbox.
    find "$r" -xdev -type f -perm /6000 -exec chmod ug-s {} +
    # Docker bind-mounts these at run time; do not ship the host's copies.
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
    : >"$r/etc/resolv.conf"; echo sandbox >"$r/etc/hostname"
    printf 'deb http://deb.debian.org/debian %s main\n' "$SUITE" >"$r/etc/apt/sources.list"
    chmod 1777 "$r/tmp" "$r/var/tmp"
    log "stripped rootfs: $(du -sm "$ROOTFS" | cut -f1) MiB"

    tar --numeric-owner --xattrs -C "$ROOTFS" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
    # Drop rootfs tarballs of older recipes.
    find "$CACHE_DIR" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$RECIPE.tar" -delete
    log "cached $TARBALL ($(du -m "$TARBALL" | cut -f1) MiB)"
fi

# 4. Import as an image (and drop the image this tag pointed to before, if unused).
log "docker import -> $IMAGE"
old_id="$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
new_id="$(docker import \
    --change 'USER 65534:65534' \
    --change 'WORKDIR /tmp' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8' \
    --change "LABEL cobalt.sandbox.recipe=$RECIPE" \
    --change 'CMD ["python3"]' \
    - "$IMAGE" <"$TARBALL")"
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    docker rmi "$old_id" >/dev/null 2>&1 || true
fi

# 5. Smoke test under the sandbox's run-time restrictions.
out="$(docker run --rm --network none --read-only --user 65534:65534 --cap-drop ALL \
    --security-opt no-new-privileges --tmpfs /tmp "$IMAGE" \
    python3 -I -c "import $CHECK_MODULES; print('ok')")"
[ "$out" = ok ] || { echo "build.sh: smoke test failed: $out" >&2; exit 1; }
log "smoke test ok; $(docker image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' "$IMAGE")"
