#!/usr/bin/env bash
# SGLang integration venv for ci/test.d/40-sglang.sh: .venv-sglang (git-ignored).
#
# Why not `pip install sglang==0.5.23`: a full install is ~11 GB (torch 2.14.1 + CUDA wheels,
# flashinfer, sglang-kernel, ...) and took 3:55 cold on the 2-core CI machine, and vLLM's took
# 6:38 more: together they leave no room in the 15-minute budget of both integrations, and 20 GB
# of disk per clone (docs/sglang.md, "CI"). Instead .venv-sglang is layered on .venv
# (lib/framework-venv.bash: torch 2.11 + uccl_ep from there) and gets, with --no-deps, the real
# sglang 0.5.23 wheel plus the pinned smallest set of dependencies under which its server-args
# resolution, plugin loader and DeepEP dispatcher run on CPU (integrations/sglang/ci-requirements.txt;
# ~550 MB, under a minute). sgl-deep-ep, the `deep_ep` SGLang ships, is included (on CPU its import
# fails, which the plugin must cope with). Not installed: sglang's torch 2.14.1 pin (torch 2.11 is
# used, as on the GPU machine), the CUDA wheels, flashinfer, sglang-kernel, DeepGEMM.
# The older plugin-era release tested, 0.5.12, and the packages whose versions it needs are unpacked
# (--no-deps --target) into .venv-sglang/alt/sglang-0.5.12, put first on PYTHONPATH by its tests.
# Idempotent: redone only when an input changed or an import fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD FRAMEWORK=sglang
source ci/setup.d/lib/framework-venv.bash
VENV=$ROOT/.venv-sglang
REQ=integrations/sglang/ci-requirements.txt
REQ_OLD=integrations/sglang/ci-requirements-0.5.12.txt
ALT=$VENV/alt/sglang-0.5.12

STAMP=$VENV/.stamp-$(cat "$REQ" "$REQ_OLD" integrations/sglang/pyproject.toml ci/setup.d/40-sglang.sh \
  ci/setup.d/lib/framework-venv.bash | sha256sum | cut -c1-16)
if [[ -f $STAMP && -d $ALT/sglang ]] && "$VENV/bin/python" -c 'import sglang, uccl_ep, uccl_ep_sglang' 2>/dev/null; then
  exit 0
fi
t0=$SECONDS
layered_venv "$VENV"
pin_install "$VENV" "$REQ"
plugin_install "$VENV" integrations/sglang
framework_log "pip: ${REQ_OLD} into ${ALT#"$ROOT"/} (--no-deps --target)"
rm -rf "$ALT"
"$VENV/bin/python" -m pip install -q --no-deps --target "$ALT" -r "$REQ_OLD"
rm -f "$VENV"/.stamp-*
touch "$STAMP"
framework_log "ready in $((SECONDS - t0)) s: $("$VENV/bin/python" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__)' 2>/dev/null)"
