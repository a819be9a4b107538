#!/usr/bin/env bash
# SGLang integration on CPU, in .venv-sglang (ci/setup.d/40-sglang.sh): the uccl-ep-sglang plugin
# with SGLang 0.5.23 and 0.5.12 (parser, resolution, errors, process flag, dispatcher swap in fresh
# and spawned processes, plugin_status) and SGLang's own DeepEPDispatcher (normal, low-latency,
# auto, --deepep-config, two-batch overlap) driving uccl_ep on 2 gloo ranks on the host executor,
# plus one reference-executor (oracle) run; pytest's summary lists the executor of each run.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv-sglang/bin/python -m pytest -q -p no:cacheprovider -W ignore::UserWarning -W ignore::DeprecationWarning \
  integrations/sglang/tests "$@"
