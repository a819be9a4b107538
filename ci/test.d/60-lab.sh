#!/usr/bin/env bash
# The lab tools' own logic (tools/lab/tests): what the summary and precompile scripts read and build,
# and that the device script names only files that exist. No GPU; seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VPY:-$PWD/.venv/bin/python}
exec "$VPY" -m pytest -q -p no:cacheprovider tools/lab/tests "$@"
