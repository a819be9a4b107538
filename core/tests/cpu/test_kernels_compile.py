"""Every kernel compiles for sm_90a and sm_100a (PyPI nvcc) and for gfx90a, gfx942 (MI300X) and gfx950
(MI355X) (Debian's clang 22, hip_toolchain.py) through the one warp/wavefront abstraction header,
and the kernel parameter ABI agrees with the Python packer. Nothing runs on a device. The toolchains
come from ci/setup.d/20-gpu-toolchain.sh; where they are absent the tests skip, except under CI,
where that is a failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hip_toolchain

from uccl_ep.cuda import ht_tuning, jit, runtime

KERNELS = jit.kernel_sources()


def _tool_or_skip(what: str, path):
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} missing on CI: ci/setup.d/20-gpu-toolchain.sh should have installed it")
        pytest.skip(f"{what} not installed (ci/setup.d/20-gpu-toolchain.sh installs it)")
    return path


def _nvcc():
    try:
        return jit.find_nvcc()
    except Exception:  # noqa: BLE001
        return None


def test_kernel_set():
    assert {"layout.cu", "ht/nvlink/notify.cu", "ht/nvlink/dispatch.cu", "ht/nvlink/combine.cu",
            "ht/proxy/notify.cu", "ht/proxy/dispatch.cu",
            "ht/proxy/combine.cu", "ht/proxy/forward_dispatch.cu", "ht/proxy/forward_combine.cu",
            "ll/nvlink/dispatch.cu", "ll/nvlink/combine.cu", "ll/proxy/dispatch.cu", "ll/proxy/combine.cu",
            "transport/copy_ring.cu"} <= set(KERNELS)


def test_kernels_are_filed_by_mode_and_path():
    """A kernel source sits in the folder of its mode and path (ht|ll / nvlink|proxy), under
    transport/ (the copy kernel), or at the top (layout.cu, shared by both modes)."""
    folders = {"", "ht/nvlink", "ht/proxy", "ll/nvlink", "ll/proxy", "transport"}
    misplaced = [k for k in KERNELS if k.rpartition("/")[0] not in folders]
    assert not misplaced, f"kernel sources outside {sorted(folders)}: {misplaced}"


@pytest.mark.parametrize("source", KERNELS)
def test_nvcc_sm90_sm100(source, tmp_path):
    nvcc = _tool_or_skip("nvcc", _nvcc())
    cmd = [str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-c",
           "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100a,code=sm_100a",
           "-DNDEBUG", str(jit.kernel_dir() / source), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


# Literal warp-size arithmetic on thread indices (a warp is 64 lanes on AMD): kernels use kWarpSize.
_WARP_32 = re.compile(r"\b(tid|threadIdx\.x|lane|n)\s*(\+\s*31\s*\))?\s*[/%]\s*32\b|\[\s*\w+\s*/\s*32\s*\]")


def test_kernels_use_the_warp_size_not_32():
    hits = []
    for path in sorted(jit.kernel_dir().rglob("*.cu*")):
        if path.name == "arch.cuh":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if _WARP_32.search(code):
                hits.append(f"{path.relative_to(jit.kernel_dir())}:{no}: {line.strip()}")
    assert not hits, "\n".join(hits)


# Vendor intrinsics and inline assembly: only arch.cuh may name them.
_VENDOR = re.compile(r"\basm\b|__nv_|__builtin_amdgcn|__hip_atomic|__shfl|__ballot|__ldcg|__ldg\b|__nanosleep|"
                     r"__syncwarp|__cvta|__activemask|__grid_constant__")


def test_vendor_code_lives_in_the_arch_header():
    hits = []
    for path in sorted(jit.kernel_dir().rglob("*.cu*")):
        if path.name == "arch.cuh":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if _VENDOR.search(line.split("//", 1)[0]):
                hits.append(f"{path.relative_to(jit.kernel_dir())}:{no}: {line.strip()}")
    assert not hits, "\n".join(hits)


def _hip_build(source: str, archs: tuple[str, ...], defines: tuple[str, ...] = ()) -> tuple[dict[str, bytes], str]:
    """Device code objects of core/kernels/<source> for `archs` (one clang call) and the compiler's
    stderr. NOTES: cached under ~/.cache/uccl_ep/ci-hip by the JIT's key (source, every header it
    includes, flags, targets, compiler version), with the stderr kept beside the code objects, so a
    rerun on the same machine re-checks the same outputs without recompiling."""
    clang = _tool_or_skip("clang-22 with Debian's HIP headers", hip_toolchain.clang())
    src = jit.kernel_dir() / source
    flags = ["-x", "hip", "-std=c++17", "-O3", *(f"--offload-arch={a}" for a in archs), "--offload-device-only",
             "--no-gpu-bundle-output", "-DNDEBUG", *(f"-D{d}" for d in defines), *hip_toolchain.compat_flags()]
    key = jit.cache_key(src, jit.include_closure(src, [jit.include_dir()]), flags, "+".join(archs),
                        jit.compiler_version(Path(clang)))
    cache = Path(os.path.expanduser("~/.cache/uccl_ep/ci-hip"))
    entry = cache / f"{source.removesuffix('.cu').replace('/', '_')}-{key}"
    if not entry.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=cache, prefix=".build-"))
        res = subprocess.run([clang, *flags, f"-I{jit.include_dir()}", str(src)], capture_output=True, text=True,
                             timeout=600, cwd=build)
        assert res.returncode == 0, res.stderr[-3000:]
        (build / "stderr.txt").write_text(res.stderr)
        try:
            build.rename(entry)  # atomic publish; a racing run's identical entry wins
        except OSError:
            shutil.rmtree(build, ignore_errors=True)
        for old in cache.iterdir():  # entries of kernel revisions nobody built for two weeks
            if old.is_dir() and time.time() - old.stat().st_mtime > 14 * 86400:
                shutil.rmtree(old, ignore_errors=True)
    os.utime(entry)  # used now: kept by the pruning above
    objects = {a: p.read_bytes() for a in archs for p in entry.glob(f"{src.stem}-hip-amdgcn-amd-amdhsa-{a}.*")}
    return objects, (entry / "stderr.txt").read_text()


HIP_KERNELS = KERNELS


@pytest.fixture(scope="module")
def hip_builds():
    """Every kernel's build for the three AMD targets. NOTES: two clang processes at a time (each is
    single-threaded; pytest runs one test at a time, so the second core is otherwise idle)."""
    _tool_or_skip("clang-22 with Debian's HIP headers", hip_toolchain.clang())
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        futures = {k: pool.submit(_hip_build, k, tuple(hip_toolchain.TARGETS)) for k in HIP_KERNELS}
    return futures


@pytest.mark.parametrize("source", HIP_KERNELS)
def test_hip_gfx90a_gfx942_gfx950(source, hip_builds):
    """Each kernel builds for MI200, MI300X and MI355X without a single compiler warning, and each code
    object is an AMDGPU ELF naming its target (EF_AMDGPU_MACH)."""
    objects, stderr = hip_builds[source].result()
    assert "warning" not in stderr, stderr[-3000:]
    assert {a: hip_toolchain.elf_mach(img) for a, img in objects.items()} == hip_toolchain.TARGETS
    # every kernel of the source is in each code object under its C name (what hipModuleGetFunction takes)
    names = re.findall(r'extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\s*\(',
                       (jit.kernel_dir() / source).read_text())
    assert names
    for arch, image in objects.items():
        assert all(f"\0{n}.kd\0".encode() in image for n in names), (arch, names)


def test_param_abi_sizes_match_the_packer(tmp_path):
    """sizeof(struct) == 8 x the fields Python packs, checked by a C++ compiler on the header."""
    cxx = _tool_or_skip("a C++ compiler", shutil.which("g++") or shutil.which("c++"))
    structs = ["LLDispatchParams", "LLDispatchRecvParams", "LLCombineParams", "LLCombineRecvParams",
               "HTLayoutParams", "HTNotifyParams", "HTDispatchParams", "HTCombineParams",
               "LLProxyDispatchParams", "LLProxyDispatchRecvParams", "LLProxyCombineParams",
               "LLProxyCombineRecvParams", "HTProxyNotifyParams", "HTProxyDispatchParams", "HTProxyCombineParams",
               "HTProxyForwardDispatchParams", "HTProxyForwardCombineParams", "HTProxyPlanSendParams",
               "HTProxyPlanRecvParams", "HTProxyForwardHandleParams", "HTCEBeginParams",
               "HTCEWaitParams", "HTCombineCEParams", "HTDispatchCEParams"]
    lines = ['#include "uccl_ep/kernel_abi.h"', '#include "uccl_ep/kernel_abi_internode.h"']
    for s in structs:
        n = len(runtime.param_fields(s))
        lines.append(f"static_assert(sizeof(uccl_ep::{s}) == {8 * n}, \"{s}: {n} fields\");")
    _host_compiles(cxx, tmp_path / "abi.cc", lines)


def _host_compiles(cxx, src, lines):
    """`lines` (includes and static_asserts on the shared headers) pass a host C++ compiler."""
    src.write_text("\n".join(lines) + "\n")
    res = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", f"-I{jit.include_dir()}", str(src)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_copy_ring_state_words_match_the_host(tmp_path):
    """The words of DmaConsumer and HtDmaRing (dma_ring.h) the host reads or hands over, and the size,
    as ll_proxy.py and ht_proxy.py have them."""
    from uccl_ep.cuda import ll_proxy
    cxx = _tool_or_skip("a C++ compiler", shutil.which("g++") or shutil.which("c++"))
    lines = ['#include <cstddef>', '#include "uccl_ep/dma_ring.h"',
             f"static_assert(sizeof(uccl_ep::DmaConsumer) == {ll_proxy._DMA_CONSUMER_BYTES}, \"size\");",
             f"static_assert(sizeof(uccl_ep::DmaDesc) == {ll_proxy._DMA_DESC_BYTES}, \"descriptor\");"]
    for name, word in {**ll_proxy._DMA_CONSUMER_DIAG_WORDS, **ll_proxy._DMA_CONSUMER_POSITION_WORDS}.items():
        lines.append(f"static_assert(offsetof(uccl_ep::DmaConsumer, {name}) == {8 * word}, \"{name}\");")
    # the normal-mode copy role's ring position (copy_ring_handover, proxy_session.py): word 0
    lines.append("static_assert(offsetof(uccl_ep::HtDmaRing, base_idx) == 0, \"HtDmaRing base_idx\");")
    from uccl_ep.cuda import ht_proxy
    lines.append(f"static_assert(sizeof(uccl_ep::HtDmaRing) == {ht_proxy.DMA_RING_STATE_BYTES}, \"HtDmaRing size\");")
    for name, word in ht_proxy._DMA_RING_DIAG_WORDS.items():  # the copy role's diagnostics the bench reads
        lines.append(f"static_assert(offsetof(uccl_ep::HtDmaRing, {name}) == {8 * word}, \"HtDmaRing {name}\");")
    _host_compiles(cxx, tmp_path / "dma.cc", lines)


# ---- the device half of the proxy FIFO (fifo_device.cuh) ------------------------------------------
_PUSH_PROBE = r"""
#include "uccl_ep/fifo_device.cuh"
// The device reads the FifoLayout table that the host packs (bindings: pack_fifo_layout).
static_assert(sizeof(uccl_ep::fifo::FifoLayout) == %d, "FifoLayout differs between host and device");
extern "C" __global__ void probe_push(uccl_ep::fifo::FifoLayout f, uccl_ep::ErrorWord* err, unsigned long long w0,
                                      unsigned long long w1) {
  uccl_ep::protocol::TransferCmd c{w0, w1};
  uccl_ep::dev::fifo_push(f, c, 1000000000ull, err, uccl_ep::dev::PushSite{9, 0, 1, 2});
}
extern "C" __global__ void probe_push_batch(uccl_ep::fifo::FifoLayout f, uccl_ep::ErrorWord* err, unsigned long long w0,
                                            unsigned long long w1) {
  uccl_ep::protocol::TransferCmd c[3] = {{w0, w1}, {w1, w0}, {w0, w0}};
  uccl_ep::dev::fifo_push_batch(f, c, 3, 1000000000ull, err, uccl_ep::dev::PushSite{9, 0, 1, 2});
}
"""


def _push_ptx(tmp_path, *defines):
    nvcc = _tool_or_skip("nvcc", _nvcc())
    from uccl_ep.proxy import native
    src = tmp_path / "push.cu"
    src.write_text(_PUSH_PROBE % native().FIFO_LAYOUT_BYTES)
    out = tmp_path / "push.ptx"
    res = subprocess.run([str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-ptx", "-arch=sm_90a", *defines,
                          str(src), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return out.read_text()


def _entry(ptx: str, name: str) -> str:
    """The PTX body of one entry point."""
    start = ptx.index(f".entry {name}(")
    nxt = ptx.find(".entry ", start + 1)
    return ptx[start:nxt if nxt > 0 else len(ptx)]


def test_device_push_commits_with_one_16_byte_release_store(tmp_path):
    ptx = _entry(_push_ptx(tmp_path), "probe_push")
    # one 128-bit store with release semantics at system scope publishes word0 and the commit bit
    assert ptx.count("st.release.sys.global.v2.u64") == 1, ptx[-2000:]
    assert "ld.acquire.sys.global.u64" in ptx      # the full-ring path reads the proxy's tail
    assert "atom.global.add.u64" in ptx            # the reservation (device-scope, relaxed)
    assert "trap" not in ptx                       # a full ring ends in the error word, never a trap


def test_device_push_split_store_variant(tmp_path):
    ptx = _entry(_push_ptx(tmp_path, "-DUCCL_EP_FIFO_SPLIT_STORE"), "probe_push")
    assert "st.release.sys.global.v2.u64" not in ptx
    assert ptx.count("st.release.sys.global.u64") >= 1 and "st.relaxed.sys.global.u64" in ptx


def test_device_batch_push_fences_once(tmp_path):
    """fifo_push_batch: one reservation and one release fence at system scope for all its commands,
    each then one posted 16-byte strong store (a release pattern); the split-store build releases
    each command's second word instead."""
    ptx = _entry(_push_ptx(tmp_path), "probe_push_batch")
    assert ptx.count("fence.acq_rel.sys") == 1, ptx[-3000:]  # (the error path's raise_error fences on its own)
    assert ptx.count("st.relaxed.sys.global.v2.u64") == 3 and "st.release.sys.global.v2" not in ptx
    assert ptx.count("atom.global.add.u64") == 1 and "trap" not in ptx
    split = _entry(_push_ptx(tmp_path, "-DUCCL_EP_FIFO_SPLIT_STORE"), "probe_push_batch")
    assert split.count("st.release.sys.global.u64") == 3 and "st.relaxed.sys.global.v2.u64" not in split


