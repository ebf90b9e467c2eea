#!/usr/bin/env bash
# Build the offline bundle of requirements.txt for a GPU worker that cannot download (python 3.12,
# x86-64, torch 2.11.0+cu130 in its image), in pieces small enough to carry a few at a time (a
# device call carries at most 64 MiB with the repository):
#
#   bash infra/gpu-bundle/build.sh [OUT_DIR] [PART_MB]     # default .gpu/, 18 MiB vLLM parts
#
#   OUT_DIR/site-GROUP.tar.xz  each group of requirements.txt (`# group: NAME`) installed for
#                              python 3.12 (pip --target) and packed with xz -9e: train 3 MB (TRL,
#                              datasets, pydantic), vllm+prefect as `core` 37 MB, remote 24 MB
#                              (LiteLLM, s3fs), deepspeed (its wheel built here from the source
#                              release: DS_BUILD_OPS=0, with the BUILD_PYTHON that has torch,
#                              default .venv/bin/python); install.sh unpacks whatever arrived
#   OUT_DIR/vllm.part-NN       vLLM, unpacked, trimmed, as .tar.xz cut into parts; PARTS lists them
#
# vLLM's wheel (304 MB) is trimmed of what the Hopper (H100/H200) bf16 path of a dense model never
# loads: the FlashAttention-2 kernels (Ampere/Ada; Hopper runs vLLM's FlashAttention 3), the
# mixture-of-experts kernels (_moe_C: imported only if present; Qwen3-8B and R1-Distill-Llama-8B
# are dense), the optional Rust front end binary (vllm-rs), the DeepGEMM/SM100 CUDA headers (JIT
# sources for FP8 and Blackwell) and DeepGEMM's extension for other Pythons; the rest is byte for
# byte the release (71 MB as .tar.xz: four parts). Needs pip and network here.
#
# The groups travel packed: installed wheels compress to about 60% of the wheels with xz -9e
# (train + vllm + prefect: 58 MB of wheels, 37 MB packed), which is what lets the whole bundle
# reach a worker in three calls (docs/DEPLOYMENT.md, "GPU workers: the install").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath -m "${1:-.gpu}")"
part_mb="${2:-18}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
         manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
target=(--python-version 3.12 --implementation cp --only-binary=:all: "${platforms[@]}")
mkdir -p "$work/vllm-site"
# one requirements file per `# group: NAME` section; vllm's and prefect's travel together (core)
awk '/^# group: /{g=$3; if (g == "vllm" || g == "prefect") g = "core"; next} {sub(/#.*/, "")}
     NF{print > (dir "/reqs-" g ".txt")}' dir="$work" "$here/requirements.txt"
rm -rf "$out" && mkdir -p "$out"
for reqs in "$work"/reqs-*.txt; do
  group="$(basename "$reqs" .txt)"; group="${group#reqs-}"
  mkdir -p "$work/wheels-$group" "$work/site-$group"
  if [ "$group" = deepspeed ]; then  # no wheel published: built from its source release
    grep '^deepspeed==' "$reqs" | xargs -I{} env DS_BUILD_OPS=0 PIP_CONSTRAINT='' \
      "${BUILD_PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps --no-build-isolation {} \
      -w "$work/wheels-$group"
    sed -i '/^deepspeed==/d' "$reqs"
  fi
  PIP_CONSTRAINT='' python3 -m pip download -q --no-deps "${target[@]}" -d "$work/wheels-$group" -r "$reqs"
  if [ "$group" = core ]; then
    unzip -q "$work"/wheels-core/vllm-*.whl -d "$work/vllm-site"
    rm "$work"/wheels-core/vllm-*.whl
  fi
  PIP_CONSTRAINT='' python3 -m pip install -q --no-deps --no-compile --no-index "${target[@]}" \
    --target "$work/site-$group" "$work/wheels-$group"/*.whl 2>&1 | grep -v "Running pip as" || true
  tar -cf - -C "$work/site-$group" . | xz -T0 -9e >"$out/site-$group.tar.xz"
done
rm -f "$work/vllm-site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$work/vllm-site/vllm/vllm-rs" \
      "$work/vllm-site/vllm/_moe_C_stable_libtorch.abi3.so"
rm -f "$work"/vllm-site/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
rm -rf "$work/vllm-site/vllm/third_party/deep_gemm/include" \
       "$work/vllm-site/vllm/third_party/fmha_sm100/cutlass/include"
tar -cf - -C "$work/vllm-site" . | xz -T0 -9e | split -b "${part_mb}M" -d - "$out/vllm.part-"
(cd "$out" && ls vllm.part-* >"$work/PARTS") && mv "$work/PARTS" "$out/PARTS"
echo "bundle under $out: $(cd "$out" && du -sh site-*.tar.xz | tr '\t\n' ' '), vLLM in $(wc -l <"$out/PARTS") parts"
