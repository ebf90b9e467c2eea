# Sourced by the device-call scripts (scripts/gpu/*.sh) from the repository root: $OUT, the
# offline bundle's packages installed (infra/gpu-bundle/install.sh), the environment they run in.
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -n "${BUNDLE_READY:-}" ] || bash infra/gpu-bundle/install.sh  # once per call (scripts/gpu/pair.sh)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_LOGGING_LEVEL=WARNING NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # the bundle has no flashinfer: PyTorch top-p/top-k sampling
