#!/usr/bin/env bash
# Framework integrations for the test suite (ci/test.d/30-megatron.sh): installs the
# uccl-ep-megatron and uccl-ep-primus distributions into the venv in editable mode (their
# console scripts and metadata are under test). deep-ep-uccl is NOT installed: it owns the import
# name `deep_ep`, which would change what other areas' tests see; its tests use PYTHONPATH.
# Megatron-Core 0.19.2 itself is unpacked by ci/setup.sh --test (.cache/megatron-core-0.19.2).
# Idempotent: reinstalls only when a pyproject.toml changed or the import fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VPY:-$PWD/.venv/bin/python}
log() { printf '\033[1m[setup megatron]\033[0m %s\n' "$*"; }

for dist in megatron:uccl_ep_megatron primus:uccl_ep_primus; do
  dir=integrations/${dist%%:*}
  module=${dist##*:}
  stamp=.venv/.uccl-ep-${dist%%:*}-$(sha256sum "$dir/pyproject.toml" | cut -c1-16)
  if [[ ! -f $stamp ]] || ! "$VPY" -c "import $module" 2>/dev/null; then
    log "pip: installing $dir (editable)"
    # build-backend deprecation chatter is only shown when the install fails
    if ! out=$("$VPY" -m pip install -q --no-deps -e "$dir" 2>&1); then printf '%s\n' "$out" >&2; exit 1; fi
    rm -f .venv/.uccl-ep-"${dist%%:*}"-*
    touch "$stamp"
  fi
done
