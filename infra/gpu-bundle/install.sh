#!/usr/bin/env bash
# On the GPU worker: gather the bundle's parts (carried one call at a time into the repo's .gpu/),
# keep them outside the repository, and once all are there, install into /tmp/site.
#
#   bash infra/gpu-bundle/install.sh            # then: export PYTHONPATH=/tmp/site:$PWD
#
# Exit 0 with "complete" when /tmp/site is ready, 0 with "waiting" while parts are missing.
set -euo pipefail
store="${GPU_BUNDLE_STORE:-/root/gpu-bundle}"
site="${GPU_SITE:-/tmp/site}"
mkdir -p "$store"
if [ -d .gpu ]; then
  for f in .gpu/part-* .gpu/PARTS; do [ -e "$f" ] && mv -f "$f" "$store/"; done
  if compgen -G ".gpu/pre/*.whl" >/dev/null; then  # pydantic & co: the project's code needs them
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --only-binary=:all: --python-version 3.12 \
      --target "$site" .gpu/pre/*.whl
    rm -rf .gpu/pre
  fi
fi
if [ -f "$site/.complete" ]; then echo "bundle: complete (installed)"; exit 0; fi
[ -f "$store/PARTS" ] || { echo "bundle: waiting (no PARTS list yet; have: $(ls "$store" | tr '\n' ' '))"; exit 0; }
missing=$(while read -r p; do [ -e "$store/$p" ] || echo "$p"; done <"$store/PARTS")
if [ -n "$missing" ]; then echo "bundle: waiting for $(echo $missing)"; exit 0; fi
rm -rf "$store/x" && mkdir -p "$store/x" "$site"
cat $(sed "s|^|$store/|" "$store/PARTS") | tar -xf - -C "$store/x"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --only-binary=:all: --python-version 3.12 \
  --target "$site" "$store"/x/whl/*.whl
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
  "$store/x/vllm-site.tar.xz" "$site"  # xz through Python: the worker may lack the xz tool
rm -rf "$store/x"
touch "$site/.complete"
echo "bundle: complete (installed into $site)"
