"""The JIT's contract without a GPU: nvcc discovery, the cache key, atomic publish, races."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import stat
import textwrap
from pathlib import Path

import pytest

from uccl_ep.cuda import jit
from uccl_ep.errors import MissingDependency

FAKE_NVCC = textwrap.dedent("""\
    #!/usr/bin/env bash
    # Stand-in for nvcc: `--version` prints a version; otherwise writes the -o target after a pause
    # and appends one line per compilation to $FAKE_NVCC_LOG.
    if [[ "$1" == "--version" ]]; then echo "Cuda compilation tools, release 99.9 (fake)"; exit 0; fi
    out=""; prev=""
    for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; done
    [[ -n "${FAKE_NVCC_FAIL:-}" ]] && { echo "fake nvcc: error in kernel" >&2; exit 2; }
    sleep "${FAKE_NVCC_SLEEP:-0}"
    echo "$$" >> "$FAKE_NVCC_LOG"
    printf 'CUBIN:%s' "$*" > "$out"
""")


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "nvcc"
    path.parent.mkdir()
    path.write_text(FAKE_NVCC)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "nvcc.log"
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    return path, log


def _calls(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def test_include_closure_follows_project_headers_only():
    src = jit.kernel_dir() / "ll/nvlink/dispatch.cu"
    names = {p.name for p in jit.include_closure(src, [jit.include_dir()])}
    # direct and nested (block.cuh -> arch.cuh; wait.cuh -> kernel_abi.h) project headers
    assert {"block.cuh", "numeric.cuh", "wait.cuh", "arch.cuh", "kernel_abi.h"} <= names
    assert not any(n.startswith("cuda") for n in names), "system headers are covered by nvcc's version"


def test_cache_key_covers_source_headers_flags_arch_and_version(tmp_path):
    tree = tmp_path / "kernels"
    shutil.copytree(jit.kernel_dir(), tree)
    src, inc = tree / "ll/nvlink/combine.cu", [tree / "include"]
    flags = jit.default_flags("sm_90a")

    def key(**kw):
        return jit.cache_key(kw.get("src", src), jit.include_closure(src, inc), kw.get("flags", flags),
                             kw.get("arch", "sm_90a"), kw.get("version", "v1"))

    base = key()
    assert base == key(), "the key is deterministic"
    assert key(arch="sm_100a") != base
    assert key(version="v2") != base
    assert key(flags=flags + ["-DX=1"]) != base
    nested = tree / "include" / "uccl_ep" / "device" / "arch.cuh"   # included only indirectly
    nested.write_text(nested.read_text() + "\n// edited\n")
    assert key() != base, "an edit to a nested header must change the key"


def test_find_nvcc_env_override_and_missing(tmp_path, monkeypatch, fake_nvcc):
    path, _ = fake_nvcc
    monkeypatch.setenv("UCCL_EP_NVCC", str(path))
    assert jit.find_nvcc() == path
    monkeypatch.setenv("UCCL_EP_NVCC", str(tmp_path / "nope" / "nvcc"))
    with pytest.raises(MissingDependency) as e:
        jit.find_nvcc()
    assert "nope" in str(e.value) and "nvidia-cuda-nvcc" in str(e.value)


def test_nothing_found_names_what_to_install(monkeypatch):
    monkeypatch.delenv("UCCL_EP_NVCC", raising=False)
    monkeypatch.setattr(jit, "_nvcc_candidates", lambda: [])
    with pytest.raises(MissingDependency, match="pip install nvidia-cuda-nvcc"):
        jit.find_nvcc()


def test_compile_caches_and_publishes_atomically(tmp_path, fake_nvcc):
    nvcc, log = fake_nvcc
    cache = tmp_path / "cache"
    out = jit.compile_cubin("ll/nvlink/combine.cu", "sm_90a", nvcc=nvcc, cache_dir=cache)
    assert out.read_text().startswith("CUBIN:") and "-arch=sm_90a" in out.read_text()
    assert _calls(log) == 1
    assert jit.compile_cubin("ll/nvlink/combine.cu", "sm_90a", nvcc=nvcc, cache_dir=cache) == out
    assert _calls(log) == 1, "a cached result is not recompiled"
    other = jit.compile_cubin("ll/nvlink/combine.cu", "sm_100a", nvcc=nvcc, cache_dir=cache)
    assert other != out and _calls(log) == 2
    assert not [p for p in cache.iterdir() if p.name.startswith(".build-")], "no temporaries left behind"


def test_sources_of_one_name_in_two_folders_stay_apart(tmp_path, fake_nvcc):
    """ll/nvlink/combine.cu and ll/proxy/combine.cu: the folders are part of the cache key and of the
    cached file's name, and a name that leaves core/kernels is refused."""
    nvcc, log = fake_nvcc
    a = jit.compile_cubin("ll/nvlink/combine.cu", "sm_90a", nvcc=nvcc, cache_dir=tmp_path)
    b = jit.compile_cubin("ll/proxy/combine.cu", "sm_90a", nvcc=nvcc, cache_dir=tmp_path)
    assert a.name.startswith("ll_nvlink_combine-sm_90a-") and b.name.startswith("ll_proxy_combine-sm_90a-")
    assert _calls(log) == 2
    tree = tmp_path / "tree"
    for sub in ("x", "y"):
        (tree / sub).mkdir(parents=True)
        (tree / sub / "k.cu").write_text("same text\n")
    # outside core/kernels only the file name counts; inside, the path does
    assert jit.cache_key(tree / "x" / "k.cu", [], [], "sm_90a", "v") == jit.cache_key(tree / "y" / "k.cu", [], [],
                                                                                      "sm_90a", "v")
    assert jit.relative_source(jit.kernel_dir() / "ll" / "proxy" / "combine.cu") == "ll/proxy/combine.cu"
    with pytest.raises(ValueError, match="expected a path under"):
        jit.compile_cubin("../../setup.py", "sm_90a", nvcc=nvcc, cache_dir=tmp_path)


