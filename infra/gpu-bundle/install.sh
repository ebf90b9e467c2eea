#!/usr/bin/env bash
# On the GPU worker, from the repository root: install what the bundle's pieces carried so far
# (see build.sh). Wheels in .gpu/wheels-*/ (any group) are installed into /tmp/site at once; vLLM's parts are kept
# outside the repository (they stay on the warm machine across calls) and unpacked into /tmp/site
# when all have arrived.
#
#   bash infra/gpu-bundle/install.sh            # then: export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
store="${GPU_BUNDLE_STORE:-/root/gpu-bundle}"
site="${GPU_SITE:-/tmp/site}"
mkdir -p "$store" "$site"
for dir in .gpu/wheels-*/; do
  compgen -G "$dir*.whl" >/dev/null || continue
  # into a fresh folder, then merged: `pip --target --upgrade` into $site itself would replace
  # its bin/ (and any shared folder) with this group's, losing an earlier call's console scripts
  staged="$(mktemp -d)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --only-binary=:all: --python-version 3.12 --target "$staged" "$dir"*.whl 2>&1 \
    | grep -v "Running pip as the 'root' user" || true
  cp -a "$staged"/. "$site"/ && rm -rf "$staged" "$dir"
  echo "bundle: $(basename "$dir") installed into $site"
done
for f in .gpu/vllm.part-* .gpu/PARTS; do [ -e "$f" ] && mv -f "$f" "$store/"; done
if [ -f "$site/vllm/.complete" ]; then echo "bundle: vLLM installed"; exit 0; fi
[ -f "$store/PARTS" ] || { echo "bundle: vLLM waiting (no PARTS list yet)"; exit 0; }
missing=$(while read -r p; do [ -e "$store/$p" ] || echo "$p"; done <"$store/PARTS")
if [ -n "$missing" ]; then echo "bundle: vLLM waiting for $(echo $missing)"; exit 0; fi
cat $(sed "s|^|$store/|" "$store/PARTS") >"$store/vllm-site.tar.xz"
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
  "$store/vllm-site.tar.xz" "$site"  # xz through Python: the worker may lack the xz tool
rm -f "$store/vllm-site.tar.xz"
touch "$site/vllm/.complete"
echo "bundle: vLLM installed into $site"
