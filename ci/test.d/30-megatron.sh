#!/usr/bin/env bash
# Framework integrations on CPU: Megatron-Core 0.19.2 (hook, launcher, flex dispatcher with
# --moe-flex-dispatcher-backend uccl, the GPU example's training loop), Primus-Turbo's EP backend
# registry, and the deep_ep drop-in. Runs in .venv (set up by ci/setup.sh --test + setup.d/30).
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VPY:-$PWD/.venv/bin/python}
exec "$VPY" -m pytest -q -p no:cacheprovider -W ignore::UserWarning -W ignore::DeprecationWarning \
  integrations/megatron/tests integrations/primus/tests integrations/deep_ep/tests "$@"