# On AMD the commit is two 8-byte stores: word0 relaxed, then word1 (the commit bit) with release at
# system scope; the proxy's tail is read with acquire at system scope. What the AMDGPU memory model
# lowers them to (LLVM AMDGPUUsage, memory model for GFX90A / GFX942): write back L2, wait, store
# (sc0 sc1 = system coherence on gfx942/gfx950); load, wait, invalidate.
_AMD_ORDERING = {
    "gfx90a": (r"global_store_dwordx2 (v\[\d+:\d+\]), v\[\d+:\d+\], off\s+buffer_wbl2\s+s_waitcnt vmcnt\(0\)\s+"
               r"global_store_dwordx2 \1, v\[\d+:\d+\], off offset:8\s",
               r"global_load_dwordx2 [^\n]* glc\s+s_waitcnt vmcnt\(0\)\s+buffer_invl2\s+buffer_wbinvl1_vol"),
    "gfx942": (r"global_store_dwordx2 (v\[\d+:\d+\]), v\[\d+:\d+\], off sc0 sc1\s+buffer_wbl2 sc0 sc1\s+"
               r"s_waitcnt vmcnt\(0\)\s+global_store_dwordx2 \1, v\[\d+:\d+\], off offset:8 sc0 sc1",
               r"global_load_dwordx2 [^\n]* sc0 sc1\s+s_waitcnt vmcnt\(0\)\s+buffer_inv sc0 sc1"),
}
_AMD_ORDERING["gfx950"] = _AMD_ORDERING["gfx942"]