def test_compile_failure_reports_stderr(tmp_path, fake_nvcc, monkeypatch):
    nvcc, _ = fake_nvcc
    monkeypatch.setenv("FAKE_NVCC_FAIL", "1")
    with pytest.raises(RuntimeError, match="fake nvcc: error in kernel"):
        jit.compile_cubin("ll/nvlink/combine.cu", "sm_90a", nvcc=nvcc, cache_dir=tmp_path / "c")
    assert not list((tmp_path / "c").glob("*.cubin")), "a failed compile publishes nothing"


def _race(args):
    nvcc, cache = args
    return str(jit.compile_cubin("ll/nvlink/dispatch.cu", "sm_90a", nvcc=Path(nvcc), cache_dir=Path(cache)))


def test_racing_ranks_compile_once_and_share_the_result(tmp_path, fake_nvcc, monkeypatch):
    nvcc, log = fake_nvcc
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.5")
    cache = tmp_path / "shared"
    with mp.get_context("spawn").Pool(4) as pool:
        outs = pool.map(_race, [(str(nvcc), str(cache))] * 4, chunksize=1)
    assert len(set(outs)) == 1
    assert _calls(log) == 1, "the lock lets exactly one rank compile"
    assert len(list(cache.glob("*.cubin"))) == 1


def test_arch_names():
    assert jit.arch_for_capability(9, 0) == "sm_90a"
    assert jit.arch_for_capability(10, 0) == "sm_100a"
    assert jit.arch_for_capability(8, 0) == "sm_80"


def test_param_structs_pack_from_the_header():
    from uccl_ep.cuda import runtime
    for name in ("LLDispatchParams", "LLDispatchRecvParams", "LLCombineParams", "LLCombineRecvParams",
                 "HTLayoutParams", "HTNotifyParams", "HTDispatchParams", "HTCombineParams"):
        fields = runtime.param_fields(name)
        assert fields and len(set(fields)) == len(fields)
        blob = runtime.pack_params(name, **{f: i for i, f in enumerate(fields)})
        assert len(blob) == 8 * len(fields)
        assert int.from_bytes(blob[-8:], "little") == len(fields) - 1
    with pytest.raises(TypeError, match="missing"):
        runtime.pack_params("HTLayoutParams", topk_idx=0)


def test_param_templates_pack_what_pack_params_packs():
    """A template (fixed fields once, the per-call ones at each pack) gives pack_params' bytes, for
    random values and any choice of per-call fields; a nested struct's fields fixed as a dict."""
    import random
    from uccl_ep.cuda import runtime
    rng = random.Random(11)
    for name in ("LLDispatchParams", "LLDispatchRecvParams", "LLProxyCombineRecvParams", "HTDispatchParams"):
        fields = runtime.param_fields(name)
        for _ in range(20):
            values = {f: rng.randrange(-(1 << 40), 1 << 40) if f in ("timeout_ns",) else rng.randrange(1 << 62)
                      for f in fields}
            per_call = tuple(rng.sample(fields, rng.randrange(len(fields) + 1)))
            nested: dict = {}
            for f, v in values.items():
                if f in per_call:
                    continue
                top, _, sub = f.partition(".")
                if sub:
                    nested.setdefault(top, {})[sub] = v
                else:
                    nested[f] = v
            template = runtime.ParamTemplate(name, per_call, **nested)
            assert template.pack(*(values[f] for f in per_call)) == runtime.pack_params(name, **values)
    fields = runtime.param_fields("HTLayoutParams")
    with pytest.raises(TypeError, match="missing"):
        runtime.ParamTemplate("HTLayoutParams", (fields[0],))
    with pytest.raises(TypeError, match="unknown"):
        runtime.ParamTemplate("HTLayoutParams", (), bogus=1, **{f: 0 for f in fields})
    with pytest.raises(TypeError, match="both fixed and per call"):
        runtime.ParamTemplate("HTLayoutParams", (fields[0],), **{f: 0 for f in fields})
    with pytest.raises(Exception):  # struct refuses a float where an integer goes
        runtime.ParamTemplate("HTLayoutParams", (), **{f: 0.5 for f in fields})
    template = runtime.ParamTemplate("HTLayoutParams", fields[:2], **{f: 0 for f in fields[2:]})
    with pytest.raises(TypeError, match="2 per-call fields"):
        template.pack(1)


