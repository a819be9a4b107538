#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine (or a dev box) for uccl-ep:
#   system packages (apt), a Python venv in .venv/, torch + build tools (pip), uccl-ep (editable),
#   uccl-ep-deploy (editable: `uccl-ep launch`).
# Usage: ci/setup.sh [--test]    (--test also fetches what the test suite needs)
# Re-running is cheap: each step checks whether it is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WANT_TEST=0
[[ "${1:-}" == "--test" ]] && WANT_TEST=1

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# --- system packages ---------------------------------------------------------------------------
APT_PKGS=(build-essential cmake ninja-build python3-venv python3-dev libfabric1 libfabric-dev libfabric-bin pciutils)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- python venv -------------------------------------------------------------------------------
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null; then
      PY=$cand; break
    fi
  done
fi
[[ -n "$PY" ]] || { echo "uccl-ep needs Python >= 3.11" >&2; exit 1; }
if [[ ! -x .venv/bin/python ]]; then
  log "venv: creating .venv with $PY"
  "$PY" -m venv .venv
fi
VPY=$ROOT/.venv/bin/python

stamp_of() { cat ci/constraints.txt core/pyproject.toml core/CMakeLists.txt | sha256sum | cut -c1-16; }
STAMP=.venv/.uccl-ep-deps-$(stamp_of)
if [[ ! -f $STAMP ]]; then
  log "pip: installing torch and build tools (ci/constraints.txt)"
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q -r ci/constraints.txt
  rm -f .venv/.uccl-ep-deps-*
  touch "$STAMP"
fi

# --- uccl-ep itself (editable: Python edits apply at once; C++ edits rebuild on re-run) -------
SRC_STAMP=.venv/.uccl-ep-src-$(find core/csrc core/kernels core/CMakeLists.txt core/pyproject.toml -type f \
  -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-16)
if [[ ! -f $SRC_STAMP ]] || ! "$VPY" -c 'import uccl_ep._C' 2>/dev/null; then
  log "pip: building uccl-ep (core/)"
  "$VPY" -m pip install -q --no-build-isolation -e core
  rm -f .venv/.uccl-ep-src-*
  touch "$SRC_STAMP"
fi

# --- the launcher (deploy/: `uccl-ep launch` and the recipes; its own distribution) ------------
DEPLOY_STAMP=.venv/.uccl-ep-deploy-$(sha256sum deploy/pyproject.toml | cut -c1-16)
if [[ ! -f $DEPLOY_STAMP ]] || ! "$VPY" -c 'import uccl_ep_deploy' 2>/dev/null; then
  log "pip: installing uccl-ep-deploy (deploy/, editable)"
  "$VPY" -m pip install -q -e ./deploy
  rm -f .venv/.uccl-ep-deploy-*
  touch "$DEPLOY_STAMP"
fi

if ((WANT_TEST)); then
  # Megatron-Core 0.19.2 for the contract test: its wheel says Python >= 3.12 but the sources run
  # on 3.11, so it is unpacked next to the venv and put on PYTHONPATH by the test.
  MC_DIR=.cache/megatron-core-0.19.2
  if [[ ! -d $MC_DIR/megatron ]]; then
    log "fetch: megatron-core 0.19.2 sources"
    mkdir -p .cache/wheels "$MC_DIR"
    "$VPY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      -d .cache/wheels megatron-core==0.19.2
    "$VPY" - <<'PY'
import glob, zipfile
whl = sorted(glob.glob(".cache/wheels/megatron_core-0.19.2-*.whl"))[-1]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("megatron/") and name.endswith(".py"):
            z.extract(name, ".cache/megatron-core-0.19.2")
PY
  fi
fi
# Areas (integrations, ops, GPU toolchains) add their own idempotent steps as ci/setup.d/NN-name.sh;
# each gets the same arguments as this script and ROOT/VPY in its environment.
export ROOT VPY WANT_TEST
for step in ci/setup.d/*.sh; do
  [[ -e "$step" ]] || continue
  bash "$step" "$@"
done
log "ready: $($VPY -c 'import uccl_ep, torch; print("uccl_ep", uccl_ep.__version__, "torch", torch.__version__)')"