@pytest.mark.parametrize("arch", sorted(_AMD_ORDERING))
def test_device_push_on_amd_releases_the_commit_at_system_scope(arch, tmp_path):
    clang = _tool_or_skip("clang-22 with Debian's HIP headers", hip_toolchain.clang())
    from uccl_ep.proxy import native
    src, out = tmp_path / "push.hip", tmp_path / "push.s"
    src.write_text(_PUSH_PROBE % native().FIFO_LAYOUT_BYTES)
    res = subprocess.run([clang, "-x", "hip", "-std=c++17", "-O3", f"--offload-arch={arch}", "--offload-device-only",
                          "-S", *hip_toolchain.compat_flags(), f"-I{jit.include_dir()}", str(src), "-o", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr[-3000:]
    asm = out.read_text()
    body = asm[asm.index("probe_push:"):asm.index(".Lfunc_end0")]
    release, acquire = _AMD_ORDERING[arch]
    assert len(re.findall(release, body)) == 1, body[-3000:]
    assert re.search(acquire, body), "the full-ring path acquires the proxy's tail at system scope"
    assert "s_trap" not in body, "a full ring ends in the error word, never a trap"


@pytest.mark.parametrize("parts", [2, 4])
def test_ll_proxy_send_kernels_build_with_parts(parts, tmp_path):
    """The send kernels of Tuning.ll_proxy_parts (an experiment: compile-time UCCL_EP_LL_PARTS) build
    for sm_90a without spills."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    for source in ("ll/proxy/dispatch.cu", "ll/proxy/combine.cu"):
        info = _ptxas_info(nvcc, source, (f"UCCL_EP_LL_PARTS={parts}",), tmp_path)
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", info)]
        assert spills and not any(spills), info


# ---- HT intranode kernels: entry points, block sizes and tuning settings (ht_tuning.cuh) ------------
def _ptxas_info(nvcc, source, defines, tmp_path):
    cmd = [str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-c", "-Xptxas", "-v",
           "-gencode=arch=compute_90a,code=sm_90a", "-DNDEBUG", *(f"-D{d}" for d in defines),
           str(jit.kernel_dir() / source), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stderr


def _default_ht_ptx(nvcc, source, defines, tmp_path) -> str:
    out = tmp_path / "k.ptx"
    res = subprocess.run([str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-ptx", "-arch=sm_90a",
                          *(f"-D{d}" for d in defines), str(jit.kernel_dir() / source), "-o", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return out.read_text()


_PARAMS = {"dispatch": "HTDispatchParams", "combine": "HTCombineParams"}  # what ht.py packs for each


def test_ht_kernel_param_abi(tmp_path):
    """The entry of each HT intranode kernel takes exactly the struct ht.py packs for it (PTX param
    size = 8 x its fields), and never traps."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    defines = dict(zip(("dispatch", "combine"), ht_tuning.kernel_defines(2, 512, "")))
    for which, (source, kernel) in (("dispatch", ht_tuning.DISPATCH), ("combine", ht_tuning.COMBINE)):
        ptx = _default_ht_ptx(nvcc, source, defines[which], tmp_path)
        m = re.search(rf"\.entry {re.escape(kernel)}\(\s*\.param \.align 8 \.b8 \w+\[(\d+)\]\s*\)", ptx)
        assert m, f"{kernel}: entry with one by-value struct parameter not found"
        assert int(m.group(1)) == 8 * len(runtime.param_fields(_PARAMS[which])), (kernel, m.group(1))
        assert "trap" not in ptx


@pytest.mark.parametrize("threads", [512, 768, 1024])
def test_ht_default_kernels_build_for_each_block_size(threads, tmp_path):
    """The engine's defines for dispatch and combine (ht_tuning.kernel_defines) build at every block
    size Tuning.ht_warps / Tuning.ht_combine_warps allow, within the registers one block of that
    size may hold; the shipped defaults (512 threads each) build without spills, as measured."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    d_defs, c_defs = ht_tuning.kernel_defines(2, threads, "")
    for source, defs, default in (("ht/nvlink/dispatch.cu", d_defs, 512), ("ht/nvlink/combine.cu", c_defs, 512)):
        info = _ptxas_info(nvcc, source, defs, tmp_path)
        regs = [int(m) for m in re.findall(r"Used (\d+) registers", info)]
        assert regs and max(regs) <= 65536 // threads, info
        if threads == default:
            spilled = sum(int(m) for m in re.findall(r"(\d+) bytes spill stores", info))
            assert spilled == 0, (source, info)


def test_ht_prof_build_counts_cycles(tmp_path):
    """UCCL_EP_HT_PROF=1 builds with the cycle accounting (a printf and clock reads); the default build
    has neither."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    for prof, expect in (("UCCL_EP_HT_PROF=1", True), ("UCCL_EP_HT_PROF=0", False)):
        ptx = _default_ht_ptx(nvcc, "ht/nvlink/combine.cu", ht_tuning.kernel_defines(2, 512, prof)[1], tmp_path)
        assert ("vprintf" in ptx) == expect and ("%clock64" in ptx) == expect, prof


def test_ht_consumer_heads_are_fence_free_by_default(tmp_path):
    """Default builds publish consumer heads with a relaxed system-scope store and producer tails with a
    release; UCCL_EP_HT_RELAXED_HEAD=0 brings the release back for heads (the measured alternative)."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    for defs, relaxed in (("", True), ("UCCL_EP_HT_RELAXED_HEAD=0", False)):
        ptx = _default_ht_ptx(nvcc, "ht/nvlink/dispatch.cu", ht_tuning.kernel_defines(2, 512, defs)[0], tmp_path)
        assert "st.release.sys.global.u64" in ptx
        assert ("st.relaxed.sys.global.u64" in ptx) == relaxed, defs


def test_ht_staged_combine_builds_with_cp_async(tmp_path):
    """The combine sum is staged through shared memory by cp.async (through L2) by default on sm_90,
    builds at the block sizes its stage areas fit, and UCCL_EP_HT_COMBINE_STAGES=0 brings back the
    register pipeline (no cp.async)."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    for threads, tuning in ((512, ""), (512, "UCCL_EP_HT_COMBINE_STAGES=4"), (768, "UCCL_EP_HT_COMBINE_STAGES=3")):
        c_defs = ht_tuning.kernel_defines(2, threads, tuning)[1]
        ptx = _default_ht_ptx(nvcc, "ht/nvlink/combine.cu", c_defs, tmp_path)
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx, tuning
        _ptxas_info(nvcc, "ht/nvlink/combine.cu", c_defs, tmp_path)
    assert "cp.async" not in _default_ht_ptx(nvcc, "ht/nvlink/combine.cu",
                                             ht_tuning.kernel_defines(2, 768, "UCCL_EP_HT_COMBINE_STAGES=0")[1],
                                             tmp_path)


# ---- LogFMT combine: the -D build of the LL combine kernels (use_logfmt=True) ----------------------
_LOGFMT_SOURCES = ("ll/nvlink/combine.cu", "ll/proxy/combine.cu")


@pytest.mark.parametrize("source", _LOGFMT_SOURCES)
def test_logfmt_combine_builds_for_sm90a_without_spills(source, tmp_path):
    nvcc = _tool_or_skip("nvcc", _nvcc())
    info = _ptxas_info(nvcc, source, ("UCCL_EP_LL_LOGFMT=1",), tmp_path)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", info)]
    assert spills and not any(spills), info


@pytest.mark.parametrize("source", _LOGFMT_SOURCES)
def test_bf16_combine_build_carries_no_logfmt_code(source, tmp_path):
    """The encoder and decoder (exp2f's ex2.approx among them) are in the LogFMT build only: the BF16
    combine's device code is what it was."""
    nvcc = _tool_or_skip("nvcc", _nvcc())
    ex2 = {}
    for name, defines in (("bf16", ()), ("logfmt", ("-DUCCL_EP_LL_LOGFMT=1",))):
        res = subprocess.run([str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-ptx", "-arch=sm_90a",
                              "-DNDEBUG", *defines, str(jit.kernel_dir() / source), "-o", str(tmp_path / "k.ptx")],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "warning" not in res.stderr, res.stderr[-3000:]
        ex2[name] = len(re.findall(r"\bex2\.approx", (tmp_path / "k.ptx").read_text()))
    assert ex2["bf16"] == 0 and ex2["logfmt"] > 0, ex2


def test_logfmt_combine_builds_for_amd():
    """gfx90a / gfx942 / gfx950 without a warning (the -D build is not in HIP_KERNELS' default set)."""
    for source in _LOGFMT_SOURCES:
        objects, stderr = _hip_build(source, tuple(hip_toolchain.TARGETS), ("UCCL_EP_LL_LOGFMT=1",))
        assert "warning" not in stderr, stderr[-3000:]
        assert {a: hip_toolchain.elf_mach(img) for a, img in objects.items()} == hip_toolchain.TARGETS
