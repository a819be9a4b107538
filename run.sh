#!/usr/bin/env bash
# The main job: set up (idempotent), then `uccl-ep bench` on local ranks (every GPU, else 2 CPU ranks).
# Extra arguments go to `uccl-ep bench`, e.g. ./run.sh --mode ll
set -euo pipefail
cd "$(dirname "$0")"
ci/setup.sh
exec .venv/bin/uccl-ep bench "$@"
