#!/usr/bin/env bash
# One GPU-machine session for the cuda backend: build, verify against uccl_ep.refs, benchmark.
# Usage (repo root): bash tools/lab/run_device.sh [steps...]   steps: build test ll llcheck ht hybrid forward compare matrix eager sanitize proxy proxydiag internode htproxy regress scale sweep tune
#   proxy: the LL path through the CPU proxy (UCCL_EP_FORCE_PROXY; ipc transport): its tests vs the
#          reference, then `uccl-ep bench --mode ll --force-proxy` at 128/256/512 tokens. Needs the
#          whole native module (do not combine with `isolate`).
#   internode: normal mode through the CPU proxy with every GPU as its own node (ranks_per_node=1,
#          ipc transport), and with 4+ GPUs 2 nodes of several ranks (dedup + forwarding): its tests
#          vs the reference (core/tests/gpu/test_cuda_ht_internode.py), then `uccl-ep bench --mode ht
#          --nodes <GPUs>` (and `--nodes 2` with 4+ GPUs): RDMA-formula GB/s, transport bytes/op.
#          Needs the whole native module (do not combine with `isolate`).
#   scale: runs on 4+ GPUs (EP = every GPU), in priority order under SCALE_BUDGET_S
#          (default 520 s), each command under its own timeout: HT intranode small bitwise tests
#          (copy-engine combine, copy-engine dispatch, then the ring), then
#          `bench --mode ht` at 24/12/8 SMs (and 12 with --tune ht_dispatch_ce=1); LL NVLink small test + `bench --mode ll` at 128 tokens;
#          2 nodes x (GPUs/2) through the proxy: small test + `bench --mode ht --nodes 2`; LL forced
#          proxy `bench` at 128 tokens; then the deepseek-size tests while time remains.
#   llcheck: the LL NVLink kernels in one go: every test of test_cuda_ll.py (node ids, -rA), then the
#          bench at LL_TOKENS (default "128 256 512") with --tune ll_pdl=1 and =0 in alternation (an
#          A/B of programmatic dependent launch in the same run) -> $OUT/ll_pdl<0|1>_<T>.json and a
#          one-line summary per row; then per-kernel times (profile_kernels.py ll, PDL off).
#   proxydiag: where the LL proxy path's time goes: its small + traffic tests, the
#          forced-proxy bench at 128 tokens (per-hop columns incl. `done→seen us`), every rank's kernel
#          spans (profile_kernels.py ll with UCCL_EP_FORCE_PROXY=1), and the copy kernel alone
#          (probe_copy_kernel.py) -> $OUT/proxydiag_*.{log,json}.
#   sweep: `uccl-ep bench` rows for the records: for R in SWEEP_RANKS (default "2 4", capped at the
#          GPUs present): HT at SWEEP_SMS (default "24 16 12 8") SMs and LL at 128/256/512 tokens
#          (NVLink) -> $OUT/sweep_r<R>_*.json, under SWEEP_BUDGET_S (default 480 s).
#   tune: the default HT kernels' tuning matrix (bench --tune ht_warps / ht_combine_warps / ht_defines): TUNE_CONFIGS =
#          "label:warps[/combine warps]:DEFINES;..." each benchmarked (TUNE_ITERS, default 10 (30 for decisions: 10 is noisy); TUNE_RANKS, default 2) (bench-verified) at TUNE_SMS (default 24) ->
#          $OUT/ht_tune_<label>_<sms>.json and a table ($OUT/ht_tune.md); then, unless TUNE_PROF=0,
#          one bench with UCCL_EP_HT_PROF=1 and TUNE_PROF_DEFINES (per-launch wait shares,
#          $OUT/ht_prof.log). TUNE_BUDGET_S
#          (default 520 s). Kernels are compiled in parallel first (precompile.py --ht).
#   matrix: `uccl-ep bench --matrix $MATRIX` (ht, ll or all; default ht) beside DeepEP V1 from
#          .anchors/deepep-v1 (copied from ../shared/anchors and carried; its extension is unpacked
#          here), under MATRIX_BUDGET_S (default 420 s) with a 30 s budget per point; MATRIX_ARGS adds
#          flags (e.g. "--matrix-tokens 128,512"); MATRIX_DEEPEP=auto runs without DeepEP ->
#          $OUT/matrix_<MATRIX>.{json,png,log} (and .json.partial.jsonl while it runs).
#   eager: host time of eager calls (issue 30): tools/lab/host_path.py EAGER_WHAT (ll, ht or all; default ll)
#          for uccl-ep (with and without its torch ops) and for DeepEP V1 (.anchors/deepep-v1, carried as for `matrix`), one process each,
#          EAGER_REPS times (default 2), then `uccl-ep bench --mode ll` at 128 and 64 tokens (eager and
#          graph rows, DeepEP beside) -> $OUT/eager_*.{log,json}.
# Logs and JSON go to $OUT (or ./gpu-out). TEST_TIMEOUT_S / BENCH_TIMEOUT_S bound the proxy and
# internode steps' commands (default 600 s each); LL_TOKENS overrides the proxy step's token counts.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."  # the repository root: every path below is relative to it
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UCCL_EP_JIT_CACHE_DIR=${UCCL_EP_JIT_CACHE_DIR:-/tmp/uccl_ep_jit}
STEPS=${*:-build test ll ht}
PY=python3
# A step's time budget: start_budget SECONDS, then `bounded CAP CMD...` runs CMD under min(CAP, time
# left) and returns 124 when skipped (under 20 s left) or cut; `left` prints the seconds left.
start_budget() { t0=$SECONDS; budget=$1; }
# A device call returns a few files only: bundle NAME GLOB... packs the step's outputs into $OUT/NAME.tgz
# and removes them (their names stay listed in the log).
bundle() {
  local name=$1; shift
  (cd "$OUT" && shopt -s nullglob && files=($@) && (( ${#files[@]} )) && tar -czf "$name.tgz" "${files[@]}" && rm -f "${files[@]}" \
    && echo "  bundled ${#files[@]} files into $name.tgz")
}
left() { echo $(( budget - (SECONDS - t0) )); }
bounded() {
  local cap=$1; shift; local l; l=$(left)
  if (( l < 20 )); then echo "  (skipped: step budget spent) $*"; return 124; fi
  timeout -k 10 $(( cap < l ? cap : l )) "$@"
}
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
    llcheck)
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      ids=$($PY -m pytest core/tests/gpu/test_cuda_ll.py --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' | sed 's%^tests/%core/tests/%')
      timeout -k 10 ${TEST_TIMEOUT_S:-400} $PY -m pytest -rA -q -p no:cacheprovider $ids 2>&1 | \
        tee "$OUT/ll_tests.log" | grep -E "^(PASSED|FAILED|ERROR)|passed|failed" | tail -12
      for t in ${LL_TOKENS:-128 256 512}; do
        for pdl in 1 0; do
          timeout -k 10 ${BENCH_TIMEOUT_S:-120} $PY -m uccl_ep.cli.main bench --backend cuda --tune ll_pdl=$pdl \
            --mode ll --num-tokens $t --iters 50 --warmup 10 --json "$OUT/ll_pdl${pdl}_$t.json" 2>&1 | \
            grep "│ ll" | sed "s/^/pdl=$pdl /" | cut -c1-190
        done
      done
      timeout -k 10 120 $PY tools/lab/profile_kernels.py ll 2>&1 | grep "rank 0" ;;
    proxydiag)
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60} CUDA_MODULE_LOADING=EAGER
      T=core/tests/gpu/test_cuda_ll_proxy.py
      timeout -k 10 150 $PY -m pytest -rA -q -p no:cacheprovider "$T::test_ll_proxy_options_match_reference[small]" \
        "$T::test_ll_proxy_carries_the_traffic[kernel]" 2>&1 | tee "$OUT/proxydiag_tests.log" | \
        grep -E "^(PASSED|FAILED|ERROR)|passed|failed" | tail -4
      timeout -k 10 90 $PY -m uccl_ep.cli.main bench --backend cuda --mode ll --force-proxy --num-tokens 128 --iters 50 \
        --warmup 10 --json "$OUT/proxydiag_bench.json" 2>&1 | grep -E "│ ll|rror" | cut -c1-320
      UCCL_EP_FORCE_PROXY=1 timeout -k 10 120 $PY tools/lab/profile_kernels.py ll 2>&1 | grep -E "^rank|rror" | \
        tee "$OUT/proxydiag_profile.log"
      timeout -k 10 120 $PY tools/lab/probe_copy_kernel.py 2>&1 | tee "$OUT/proxydiag_probe.log" | tail -12 ;;
    ht)
      for sms in 24 12 8; do
        $PY -m uccl_ep.cli.main bench --backend cuda --mode ht --num-sms $sms --iters 30 --warmup 5 \
          --json "$OUT/ht_$sms.json" 2>&1 | tail -8
      done ;;
    proxy)
      # short device waits: a stalled op fails in seconds with a Timeout naming rank, peer and phase
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      timeout -k 5 ${TEST_TIMEOUT_S:-600} $PY -m pytest core/tests/gpu/test_cuda_ll_proxy.py -x -q -p no:cacheprovider 2>&1 | \
        tee "$OUT/gpu_proxy_tests.log" | tail -25
      for t in ${LL_TOKENS:-128 256 512}; do
        timeout -k 5 ${BENCH_TIMEOUT_S:-600} $PY -m uccl_ep.cli.main bench --backend cuda --mode ll --force-proxy --num-tokens $t --iters 50 \
          --warmup 10 --json "$OUT/ll_proxy_$t.json" 2>&1 | tail -8
      done ;;
    internode)
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      timeout -k 5 ${TEST_TIMEOUT_S:-600} $PY -m pytest core/tests/gpu/test_cuda_ht_internode.py -x -q -p no:cacheprovider 2>&1 | \
        tee "$OUT/gpu_internode_tests.log" | tail -25
      NODES=$($PY -c "import torch; print(torch.cuda.device_count())")
      for sms in 24 12; do
        timeout -k 5 ${BENCH_TIMEOUT_S:-600} $PY -m uccl_ep.cli.main bench --backend cuda --mode ht --nodes "$NODES" --num-sms $sms \
          --iters 30 --warmup 5 --json "$OUT/ht_internode_$sms.json" 2>&1 | tail -8
      done
      if [ "$NODES" -ge 4 ]; then  # 2 nodes of NODES/2 ranks: per-node dedup and forwarding
        timeout 600 $PY -m uccl_ep.cli.main bench --backend cuda --mode ht --nodes 2 --num-sms 24 --iters 30 \
          --warmup 5 --json "$OUT/ht_internode_2nodes_24.json" 2>&1 | tail -8
      fi ;;
    hybrid)  # 4+ GPUs as 2 nodes of G/2 ranks: the LL hybrid tests (a node's peers over NVLink, the other node
             # through the proxy), then bench rows hybrid vs all-through-the-proxy in the same run; normal mode
             # 2 nodes (small test + bench; HYBRID_HT=0 leaves it out); then the LogFMT combine tests (NVLink and
             # proxy paths; HYBRID_LOGFMT=0 leaves them out). HYBRID_TESTS: a -k filter of the LL hybrid tests
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60} CUDA_MODULE_LOADING=EAGER
      start_budget ${HYBRID_BUDGET_S:-480}
      B="$PY -m uccl_ep.cli.main bench --backend cuda"
      PT="$PY -m pytest -q -p no:cacheprovider -rf"
      UCCL_EP_RANKS_PER_NODE=2 bounded 200 $PT core/tests/gpu/test_cuda_ll_hybrid.py -k "${HYBRID_TESTS:-.}" 2>&1 | \
        tee "$OUT/hybrid_tests.log" | tail -6
      # HYBRID_NIC (e.g. "efa-400g efa-400g,mates=1"): the rows again under each NIC model; with mates=1 a node
      # mate's traffic through the proxy costs NIC time too (the all-RDMA baseline), the NVLink path's never
      for nic in "" ${HYBRID_NIC:-}; do
        for t in ${LL_TOKENS:-128 256}; do
          for how in hybrid proxy; do
            bounded 60 $B --mode ll --nodes 2 $([ $how = proxy ] && echo --force-proxy) ${nic:+--nic-model $nic} \
              --num-tokens $t --iters 50 --warmup 10 --timeout 55 --json "$OUT/hybrid_ll_${how}_$t${nic:+_${nic//[,=]/_}}.json" 2>&1 | \
              grep -E "│ ll|rror" | sed "s/^/$how${nic:+ $nic} /" | cut -c1-260
          done
        done
      done
      [ "${HYBRID_HT:-1}" = 1 ] && bounded 120 $PT core/tests/gpu/test_cuda_ht_internode.py -k "small and rpn2 and kernel" 2>&1 | \
        tee "$OUT/hybrid_ht_tests.log" | tail -3
      [ "${HYBRID_HT:-1}" = 1 ] && bounded 90 $B --mode ht --nodes 2 --num-sms 24 --iters 20 --warmup 3 --timeout 80 --json "$OUT/hybrid_ht_24.json" 2>&1 | tail -6
      [ "${HYBRID_LOGFMT:-1}" = 1 ] && bounded 150 $PT core/tests/gpu/test_cuda_ll.py core/tests/gpu/test_cuda_ll_proxy.py \
        -k logfmt 2>&1 | tee "$OUT/logfmt_tests.log" | tail -4
      echo "hybrid step: $(( SECONDS - t0 )) s" ;;
    forward)  # 4+ GPUs, normal mode at 2 nodes x G/2: the rpn2 tests (FORWARD_TESTS, a -k filter), then the bench
              # with the node mates' hop over NVLink (nvlink, the default), through the proxy (proxy:
              # UCCL_EP_FORCE_PROXY=1) and with every GPU its own node (flat: all through the proxy), without a
              # NIC model and under each of FORWARD_NIC (default efa-400g) -> $OUT/forward_<how>_<tokens>[_<nic>].json;
              # FORWARD_HOWS picks among nvlink proxy flat, FORWARD_ARGS adds bench flags (e.g. --ht-dispatch fresh)
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60} CUDA_MODULE_LOADING=EAGER
      start_budget ${FORWARD_BUDGET_S:-480}
      G=$($PY -c "import torch; print(torch.cuda.device_count())")
      bounded 220 $PY -m pytest -q -p no:cacheprovider -rf core/tests/gpu/test_cuda_ht_internode.py \
        -k "${FORWARD_TESTS:-small and rpn2 and kernel or graph and rpn2}" 2>&1 | tee "$OUT/forward_tests.log" | tail -4
      for nic in "" ${FORWARD_NIC-efa-400g}; do
        for tok in ${FORWARD_TOKENS:-4096}; do
          for how in ${FORWARD_HOWS:-nvlink proxy flat}; do
            name=forward_${how}_$tok${nic:+_$(tr -c 'A-Za-z0-9.\n' - <<< "$nic")}
            UCCL_EP_FORCE_PROXY=$([ $how = proxy ] && echo 1 || echo 0) bounded 100 $PY -m uccl_ep.cli.main bench --backend cuda \
              --mode ht --nodes $([ $how = flat ] && echo "$G" || echo 2) --num-sms ${FORWARD_SMS:-24} --num-tokens $tok \
              --iters ${FORWARD_ITERS:-20} --warmup 3 --timeout 90 ${nic:+--nic-model $nic} ${FORWARD_ARGS:-} --json "$OUT/$name.json" \
              > "$OUT/$name.log" 2>&1; echo "$name rc=$?"
          done
        done
      done
      echo "forward step: $(( SECONDS - t0 )) s"
      bundle forward 'forward_*' ;;
    compare)  # the same benches on several trees in one call: COMPARE_TREES (default "base": .cmp/<tree>.tar.gz,
              # carried, each a `git archive REV core` tarball) and this checkout's core ("new"), each installed into its own
              # --target dir and run with PYTHONPATH, alternating base/new per bench and repetition
              # (COMPARE_REPS, default 2; COMPARE_BENCHES "label:flags;...") -> cmp_<tree>_<label>_<rep>.json,
              # table by compare_bench.py; COMPARE_PROFILE "what[:ENV=V,...] ..." adds profile_kernels.py
              # runs per tree (e.g. "ll:UCCL_EP_FORCE_PROXY=1"); everything bundled in $OUT/compare.tgz
      start_budget ${COMPARE_BUDGET_S:-540}
      $PY -m pip uninstall -y -q uccl-ep > /dev/null 2>&1
      rm -rf /tmp/cmp && mkdir -p /tmp/cmp/new && cp -r core /tmp/cmp/new/ && rm -rf /tmp/cmp/new/core/build
      trees="${COMPARE_TREES:-base} new"
      for tree in $trees; do
        [ $tree = new ] || { mkdir -p /tmp/cmp/$tree && tar -xzf ".cmp/$tree.tar.gz" -C /tmp/cmp/$tree; }
        $PY -m pip install -q --no-build-isolation --no-deps --target /tmp/cmp/${tree}_site /tmp/cmp/$tree/core \
          > "$OUT/cmp_build_$tree.log" 2>&1 &
      done; wait
      B="-m uccl_ep.cli.main bench --backend cuda --iters 30 --warmup 5 --timeout 100"
      IFS=';' read -ra benches <<< "${COMPARE_BENCHES-ht24:--mode ht --num-sms 24;ht12:--mode ht --num-sms 12;ll128:--mode ll --num-tokens 128;ll128proxy:--mode ll --num-tokens 128 --force-proxy}"
      for rep in $(seq ${COMPARE_REPS:-2}); do
        for bench in "${benches[@]}"; do
          label=${bench%%:*}; flags=${bench#*:}
          for tree in $( (( rep % 2 )) && echo $trees || echo $trees | tr ' ' '\n' | tac ); do
            PYTHONPATH=/tmp/cmp/${tree}_site UCCL_EP_JIT_CACHE_DIR=/tmp/uccl_ep_jit_$tree bounded 120 $PY $B $flags \
              --json "$OUT/cmp_${tree}_${label}_$rep.json" > "$OUT/cmp_${tree}_${label}_$rep.log" 2>&1 || \
              echo "  $tree $label rep $rep: rc $? ($(tail -1 "$OUT/cmp_${tree}_${label}_$rep.log" | cut -c1-160))"
          done
        done
      done
      for prof in ${COMPARE_PROFILE:-}; do
        what=${prof%%:*}; penv=$( [[ $prof == *:* ]] && echo "${prof#*:}" | tr , ' ' )
        for tree in $trees; do
          bounded 150 env $penv PYTHONPATH=/tmp/cmp/${tree}_site UCCL_EP_JIT_CACHE_DIR=/tmp/uccl_ep_jit_$tree \
            $PY tools/lab/profile_kernels.py $what > "$OUT/cmp_prof_${tree}_${what}.txt" 2>&1 || echo "  profile $tree $what: rc $?"
          grep -E "^rank 0" "$OUT/cmp_prof_${tree}_${what}.txt" | sed "s/^/$tree /"
        done
      done
      [ ${#benches[@]} -gt 0 ] && $PY tools/lab/compare_bench.py "$OUT" | tee "$OUT/compare.md"
      tar -czf "$OUT/compare.tgz" -C "$OUT" $(cd "$OUT" && ls cmp_*) && rm -f "$OUT"/cmp_* ;;
    regress)  # a bounded sweep of every GPU path's small tests (after changes outside the kernels: runtime,
              # Buffer, backends): LL NVLink, LL proxy, HT intranode (ring and copy engines), HT through the proxy
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      start_budget ${REGRESS_BUDGET_S:-300}
      PT="$PY -m pytest -x -q -p no:cacheprovider"
      bounded 120 $PT core/tests/gpu/test_cuda_ll.py -k "small or mask or graph or timeout" 2>&1 | tee "$OUT/regress_ll.log" | tail -2
      bounded 90 $PT core/tests/gpu/test_cuda_ll_proxy.py -k "small or graph" 2>&1 | tee "$OUT/regress_llproxy.log" | tail -2
      bounded 120 $PT core/tests/gpu/test_cuda_ht.py -k "small" 2>&1 | tee "$OUT/regress_ht.log" | tail -2 ;;
    htproxy)  # normal mode through the proxy (GPUs as nodes, ipc copy role): small tests, then the bench rows
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      start_budget ${HTPROXY_BUDGET_S:-520}
      NODES=$($PY -c "import torch; print(torch.cuda.device_count())")
      $PY tools/lab/precompile.py layout.cu ht/proxy/notify.cu ht/proxy/dispatch.cu ht/proxy/combine.cu \
        ht/proxy/forward_dispatch.cu ht/proxy/forward_combine.cu 2>&1 | tail -2
      [ "${HTPROXY_TESTS:-}" = none ] || bounded 240 $PY -m pytest core/tests/gpu/test_cuda_ht_internode.py -x -q -p no:cacheprovider \
        -k "${HTPROXY_TESTS:-small and rpn1 or cuda_graph and rpn1 or timeout}" 2>&1 | tee "$OUT/htproxy_tests.log" | tail -6
      # runs: SMS:TOKENS[:RDMA_CHUNK[:PROXY_THREADS[:NIC_MODEL[:RDMA_RECV[:NVL_MB[:NODES]]]]]] (chunk / recv 0 = the
      # config table's, NVL_MB 0 = the size hint: the proxy region, which bounds the rings' depth; NODES: default
      # every GPU its own node); HTPROXY_ARGS: more bench flags for every run (e.g. --ht-dispatch fresh,worst);
      # HTPROXY_TESTS=none skips the tests
      declare -A seen=()
      for run in ${HTPROXY_RUNS:-24:4096 12:4096 24:1024 24:8192}; do
        IFS=: read -r sms tok chunk thr nic recv nvl nodes <<< "$run"; NODES_RUN=${nodes:-$NODES}
        seen[$run]=$(( ${seen[$run]:-0} + 1 )); rep=$( (( ${seen[$run]} > 1 )) && echo ${seen[$run]} )  # repeats: _2, _3 ...
        UCCL_EP_NUM_PROXY_THREADS=${thr:-4} bounded 120 $PY -m uccl_ep.cli.main bench --backend cuda --mode ht \
          --nodes "$NODES_RUN" --num-sms $sms --num-tokens $tok --rdma-chunk ${chunk:-0} --rdma-recv ${recv:-0} \
          --nvl-mb ${nvl:-0} --iters ${HTPROXY_ITERS:-20} ${nic:+--nic-model $nic} --warmup 3 --timeout 100 ${HTPROXY_ARGS:-} \
          --json "$OUT/htproxy_n${NODES_RUN}_${sms}_${tok}_${chunk:-0}_${thr:-4}${nic:+_$(tr -c 'A-Za-z0-9.\n' - <<< "$nic")}_${recv:-0}_${nvl:-0}${rep:+_$rep}.json" 2>&1 | tail -4
      done
      bundle htproxy 'htproxy_*' ;;
    scale)
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      start_budget ${SCALE_BUDGET_S:-520}
      G=$($PY -c "import torch; print(torch.cuda.device_count())")
      B="$PY -m uccl_ep.cli.main bench --backend cuda"
      PT="$PY -m pytest -x -q -p no:cacheprovider"
      echo "--- HT intranode EP$G"
      bounded 240 $PT "core/tests/gpu/test_cuda_ht.py::test_ht_matches_reference[small-ce]" \
        "core/tests/gpu/test_cuda_ht.py::test_ht_matches_reference[small-dce]" \
        "core/tests/gpu/test_cuda_ht.py::test_ht_matches_reference[small]" 2>&1 | tee "$OUT/scale_tests.log" | tail -3
      for sms in 24 12 8; do  # the default: combine by copy engines (Tuning.ht_combine_ce)
        bounded 90 $B --mode ht --num-sms $sms --iters 20 --warmup 3 --timeout 80 --json "$OUT/scale_ht_$sms.json" 2>&1 | tail -6
      done
      # the copy-engine dispatch at EP > 2 (Tuning.ht_dispatch_ce=auto is EP2-only until measured here)
      bounded 90 $B --tune ht_dispatch_ce=1 --mode ht --num-sms 12 --iters 20 --warmup 3 --timeout 80 \
        --json "$OUT/scale_ht_dce_12.json" 2>&1 | tail -6
      echo "--- LL NVLink EP$G"
      bounded 120 $PT "core/tests/gpu/test_cuda_ll.py::test_ll_options_match_reference[small]" 2>&1 | tee -a "$OUT/scale_tests.log" | tail -3
      bounded 60 $B --mode ll --num-tokens 128 --iters 50 --warmup 10 --json "$OUT/scale_ll_128.json" 2>&1 | tail -6
      echo "--- 2 nodes x $((G / 2)) through the proxy"
      bounded 150 $PT core/tests/gpu/test_cuda_ht_internode.py -k "small and rpn2 and kernel" 2>&1 | tee -a "$OUT/scale_tests.log" | tail -3
      bounded 90 $B --mode ht --nodes 2 --num-sms 24 --iters 20 --warmup 3 --timeout 80 --json "$OUT/scale_ht_2nodes_24.json" 2>&1 | tail -6
      echo "--- LL forced proxy EP$G"
      bounded 90 $B --mode ll --force-proxy --num-tokens 128 --iters 50 --warmup 10 --json "$OUT/scale_ll_proxy_128.json" 2>&1 | tail -6
      echo "--- deepseek-size tests"
      bounded 200 $PT "core/tests/gpu/test_cuda_ht.py::test_ht_matches_reference[deepseek]" \
        "core/tests/gpu/test_cuda_ll.py::test_ll_options_match_reference[deepseek]" 2>&1 | tee -a "$OUT/scale_tests.log" | tail -3
      echo "scale step: $(( SECONDS - t0 )) s" ;;
    sweep)
      start_budget ${SWEEP_BUDGET_S:-480}
      G=$($PY -c "import torch; print(torch.cuda.device_count())")
      for R in ${SWEEP_RANKS:-2 4}; do
        (( R > G )) && continue
        B="$PY -m uccl_ep.cli.main bench --backend cuda --ranks $R"
        for sms in ${SWEEP_SMS:-24 16 12 8}; do
          bounded 90 $B --mode ht --num-sms $sms --iters 30 --warmup 5 --timeout 80 --json "$OUT/sweep_r${R}_ht_$sms.json" 2>&1 | tail -6
        done
        for t in ${SWEEP_LL_TOKENS:-128 256 512}; do
          bounded 60 $B --mode ll --num-tokens $t --iters 50 --warmup 10 --timeout 55 --json "$OUT/sweep_r${R}_ll_$t.json" 2>&1 | tail -6
        done
      done
      echo "sweep step: $(( SECONDS - t0 )) s" ;;
    tune)
      export UCCL_EP_GPU_TIMEOUT_S=${UCCL_EP_GPU_TIMEOUT_S:-20} UCCL_EP_TIMEOUT_S=${UCCL_EP_TIMEOUT_S:-60}
      start_budget ${TUNE_BUDGET_S:-520}
      # default matrix: the shipped setting (16/16 warps, cp.async-staged combine 2 x 4), the register
      # pipeline it replaced (24 combine warps), 3 stages
      S=UCCL_EP_HT_COMBINE_STAGES
      CFGS=${TUNE_CONFIGS:-"d16c16:16/16:;reg24:16/24:$S=0;c16s3:16/16:$S=3"}
      PROF_DEFS="UCCL_EP_HT_PROF=1 ${TUNE_PROF_DEFINES:-}"
      [[ ${TUNE_PROF:-1} == 0 ]] || CFGS="$CFGS;prof:16/16:$PROF_DEFS"
      bounded 150 $PY tools/lab/precompile.py --jobs 8 --ht ${TUNE_RANKS:-2} "$CFGS" 2>&1 | tail -3
      IFS=';' read -ra TC <<< "$CFGS"
      for sms in ${TUNE_SMS:-24}; do
        for cfg in "${TC[@]}"; do
          IFS=: read -r label warps defs <<< "$cfg"
          [[ $label == prof ]] && continue
          IFS=/ read -r dw cw <<< "$warps"
          echo "--- $label (warps $warps; $defs) $sms SMs, $(left) s left"
          bounded 75 $PY -m uccl_ep.cli.main bench --backend cuda \
            --tune ht_warps=$dw --tune ht_combine_warps=${cw:-0} --tune "ht_defines=$defs" \
            --ranks ${TUNE_RANKS:-2} --mode ht --num-sms $sms --iters ${TUNE_ITERS:-10} --warmup 3 --timeout 70 \
            --json "$OUT/ht_tune_${label}_${sms}.json" 2>&1 | grep -E "dispatch|combine" | tail -3
        done
      done
      $PY tools/lab/summarize_ht_tune.py "$OUT" | tee "$OUT/ht_tune.md"
      if [[ ${TUNE_PROF:-1} != 0 ]]; then
        bounded 75 $PY -m uccl_ep.cli.main bench --tune ht_warps=16 --tune ht_combine_warps=16 \
          --tune "ht_defines=$PROF_DEFS" --backend cuda --ranks ${TUNE_RANKS:-2} --mode ht --num-sms 24 --iters 10 --warmup 3 --timeout 70 --no-check \
          > "$OUT/ht_prof.log" 2>&1
        grep HTPROF "$OUT/ht_prof.log" | awk '{print $2}' | sort | uniq -c
        for k in ht_dispatch ht_combine; do grep "HTPROF $k rank 0" "$OUT/ht_prof.log" | tail -4; done
      fi
      echo "tune step: $(( SECONDS - t0 )) s" ;;
    matrix)
      m=${MATRIX:-ht}; so=.anchors/deepep-v1/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so
      [[ -f $so.xz && ! -f $so ]] && chmod -R u+w .anchors/deepep-v1 && xz -dk "$so.xz"  # the copy keeps read-only modes
      PYTHONPATH=$PWD/.anchors/deepep-v1${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 $(( ${MATRIX_BUDGET_S:-420} + 150 )) \
        $PY -m uccl_ep.cli.main bench --backend cuda --matrix "$m" --deepep "${MATRIX_DEEPEP:-require}" \
        --matrix-budget "${MATRIX_BUDGET_S:-420}" --matrix-row-budget 30 ${MATRIX_ARGS:-} \
        --json "$OUT/matrix_$m.json" --plot "$OUT/matrix_$m.png" > "$OUT/matrix_$m.log" 2>&1
      echo "rc=$?"; grep -E "DeepEP: |rows measured|FAILED|Error|error" "$OUT/matrix_$m.log" | cut -c1-300 | tail -20 ;;
    eager)  # issue 30: host time of eager calls, uccl-ep and DeepEP V1 (.anchors, as `matrix`) in one call:
            # tools/lab/host_path.py EAGER_WHAT (default ll) for each library, one process each, alternating
            # (EAGER_REPS, default 2); then the LL bench rows (eager and graph) -> $OUT/eager_*.log
      so=.anchors/deepep-v1/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so
      [[ -f $so.xz && ! -f $so ]] && chmod -R u+w .anchors/deepep-v1 && xz -dk "$so.xz"
      $PY -c "from uccl_ep.cuda import native_ops as n; print('torch ops:', n.unavailable_reason() or 'loaded')"
      for rep in $(seq ${EAGER_REPS:-2}); do
        for lib in uccl uccl-python deepep; do  # uccl-python: the LL engine without its torch ops
          PYTHONPATH=$PWD/.anchors/deepep-v1${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 240 \
            $PY tools/lab/host_path.py ${EAGER_WHAT:-ll} ${lib%-python} \
            $( [[ $lib == uccl-python ]] && echo --python-path ) > "$OUT/eager_${lib}_$rep.log" 2>&1 || echo "  $lib rep $rep: rc $?"
          grep -E "^[0-9]+ +(uccl|deepep)" "$OUT/eager_${lib}_$rep.log" | sed "s/^/rep $rep $lib /"
        done
      done
      for t in 128 64; do
        PYTHONPATH=$PWD/.anchors/deepep-v1${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 240 $PY -m uccl_ep.cli.main bench \
          --backend cuda --mode ll --num-tokens $t --iters 30 --warmup 5 --json "$OUT/eager_bench_ll$t.json" \
          > "$OUT/eager_bench_ll$t.log" 2>&1 || echo "  bench ll $t: rc $?"
        tail -8 "$OUT/eager_bench_ll$t.log"
      done ;;
    sanitize)
      UCCL_EP_SANITIZE_SMALL=1 timeout 300 compute-sanitizer --tool memcheck --target-processes all \
        $PY core/tests/gpu/test_cuda_ll.py small 2>&1 | tail -30 | tee "$OUT/sanitize.log" ;;
  esac
done
