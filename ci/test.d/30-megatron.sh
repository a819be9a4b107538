#!/usr/bin/env bash
# Framework integrations on CPU: Megatron-Core 0.19.2 and 0.19.0 (hook, launcher, flex dispatcher
# with --moe-flex-dispatcher-backend uccl on the host executor + one reference oracle run, the GPU
# example's training loop, --overlap-moe-expert-parallel-comm through Megatron's combined 1F1B
# schedule vs plain 1F1B), Primus-Turbo's EP backend registry (both generations, a rendered Primus
# recipe executed against the stand-ins), and the deep_ep drop-in. Runs in .venv (set up by
# ci/setup.sh --test + setup.d/30). pytest's summary lists the executor of each framework run.
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VPY:-$PWD/.venv/bin/python}
exec "$VPY" -m pytest -q -p no:cacheprovider -W ignore::UserWarning -W ignore::DeprecationWarning \
  integrations/megatron/tests integrations/primus/tests integrations/deep_ep/tests "$@"
