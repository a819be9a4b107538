#!/usr/bin/env bash
# The test suite: set up (idempotent), then every test this machine's hardware allows
# (cpu always; gpu / multi_gpu when CUDA devices are present), then each area's suite in
# ci/test.d/ (framework integrations in their own venvs, ops tools). Extra arguments go to the
# core pytest run.
set -euo pipefail
cd "$(dirname "$0")"
ci/setup.sh --test
.venv/bin/python -m pytest core/tests -q "$@"
for suite in ci/test.d/*.sh; do
  [[ -e "$suite" ]] || continue
  echo "=== $suite"
  bash "$suite"
done
