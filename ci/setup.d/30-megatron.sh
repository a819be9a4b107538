#!/usr/bin/env bash
# Framework integrations for the test suite (ci/test.d/30-megatron.sh): installs the
# uccl-ep-megatron and uccl-ep-primus distributions into the venv in editable mode (their
# console scripts and metadata are under test). deep-ep-uccl is NOT installed: it owns the import
# name `deep_ep`, which would change what other areas' tests see; its tests use PYTHONPATH.
# Megatron-Core 0.19.2 (newest of the tested window) is unpacked by ci/setup.sh --test
# (.cache/megatron-core-0.19.2); the oldest, 0.19.0, is unpacked here the same way (its wheel says
# Python >= 3.12, the sources run on 3.11) for integrations/megatron/tests' oldest-release run.
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

if [[ ${WANT_TEST:-1} == 1 ]]; then
  MC_OLD=.cache/megatron-core-0.19.0
  if [[ ! -d $MC_OLD/megatron ]]; then
    log "fetch: megatron-core 0.19.0 sources (oldest of the tested window)"
    mkdir -p .cache/wheels "$MC_OLD"
    "$VPY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .cache/wheels megatron-core==0.19.0
    "$VPY" - <<'PY'
import glob, zipfile
whl = sorted(glob.glob(".cache/wheels/megatron_core-0.19.0-*.whl"))[-1]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("megatron/") and name.endswith(".py"):
            z.extract(name, ".cache/megatron-core-0.19.0")
PY
  fi
fi
