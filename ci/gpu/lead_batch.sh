#!/usr/bin/env bash
# One GPU-machine call (2 x H200) that checks the integrations end to end and measures the proxy's
# CPU side, writing logs and JSON to $OUT:
#   1. Megatron-Core parity: alltoall vs flex + uccl, 20 bf16 steps (integrations/megatron/gpu);
#      step megatron-fusion: the same with --moe-permute-fusion
#   2. SGLang's own DeepEPDispatcher on uccl_ep (needs .venv-sglang/gpu-bundle.tar.xz carried)
#   3. vLLM's DeepEP prepare/finalize on uccl_ep (needs .venv-vllm/gpu-bundle.tar.xz carried)
#   4. uccl-ep bench fifo / transport on this machine's CPUs; memcheck of a small LL case
# Usage (repo root, on the GPU machine): bash ci/gpu/lead_batch.sh [steps...]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UCCL_EP_JIT_CACHE_DIR=${UCCL_EP_JIT_CACHE_DIR:-/tmp/uccl_ep_jit}
STEPS=${*:-build megatron sglang fifo}
for step in $STEPS; do
  echo "=== $step $(date +%T)"
  case $step in
    build)
      nvidia-smi -L; nproc
      python3 -m pip install -q --no-build-isolation --no-deps -e core >"$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
      python3 -c "import uccl_ep, uccl_ep._C as C; print('uccl_ep', uccl_ep.__version__, 'cuda', C.cuda.available())" ;;
    megatron)
      OUT="$OUT/megatron" timeout 280 bash integrations/megatron/gpu/run_parity.sh 2>&1 | tail -15
      [[ ${PIPESTATUS[0]} == 0 ]] || echo "megatron parity: FAILED (see $OUT/megatron)" ;;
    megatron-fusion)
      # the same parity with --moe-permute-fusion (Megatron may refuse it without TransformerEngine:
      # the first lines of the log say so)
      OUT="$OUT/megatron-fusion" PARITY_EXTRA="--moe-permute-fusion" timeout 280 \
        bash integrations/megatron/gpu/run_parity.sh 2>&1 | tail -15
      [[ ${PIPESTATUS[0]} == 0 ]] || echo "megatron parity with --moe-permute-fusion: FAILED (see $OUT/megatron-fusion)" ;;
    sglang)
      B=/tmp/sgb; mkdir -p $B && tar -C $B -xJf .venv-sglang/gpu-bundle.tar.xz && \
      python3 -m pip install -q --no-index --no-deps --target $B/gpu-bundle/site $B/gpu-bundle/wheels/*.whl \
        >"$OUT/sglang_install.log" 2>&1 || tail -5 "$OUT/sglang_install.log"
      # NOTES: the bundle carries .py files only; SGLang's JIT-kernel module checks at import that its
      # source folders exist. The driver dispatches BF16 and compiles none of them.
      mkdir -p $B/gpu-bundle/site/sglang/kernels/jit/include $B/gpu-bundle/site/sglang/kernels/jit/csrc
      PYTHONPATH=$B/gpu-bundle/site:integrations/sglang:core:${PYTHONPATH:-} timeout 200 \
        python3 integrations/sglang/gpu/drive_deepep_dispatcher.py --device cuda >"$OUT/sglang.log" 2>&1
      echo "sglang driver exit $?"; tail -12 "$OUT/sglang.log" ;;
    vllm)
      B=/tmp/vlb; mkdir -p $B && tar -C $B -xJf .venv-vllm/gpu-bundle.tar.xz && \
      python3 -m pip install -q --no-index --no-deps --target $B/gpu-bundle/site $B/gpu-bundle/wheels/*.whl \
        >"$OUT/vllm_install.log" 2>&1 || tail -5 "$OUT/vllm_install.log"
      PYTHONPATH=$B/gpu-bundle/site:integrations/vllm:core:${PYTHONPATH:-} timeout 200 \
        python3 integrations/vllm/gpu/drive_deepep_prepare_finalize.py --device cuda >"$OUT/vllm.log" 2>&1
      echo "vllm driver exit $?"; tail -12 "$OUT/vllm.log" ;;
    sanitize)
      UCCL_EP_SANITIZE_SMALL=1 timeout 120 compute-sanitizer --tool memcheck --target-processes all \
        python3 core/tests/gpu/test_cuda_ll.py small >"$OUT/sanitize.log" 2>&1; echo "sanitize exit $?"
      tail -8 "$OUT/sanitize.log" ;;
    fifo)
      timeout 100 python3 -m uccl_ep.cli.main bench fifo --fifo-producers 1,4,16 --fifo-threads 1,4,8 \
        --json "$OUT/fifo.json" 2>&1 | tail -16
      timeout 60 python3 -m uccl_ep.cli.main bench transport --transports loop --json "$OUT/transport.json" 2>&1 | tail -10 ;;
  esac
done
