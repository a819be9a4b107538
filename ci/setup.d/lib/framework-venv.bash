# Shared by ci/setup.d/40-sglang.sh and 41-vllm.sh (sourced, not run): a framework venv LAYERED on
# .venv, so the 2-core CI machine does not install a second and third torch + CUDA stack.
#
# layered_venv DIR        create DIR (if missing) with .venv's interpreter, and a .pth that puts
#                         .venv's site-packages after DIR's own (torch 2.11 + uccl_ep come from
#                         there; packages installed in DIR win)
# pin_install DIR REQ...  pip install --no-deps -r each REQ into DIR (no resolver: fast, exact)
# plugin_install DIR SRC  editable install of a plugin distribution (entry points under test)
#
# NOTES: never run a resolving `pip install` / `pip uninstall` in a layered venv: pip sees .venv's
# packages through the .pth and would try to replace them (it refuses to touch files outside the
# venv, but the result is a half-installed mix). Everything here is --no-deps on pinned lists.

framework_log() { printf '\033[1m[setup %s]\033[0m %s\n' "$FRAMEWORK" "$*"; }

layered_venv() {
  local dir=$1 base_site site
  base_site=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [[ ! -x $dir/bin/python ]]; then
    framework_log "venv: creating ${dir#"$ROOT"/} (layered on .venv)"
    "$(readlink -f "$ROOT/.venv/bin/python")" -m venv "$dir"
  fi
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # `import site; site.addsitedir(...)` rather than a bare path line, so .venv's own .pth files run
  # as well: uccl_ep is an editable install whose import finder one of them registers.
  echo "import site; site.addsitedir('$base_site')" > "$site/zz_uccl_ep_base_venv.pth"
}

pin_install() {
  local dir=$1; shift
  local req
  for req in "$@"; do
    framework_log "pip: ${req#"$ROOT"/} (--no-deps)"
    "$dir/bin/python" -m pip install -q --no-deps -r "$req"
  done
}

plugin_install() {
  local dir=$1 src=$2 out
  framework_log "pip: $src (editable)"
  if ! out=$("$dir/bin/python" -m pip install -q --no-deps -e "$src" 2>&1); then
    printf '%s\n' "$out" >&2
    return 1
  fi
}
