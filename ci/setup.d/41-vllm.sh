#!/usr/bin/env bash
# vLLM integration venv for ci/test.d/41-vllm.sh: .venv-vllm (git-ignored).
#
# A full vLLM 0.33.0 install (~9.4 GB: torch 2.14.0 + CUDA wheels, flashinfer, ...; and the
# certifi>=2026.10.19 pin the index does not serve yet, so only by hand: requirements with
# certifi 2026.10.18, then the wheel --no-deps) took 6:38 cold on the 2-core CI machine; with
# SGLang's it does not fit the 15-minute budget (docs/vllm.md, "CI"). So .venv-vllm is layered on
# .venv (lib/framework-venv.bash: torch 2.11 + uccl_ep from there) and gets, with --no-deps, the
# real vllm 0.33.0 wheel plus the pinned smallest set of dependencies under which its config, CLI
# kwargs, plugin loader, DeepEP all2all managers and DeepEP HT/LL prepare/finalize classes run on
# CPU (integrations/vllm/ci-requirements.txt). Not installed: vLLM's torch 2.14.0 pin (torch 2.11
# is used, as on the GPU machine), CUDA wheels, flashinfer, DeepGEMM, and any `deep_ep`.
# Idempotent: redone only when an input changed or an import fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD FRAMEWORK=vllm
source ci/setup.d/lib/framework-venv.bash
VENV=$ROOT/.venv-vllm
REQ=integrations/vllm/ci-requirements.txt

STAMP=$VENV/.stamp-$(cat "$REQ" integrations/vllm/pyproject.toml ci/setup.d/41-vllm.sh \
  ci/setup.d/lib/framework-venv.bash | sha256sum | cut -c1-16)
if [[ -f $STAMP ]] && "$VENV/bin/python" -c 'import vllm.config.parallel, uccl_ep, uccl_ep_vllm' 2>/dev/null; then
  exit 0
fi
t0=$SECONDS
layered_venv "$VENV"
pin_install "$VENV" "$REQ"
plugin_install "$VENV" integrations/vllm
rm -f "$VENV"/.stamp-*
touch "$STAMP"
framework_log "ready in $((SECONDS - t0)) s: $("$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null)"
