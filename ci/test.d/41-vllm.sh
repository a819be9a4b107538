#!/usr/bin/env bash
# vLLM integration on CPU, in .venv-vllm (ci/setup.d/41-vllm.sh): the uccl-ep-vllm plugin with vLLM
# 0.33.0 (CLI values, ParallelConfig, process flag, deep_ep alias, errors, plugin_status) and
# vLLM's own DeepEP HT/LL all2all managers + prepare/finalize classes driving uccl_ep on 2 gloo ranks
# on the host executor (uccl_* plugin route and the deep_ep drop-in under deepep_*), plus one
# reference-executor (oracle) run; vLLM's modular kernel (FusedMoEKernel) around those
# prepare/finalize classes with BF16, FP8 and UE8M0 dispatch, without and with DBO micro-batching.
# pytest's summary lists the executor of each run.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -W ignore::UserWarning -W ignore::DeprecationWarning \
  integrations/vllm/tests "$@"
