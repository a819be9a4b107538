#!/usr/bin/env bash
# Megatron-Core parity on 2 GPUs: a small MoE GPT trained 20 steps (bf16, EP=2) with
#   --moe-token-dispatcher-type alltoall                                  (Megatron's own)
#   --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend uccl   (uccl_ep, via the launcher)
# then compare_runs.py checks the loss curves agree within bf16 noise. Exit 0 = match.
#
# Run from the repository root:  bash integrations/megatron/gpu/run_parity.sh
# Writes to $OUT (default .cache/megatron-parity): alltoall.json, uccl.json, parity.json, *.log.
# megatron-core: used if importable, else installed offline from .whl/megatron_core-*.whl into
# $OUT/site (pure Python); uccl_ep must be importable (or importable from core/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/.cache/megatron-parity}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
STEPS=${STEPS:-20}
# extra Megatron flags for both runs, e.g. PARITY_EXTRA="--moe-permute-fusion"
read -r -a EXTRA <<< "${PARITY_EXTRA:-}"
NPROC=${NPROC:-2}
log() { printf '[parity] %s\n' "$*" | tee -a "$OUT/parity.log"; }

export PYTHONPATH="$ROOT/integrations/megatron${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c 'import megatron.core' 2>/dev/null; then
  whl=$(ls "$ROOT"/.whl/megatron_core-*.whl 2>/dev/null | head -1 || true)
  [[ -n "$whl" ]] || { log "megatron-core not importable and no .whl/megatron_core-*.whl to install"; exit 2; }
  log "installing $(basename "$whl") into $OUT/site (offline, no deps)"
  "$PY" -m pip install -q --no-index --no-deps --target "$OUT/site" "$whl"
  export PYTHONPATH="$OUT/site:$PYTHONPATH"
fi
if ! "$PY" -c 'import uccl_ep' 2>/dev/null; then
  export PYTHONPATH="$ROOT/core:$PYTHONPATH"
  "$PY" -c 'import uccl_ep' || { log "uccl_ep is not importable (install core/ first)"; exit 2; }
fi
"$PY" -m uccl_ep_megatron info | tee -a "$OUT/parity.log"
nvidia-smi -L >>"$OUT/parity.log" 2>&1 || true

COMMON=(--train-iters "$STEPS" --expert-model-parallel-size "$NPROC" "${EXTRA[@]}")
run() {  # name, then the command after torchrun's options
  local name=$1; shift
  log "run $name: $*"
  local port=$((29500 + RANDOM % 1000))
  if ! "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" --master-port "$port" "$@" \
      --output-json "$OUT/$name.json" "${COMMON[@]}" >"$OUT/$name.log" 2>&1; then
    log "run $name FAILED; last lines of $OUT/$name.log:"; tail -n 40 "$OUT/$name.log" | tee -a "$OUT/parity.log"
    return 1
  fi
  grep '^{"step"' "$OUT/$name.log" | tee -a "$OUT/parity.log" >/dev/null
}
status=0
run alltoall integrations/megatron/examples/train_moe_gpt.py --moe-token-dispatcher-type alltoall || status=1
run uccl -m uccl_ep_megatron integrations/megatron/examples/train_moe_gpt.py \
  --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend uccl --uccl-timeout-s 300 || status=1
((status == 0)) || { log "a training run failed"; exit 1; }
"$PY" integrations/megatron/gpu/compare_runs.py "$OUT/alltoall.json" "$OUT/uccl.json" \
  --report "$OUT/parity.json" | tee -a "$OUT/parity.log"
