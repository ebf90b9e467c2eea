#!/usr/bin/env bash
# On the GPU worker, from the repository root: install what the bundle's pieces carried so far
# (see build.sh). Packed groups (.gpu/site-*.tar.xz) are unpacked into /tmp/site at once; vLLM's
# parts are kept outside the repository (they stay on the warm machine across calls) and unpacked
# into /tmp/site when all have arrived.
#
#   bash infra/gpu-bundle/install.sh            # then: export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
store="${GPU_BUNDLE_STORE:-/root/gpu-bundle}"
site="${GPU_SITE:-/tmp/site}"
mkdir -p "$store" "$site"
unpack() {  # xz through Python: the worker may lack the xz tool
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$1" "$2"
}
for pack in .gpu/site-*.tar.xz; do
  [ -e "$pack" ] || continue
  unpack "$pack" "$site" && rm -f "$pack"
  echo "bundle: $(basename "$pack" .tar.xz) installed into $site"
done
# console scripts were written by the build machine's pip: run them with this machine's python3
for script in "$site"/bin/*; do
  [ -f "$script" ] && head -c 2 "$script" | grep -q '#!' && sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$script"
done
for f in .gpu/vllm.part-* .gpu/PARTS; do [ -e "$f" ] && mv -f "$f" "$store/"; done
if [ -f "$site/vllm/.complete" ]; then echo "bundle: vLLM installed"; exit 0; fi
[ -f "$store/PARTS" ] || { echo "bundle: vLLM waiting (no PARTS list yet)"; exit 0; }
missing=$(while read -r p; do [ -e "$store/$p" ] || echo "$p"; done <"$store/PARTS")
if [ -n "$missing" ]; then echo "bundle: vLLM waiting for $(echo $missing)"; exit 0; fi
cat $(sed "s|^|$store/|" "$store/PARTS") >"$store/vllm-site.tar.xz"
unpack "$store/vllm-site.tar.xz" "$site"
rm -f "$store/vllm-site.tar.xz"
touch "$site/vllm/.complete"
echo "bundle: vLLM installed into $site"
