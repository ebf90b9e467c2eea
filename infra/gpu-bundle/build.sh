#!/usr/bin/env bash
# Build the offline bundle of requirements.txt for a GPU worker that cannot download (python 3.12,
# x86-64, torch 2.11.0+cu130 in its image), in pieces small enough to carry one at a time:
#
#   bash infra/gpu-bundle/build.sh [OUT_DIR] [PART_MB]     # default .gpu/, 54 MiB parts
#
#   OUT_DIR/wheels/            every wheel but vLLM's (44 MB: pydantic, TRL, datasets, LiteLLM,
#                              what vLLM imports); install.sh installs them the call they arrive
#   OUT_DIR/vllm.part-NN       vLLM, unpacked, trimmed, as .tar.xz cut into parts; PARTS lists them
#
# vLLM's wheel (304 MB) is trimmed of what the Hopper (H100/H200) bf16 path never loads: the
# FlashAttention-2 kernels (Ampere/Ada; Hopper runs vLLM's FlashAttention 3), the optional Rust
# front end binary (vllm-rs), the DeepGEMM/SM100 CUDA headers (JIT sources for FP8 and Blackwell)
# and DeepGEMM's extension for other Pythons; the rest is byte for byte the release (115 MB as
# .tar.xz). Needs pip and network here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath -m "${1:-.gpu}")"
part_mb="${2:-54}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
         manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
mkdir -p "$work/whl" "$work/vllm-site"
sed 's/#.*//' "$here/requirements.txt" | grep -v '^\s*$' >"$work/reqs.txt"
PIP_CONSTRAINT='' python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$work/whl" -r "$work/reqs.txt"
unzip -q "$work"/whl/vllm-*.whl -d "$work/vllm-site"
rm "$work"/whl/vllm-*.whl
rm -f "$work/vllm-site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$work/vllm-site/vllm/vllm-rs"
rm -f "$work"/vllm-site/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
rm -rf "$work/vllm-site/vllm/third_party/deep_gemm/include" \
       "$work/vllm-site/vllm/third_party/fmha_sm100/cutlass/include"
rm -rf "$out" && mkdir -p "$out"
mv "$work/whl" "$out/wheels"
tar -cf - -C "$work/vllm-site" . | xz -T0 -6 | split -b "${part_mb}M" -d - "$out/vllm.part-"
(cd "$out" && ls vllm.part-* >"$work/PARTS") && mv "$work/PARTS" "$out/PARTS"
echo "bundle under $out: wheels $(du -sh "$out/wheels" | cut -f1), vLLM in $(wc -l <"$out/PARTS") parts"