def test_param_caches_of_the_normal_mode_engines_pack_what_pack_params_packs():
    """The HT engines' ParamCaches (ring dispatch and combine, copy-engine begin and combine) cover
    their structs' fields, and give pack_params' bytes call after call while the fixed values and
    the pointers change; a fixed value that changes makes a new template, never reuses a stale one."""
    import random
    from uccl_ep.cuda import ht, ht_ce, runtime
    rng = random.Random(5)
    for name, pointers, fixed in (("HTNotifyParams", ht.NOTIFY_POINTERS, ht.NOTIFY_FIXED),
                                  ("HTDispatchParams", ht.DISPATCH_POINTERS, ht.DISPATCH_FIXED),
                                  ("HTCombineParams", ht.COMBINE_POINTERS, ht.COMBINE_FIXED),
                                  ("HTCEBeginParams", (), ht_ce.BEGIN_FIXED),
                                  ("HTCombineCEParams", ht_ce.COMBINE_POINTERS, ht_ce.COMBINE_FIXED)):
        cache = runtime.ParamCache(name, pointers, fixed, limit=4)
        shapes = [tuple(rng.randrange(1 << 40) for _ in fixed) for _ in range(6)]
        for _ in range(40):
            fixed_values = list(rng.choice(shapes))
            if rng.random() < 0.3:  # one fixed field differs from every earlier call
                i = rng.randrange(len(fixed))
                fixed_values[i] = rng.randrange(1 << 40) + (1 << 41)
            ptrs = [rng.randrange(1 << 62) for _ in pointers]
            values = dict(zip(fixed, fixed_values)) | dict(zip(pointers, ptrs))
            assert cache.pack(tuple(fixed_values), *ptrs) == runtime.pack_params(name, **values), name
    fields = runtime.param_fields("HTLayoutParams")
    with pytest.raises(TypeError, match="missing"):
        runtime.ParamCache("HTLayoutParams", tuple(fields[:1]), tuple(fields[2:]))
    with pytest.raises(TypeError, match="twice"):
        runtime.ParamCache("HTLayoutParams", tuple(fields[:2]), tuple(fields[1:]))
    cache = runtime.ParamCache("HTLayoutParams", tuple(fields[:2]), tuple(fields[2:]))
    with pytest.raises(TypeError, match="fixed fields"):
        cache.pack((0,), 1, 2)


def test_driver_missing_is_reported_not_raised_at_import():
    from uccl_ep import _C
    ok, why = _C.cuda.available()
    if not ok:
        assert "libcuda" in why
        from uccl_ep.cuda.runtime import driver
        with pytest.raises(MissingDependency, match="libcuda"):
            driver()


def test_gfx_targets_compile_with_hipcc_into_code_objects(tmp_path, fake_nvcc, monkeypatch):
    """A gfx arch takes the HIP compiler (UCCL_EP_HIPCC, ...) with device-only HIP flags, the same
    cache rules, and a .hsaco code object; a missing hipcc names where it looked and what to install."""
    compiler, log = fake_nvcc
    monkeypatch.setenv("UCCL_EP_HIPCC", str(compiler))
    cache = tmp_path / "cache"
    out = jit.compile_cubin("ll/nvlink/combine.cu", "gfx942", cache_dir=cache)
    assert out.suffix == ".hsaco" and "gfx942" in out.name
    text = out.read_text()
    assert "--offload-arch=gfx942" in text and "--offload-device-only" in text and "-x hip" in text
    assert jit.compile_cubin("ll/nvlink/combine.cu", "gfx942", cache_dir=cache) == out and _calls(log) == 1
    assert jit.compile_cubin("ll/nvlink/combine.cu", "gfx950", cache_dir=cache) != out and _calls(log) == 2
    monkeypatch.setenv("UCCL_EP_HIPCC", str(tmp_path / "nope" / "hipcc"))
    with pytest.raises(MissingDependency, match="UCCL_EP_HIPCC: .*nope.*install ROCm"):
        jit.compile_cubin("ll/nvlink/combine.cu", "gfx942", cache_dir=cache / "other")


def test_amd_arch_names():
    assert jit.arch_for_gcn("gfx942:sramecc+:xnack-") == "gfx942"
    assert jit.arch_for_gcn("gfx950") == "gfx950"
    with pytest.raises(MissingDependency, match="UCCL_EP_CUDA_ARCH"):
        jit.arch_for_gcn("Instinct MI300X")
