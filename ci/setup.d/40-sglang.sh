#!/usr/bin/env bash
# SGLang integration venv for ci/test.d/40-sglang.sh: .venv-sglang (git-ignored).
#
# What is installed, and why not `pip install sglang==0.5.23`:
#   A full install is ~11 GB (torch 2.14.1 + CUDA wheels, flashinfer, sglang-kernel, ...), took
#   3:55 cold on the 2-core CI machine, and vLLM's takes 6:38 more, which does not fit the 15-minute
#   budget of both integrations (see docs/sglang.md "CI"). So .venv-sglang is a venv LAYERED on
#   .venv (a .pth puts .venv's site-packages after its own: torch 2.11 + uccl_ep, built by
#   ci/setup.sh), plus the real sglang 0.5.23 wheel and the pinned smallest dependency set under
#   which its server-args resolution, plugin loader and DeepEP dispatcher run on CPU
#   (integrations/sglang/ci-requirements.txt), all with --no-deps: no resolver, ~550 MB, ~1 min.
#   Not installed: sglang's torch 2.14.1 pin (torch 2.11 is used, as on the GPU machine), the CUDA
#   wheels, flashinfer, sglang-kernel, DeepGEMM. sgl-deep-ep is installed (it is the `deep_ep`
#   SGLang ships; on CPU its import fails, which the plugin must cope with).
#   The older plugin-era release tested, 0.5.12, is unpacked (--no-deps --target) into
#   .venv-sglang/alt/sglang-0.5.12 and put first on PYTHONPATH by its tests.
# Idempotent: redone only when a stamp input changed or an import fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VENV=$ROOT/.venv-sglang
BASE_SITE=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
REQ=integrations/sglang/ci-requirements.txt
REQ_OLD=integrations/sglang/ci-requirements-0.5.12.txt
OLD_VERSION=0.5.12
log() { printf '\033[1m[setup sglang]\033[0m %s\n' "$*"; }

stamp_inputs() { cat "$REQ" "$REQ_OLD" integrations/sglang/pyproject.toml ci/setup.d/40-sglang.sh; echo "$BASE_SITE"; }
STAMP=$VENV/.stamp-$(stamp_inputs | sha256sum | cut -c1-16)
if [[ -f $STAMP ]] && "$VENV/bin/python" -c 'import sglang, uccl_ep, uccl_ep_sglang, torch' 2>/dev/null \
   && [[ -d $VENV/alt/sglang-$OLD_VERSION/sglang ]]; then
  exit 0
fi

t0=$SECONDS
if [[ ! -x $VENV/bin/python ]]; then
  log "venv: creating .venv-sglang (layered on .venv)"
  "$(readlink -f "$ROOT/.venv/bin/python")" -m venv "$VENV"
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# NOTES: `import site; site.addsitedir(...)` (not a bare path line) so .venv's own .pth files run
# too: uccl_ep is an editable install whose finder is registered by one. addsitedir appends, so
# packages installed in .venv-sglang win over .venv's.
echo "import site; site.addsitedir('$BASE_SITE')" > "$SITE/zz_uccl_ep_base_venv.pth"

log "pip: sglang 0.5.23 + pinned CPU-test dependencies (--no-deps)"
"$VENV/bin/python" -m pip install -q --no-deps -r "$REQ"
log "pip: uccl-ep-sglang (editable)"
if ! out=$("$VENV/bin/python" -m pip install -q --no-deps -e integrations/sglang 2>&1); then
  printf '%s\n' "$out" >&2; exit 1
fi
log "pip: sglang $OLD_VERSION unpacked into .venv-sglang/alt (older plugin-era release, --no-deps --target)"
rm -rf "$VENV/alt/sglang-$OLD_VERSION"
"$VENV/bin/python" -m pip install -q --no-deps --target "$VENV/alt/sglang-$OLD_VERSION" -r "$REQ_OLD"
rm -f "$VENV"/.stamp-*
touch "$STAMP"
log "ready in $((SECONDS - t0)) s: $("$VENV/bin/python" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__)')"
