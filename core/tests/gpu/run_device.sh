#!/usr/bin/env bash
# One GPU-machine session for the cuda backend: build, verify against uccl_ep.refs, benchmark.
# Usage (repo root): bash core/tests/gpu/run_device.sh [steps...]   steps: build test ll ht sanitize proxy
#   proxy: the LL path through the CPU proxy (UCCL_EP_FORCE_PROXY; ipc transport): its tests vs the
#          reference, then `uccl-ep bench --mode ll --force-proxy` at 128/256/512 tokens. Needs the
#          whole native module (do not combine with `isolate`).
# Logs and JSON go to $OUT (or ./gpu-out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UCCL_EP_JIT_CACHE_DIR=${UCCL_EP_JIT_CACHE_DIR:-/tmp/uccl_ep_jit}
STEPS=${*:-build test ll ht}
PY=python3
for step in $STEPS; do
  echo "=== $step $(date +%T)"
  case $step in
    isolate)  # keep only the runtime and its bindings in this (disposable) copy: other subsystems'
              # work in progress must not break the GPU build
      find core/csrc -mindepth 1 -maxdepth 1 -type d ! -name runtime ! -name bindings -exec rm -rf {} +
      find core/csrc/bindings -name 'bind_*.cc' ! -name 'bind_runtime*.cc' -delete
      sed -i '/register_[a-z_]*(m)/{/register_runtime/!d}; /^void register_/{/register_runtime\|register_all/!d}' \
        core/csrc/bindings/register_all.cc ;;
    build)
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m | head -4
      $PY -m pip install -q --no-build-isolation --no-deps -e core > "$OUT/pip_build.log" 2>&1 || \
        grep -E "error|Error" "$OUT/pip_build.log" | head -20
      $PY -c "import uccl_ep._C as C; print('cuda', C.cuda.available(), C.cuda.driver_version())" ;;
    test)
      $PY -m pytest core/tests/gpu -x -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25 ;;
    ll)
      for t in 128 256 512; do
        $PY -m uccl_ep.cli.main bench --backend cuda --mode ll --num-tokens $t --iters 50 --warmup 10 \
          --json "$OUT/ll_$t.json" 2>&1 | tail -8
      done ;;
    ht)
      for sms in 24 12 8; do
        $PY -m uccl_ep.cli.main bench --backend cuda --mode ht --num-sms $sms --iters 30 --warmup 5 \
          --json "$OUT/ht_$sms.json" 2>&1 | tail -8
      done ;;
    proxy)
      $PY -m pytest core/tests/gpu/test_cuda_ll_proxy.py -x -q -p no:cacheprovider 2>&1 | \
        tee "$OUT/gpu_proxy_tests.log" | tail -25
      for t in 128 256 512; do
        timeout 600 $PY -m uccl_ep.cli.main bench --backend cuda --mode ll --force-proxy --num-tokens $t --iters 50 \
          --warmup 10 --json "$OUT/ll_proxy_$t.json" 2>&1 | tail -8
      done ;;
    sanitize)
      UCCL_EP_SANITIZE_SMALL=1 timeout 300 compute-sanitizer --tool memcheck --target-processes all \
        $PY core/tests/gpu/test_cuda_ll.py small 2>&1 | tail -30 | tee "$OUT/sanitize.log" ;;
  esac
done
