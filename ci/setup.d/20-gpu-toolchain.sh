#!/usr/bin/env bash
# GPU toolchains for the kernel compile checks (no GPU needed, nothing runs on a device):
#   - nvcc 13.0 from PyPI into the venv (matches the CUDA 13.0 driver of the GPU machine), used
#     by uccl_ep's JIT and by core/tests/cpu/test_kernels_compile.py for sm_90 / sm_100;
#   - Debian's clang 22 + lld 22 (bookworm-security; the AMDGPU backend knows gfx90a, gfx942 and
#     gfx950) with Debian's HIP 5.2 headers and AMDGPU device libraries, for the gfx90a / gfx942 /
#     gfx950 checks (flags that bridge the two: core/tests/cpu/hip_toolchain.py).
# Idempotent: each part checks whether it is already installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VPY:-$PWD/.venv/bin/python}
log() { printf '\033[1m[setup gpu]\033[0m %s\n' "$*"; }

NVCC_PKGS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
           nvidia-cuda-runtime==13.0.96)
if ! "$VPY" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
want = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88", "nvidia-nvvm": "13.0.88",
        "nvidia-cuda-cccl": "13.0.85"}
sys.exit(0 if all(m.version(k) == v for k, v in want.items()) else 1)
PY
then
  log "pip: ${NVCC_PKGS[*]}"
  "$VPY" -m pip install -q "${NVCC_PKGS[@]}"
fi

HIP_PKGS=(clang-22 lld-22 libamdhip64-dev rocm-device-libs)
missing=()
for p in "${HIP_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
