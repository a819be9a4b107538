#!/usr/bin/env bash
# The ops suite (tests/ops): recipes and renderers, then real launches on a throw-away lab on this
# host (2-node Slurm, 2-node Ray, Docker engine). The lab lives in a fresh temp dir and is torn
# down on any exit, even if pytest is killed by the outer timeout.
set -euo pipefail
cd "$(dirname "$0")/../.."
LAB=$(mktemp -d /tmp/ueoXXXX)
cleanup() {
  LAB=$LAB timeout 300 bash tests/ops/lab.sh down >/dev/null 2>&1 || true
  rm -rf "$LAB"
}
trap cleanup EXIT
start=$SECONDS
UCCL_EP_OPS_LAB=$LAB timeout 1800 .venv/bin/python -m pytest tests/ops -q -p no:cacheprovider --timeout 900
echo "ops suite: $((SECONDS - start)) s"
