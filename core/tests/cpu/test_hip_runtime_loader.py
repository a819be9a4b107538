"""The HIP runtime loader (core/csrc/runtime/hip_api.cc, behind cuda_driver.h) without an AMD GPU:
a stand-in libamdhip64 (hip_standin.c, built here) records every call. Covered: what each way of
failing to load says, reuse of a HIP runtime already in the process, the runtime calls of one
low-latency dispatch made by the real LowLatencyEngine (with kernels the JIT compiled for gfx942),
what a ROCm torch selects (HIP runtime, hipcc, 64-lane warps), and what `uccl-ep doctor` reports."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import hip_toolchain

HERE = Path(__file__).resolve().parent
CANDIDATES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")  # dynlib.cc, in order


def _cc():
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def _standin(directory: Path, name: str = "libamdhip64.so", *flags: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / name
    res = subprocess.run([_cc(), "-shared", "-fPIC", "-O1", *flags, str(HERE / "hip_standin.c"), "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return out


def _run(libdir: Path, log: Path, script: str, **env) -> dict:
    """Run `script` in a fresh interpreter whose loader path starts at `libdir`; it prints one JSON line."""
    full = {**os.environ, "LD_LIBRARY_PATH": str(libdir), "STANDIN_LOG": str(log), **env}
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300,
                         env=full)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _calls(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


SELECT = """
import json
from uccl_ep import _C
ok, why = _C.cuda.select_runtime({which!r})
print(json.dumps({{"ok": ok, "why": why, "name": _C.cuda.runtime_name(), "again": _C.cuda.available(),
                  "probe": dict(_C.cuda.probe_runtime("hip"))}}))
"""


def test_loads_initialises_and_keeps_its_choice(tmp_path):
    lib = tmp_path / "lib"
    _standin(lib)
    log = tmp_path / "calls.log"
    out = _run(lib, log, SELECT.format(which="hip") + textwrap.dedent("""
        try:
            _C.cuda.select_runtime("cuda")
            print(json.dumps({"switched": True}))
        except RuntimeError as e:
            from uccl_ep.cuda import runtime  # this torch is a CUDA build: the executor is told why not
            print(json.dumps({"switched": False, "error": str(e), "version": _C.cuda.driver_version(),
                              "sms": _C.cuda.device_attribute(0, _C.cuda.ATTR_SM_COUNT),
                              "reason": runtime.driver_unavailable_reason()}))
        """))
    switch = "the GPU runtime of this process is already 'hip'; cannot switch to 'cuda'"
    assert out == {"switched": False, "error": switch, "version": 60342134, "sms": 304, "reason": switch}
    names = [c[0] for c in _calls(log)]
    assert names[:3] == ["hipRuntimeGetVersion", "hipInit", "hipGetDeviceCount"], "the version is checked first"
    assert ["hipDeviceGetAttribute", "63", "0"] in _calls(log), "SM count is HIP's multiprocessor count (63)"


@pytest.mark.parametrize("case,env,flags,which,expect", [
    ("missing entry point", {}, ("-DOMIT_hipModuleLaunchCooperativeKernel",), "hip",
     "libamdhip64.so) lacks entry point hipModuleLaunchCooperativeKernel (uccl_ep needs ROCm 6.0 or newer)"),
    ("init fails", {"STANDIN_INIT_ERROR": "100"}, (), "hip",
     "hipInit failed: hipErrorNoDevice (no usable AMD GPU, or /dev/kfd not accessible)"),
    ("too old", {"STANDIN_VERSION": "50231234"}, (), "hip",
     "the HIP runtime libamdhip64.so is version 5.2; uccl_ep needs ROCm 6.0 or newer"),
    ("no device", {"STANDIN_DEVICES": "0"}, (), "hip",
     "the HIP runtime sees no AMD GPU (check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES)"),
    ("auto names both", {"STANDIN_INIT_ERROR": "100"}, (), "auto",
     "HIP: hipInit failed: hipErrorNoDevice"),
], ids=lambda v: v if isinstance(v, str) and " " in v else None)
def test_failure_messages_say_what_failed(tmp_path, case, env, flags, which, expect):
    lib = tmp_path / "lib"
    _standin(lib, "libamdhip64.so", *flags)
    out = _run(lib, tmp_path / "calls.log", SELECT.format(which=which), **env)
    assert not out["ok"] and expect in out["why"], out
    assert out["name"] == "" and out["again"] == [False, out["why"]], "a failed choice stays failed (no fallback)"
    if which == "auto":
        assert out["why"].startswith("no usable GPU runtime: CUDA: ")
    assert out["probe"]["usable"] is False and out["probe"]["why"] in out["why"]


FAILING = """
import json
from uccl_ep import _C
from uccl_ep.errors import DeviceError
out = {"ok": _C.cuda.select_runtime("hip")[0]}
def attempt(key, fn):
    try:
        fn()
        out[key] = None
    except DeviceError as e:
        out[key] = dict(call=e.call, code=e.code, name=e.error_name, description=e.description, sticky=e.sticky,
                        text=str(e), runtime_error=isinstance(e, RuntimeError))
attempt("alloc", lambda: _C.cuda.mem_alloc(0, 4096))
attempt("sync", lambda: _C.cuda.synchronize(0))
host, dev = _C.cuda.host_alloc_mapped(0, 64)
attempt("htod", lambda: _C.cuda.memcpy_htod(0, dev, b"x" * 16))
print(json.dumps(out))
"""


def test_failing_runtime_calls_raise_device_error(tmp_path):
    """A GPU runtime call that fails raises uccl_ep.errors.DeviceError (still a RuntimeError) naming
    the entry point, the runtime's status, its name and text, and whether the context is lost
    (sticky); the calls that did not fail keep working."""
    lib = tmp_path / "lib"
    _standin(lib)
    log = tmp_path / "calls.log"
    out = _run(lib, log, FAILING, STANDIN_FAIL="hipExtMallocWithFlags=2,hipDeviceSynchronize=700")
    assert out["ok"] and out["htod"] is None, out
    assert out["alloc"] == {"call": "hipExtMallocWithFlags(uncached)", "code": 2, "name": "hipErrorOutOfMemory",
                            "description": "out of memory", "sticky": False, "runtime_error": True,
                            "text": "hipExtMallocWithFlags(uncached): hipErrorOutOfMemory (out of memory)"}
    sync = out["sync"]
    assert (sync["call"], sync["code"], sync["name"], sync["sticky"]) == ("hipDeviceSynchronize", 700,
                                                                          "hipErrorIllegalAddress", True)
    assert sync["text"] == ("hipDeviceSynchronize: hipErrorIllegalAddress (an illegal memory access was "
                            "encountered); the GPU context is lost: restart the process")
    calls = _calls(log)
    assert ["hipExtMallocWithFlags", "->", "2"] in calls and ["hipDeviceSynchronize", "->", "700"] in calls
    assert any(c[0] == "hipMemcpyHtoD" for c in calls)


def test_library_that_cannot_load_names_every_candidate(tmp_path):
    """Each candidate soname, and $ROCM_PATH/lib/libamdhip64.so, is a stand-in whose own dependency is
    missing: all fail to load, and the message has each one's reason."""
    dep = _standin(tmp_path / "dep", "libuccl_ep_standin_dep.so")
    lib, rocm = tmp_path / "lib", tmp_path / "rocm"
    for directory, name in [(lib, n) for n in CANDIDATES] + [(rocm / "lib", "libamdhip64.so")]:
        _standin(directory, name, f"-L{dep.parent}", "-Wl,--no-as-needed", "-luccl_ep_standin_dep")
    dep.unlink()
    out = _run(lib, tmp_path / "calls.log", SELECT.format(which="hip"), ROCM_PATH=str(rocm))
    assert not out["ok"] and out["why"].startswith("cannot load the HIP runtime (libamdhip64.so): "), out
    assert out["why"].count("libuccl_ep_standin_dep.so: cannot open shared object file") == len(CANDIDATES) + 1
    assert f"{rocm}/lib/libamdhip64.so" in out["why"]
    assert "install ROCm 6.0+" in out["why"] and out["probe"]["loadable"] is False


def test_reuses_the_hip_runtime_already_in_the_process(tmp_path):
    """A ROCm torch brings its own libamdhip64; uccl_ep must use that copy (its streams and pointers)."""
    loaded = _standin(tmp_path / "torch_lib", "libamdhip64.so.6")
    out = _run(tmp_path / "empty", tmp_path / "calls.log", f"""
        import ctypes, json
        ctypes.CDLL({str(loaded)!r})
        from uccl_ep import _C
        ok, why = _C.cuda.select_runtime("hip")
        print(json.dumps({{"ok": ok, "why": why, "path": _C.cuda.probe_runtime("hip")["path"]}}))
        """)
    assert out == {"ok": True, "why": "", "path": str(loaded)}


DISPATCH = """
import json, os
from types import SimpleNamespace
import torch
from uccl_ep import _C
from uccl_ep.cuda import ll, runtime
from uccl_ep.cuda.engine_context import EngineContext
from uccl_ep.tuning import Tuning

torch.version.hip, torch.version.cuda = "7.2.0", None  # a ROCm torch, as far as uccl_ep can tell
torch.cuda.synchronize = lambda *a, **k: None  # CPU torch here; the stand-in completes every call at once
ll.current_stream = lambda device=None: 0x5150            # torch's current stream, as the engine reads it


def engine_context():
    # What CudaExecutor.__init__ hands a LowLatencyEngine (cuda/engine_context.py), in its order: rank 0
    # of 2, the peer's IPC handle as all_gather_object would bring it.
    drv = runtime.driver()
    errors = runtime.MappedHostMemory(0, 16384)
    ll_mem = runtime.DeviceMemory(0, 1 << 22)
    handles = [ll_mem.ipc_handle(), ll_mem.ipc_handle()]
    assert drv.can_access_peer(0, 1)
    peer_base = [ll_mem.ptr, ll_mem.open_peer(handles[1])]
    mask = runtime.DeviceMemory(0, 8)  # the rank mask's words (cuda/shrink.py)

    def check_error():
        assert errors.int32(0) == 0

    return EngineContext(ctx=SimpleNamespace(num_ranks=2, rank=0, enable_shrink=False, tuning=Tuning()), device=0,
                         drv=drv, timeout_ns=10**9, errors=errors, error_dev_ptr=errors.dev_ptr, mask_ptr=mask.ptr,
                         ll_mem=ll_mem, ll_peer_base=peer_base, check_error=check_error)


eng = ll.LowLatencyEngine(engine_context())
open(os.environ["STANDIN_LOG"], "a").write("DISPATCH\\n")
T, H, E, num_max = 3, 2048, 8, 4
x = torch.randn(T, H).to(torch.bfloat16)
topk = torch.tensor([[0, 5], [7, 2], [3, -1]], dtype=torch.int64)
(recv_x, scales), count, handle, finish = eng.dispatch(None, x, topk, num_max, E, True, False, False, set(), None, None)
finish()
print(json.dumps({"x": x.data_ptr(), "topk": topk.data_ptr(), "recv_x": recv_x.data_ptr(), "count": count.data_ptr(),
                  "error": eng.ec.error_dev_ptr, "mem": eng.mem.ptr}))
"""


def test_one_low_latency_dispatch_call_sequence(tmp_path):
    clang = hip_toolchain.clang()
    if clang is None:
        if os.environ.get("CI"):
            pytest.fail("clang-22 / HIP headers missing on CI: ci/setup.d/20-gpu-toolchain.sh should install them")
        pytest.skip("clang-22 with Debian's HIP headers not installed (ci/setup.d/20-gpu-toolchain.sh)")
    from uccl_ep.cuda import runtime
    send_f, recv_f = runtime.param_fields("LLDispatchParams"), runtime.param_fields("LLDispatchRecvParams")
    lib, log = tmp_path / "lib", tmp_path / "calls.log"
    _standin(lib)
    out = _run(lib, log, DISPATCH, UCCL_EP_CUDA_ARCH="gfx942", UCCL_EP_HIPCC=str(hip_toolchain.hipcc_wrapper(tmp_path)),
               UCCL_EP_JIT_CACHE_DIR=os.path.expanduser("~/.cache/uccl_ep/ci-hip-jit"),
               STANDIN_PARAM_BYTES=f"ll_dispatch_send={8 * len(send_f)},ll_dispatch_recv={8 * len(recv_f)}")
    calls = _calls(log)
    cut = calls.index(["DISPATCH"])
    setup, dispatch = calls[:cut], calls[cut + 1:]

    # set-up: uncached device memory, IPC with lazy peer access, coherent mapped host memory, kernels
    assert [c for c in setup if c[0] == "hipExtMallocWithFlags"][0][1:3] == [str(1 << 22), "0x3"]
    assert ["hipIpcOpenMemHandle", hex(out["mem"]), "0x1"] in setup
    assert [c for c in setup if c[0] == "hipHostMalloc"][0][1:3] == ["16384", "0x40000003"]
    loads = [c for c in setup if c[0] == "hipModuleLoadData"]
    assert loads == [["hipModuleLoadData", "elf=1", "mach=0x4c"]] * 3, \
        "ll/nvlink/dispatch.cu, ll/nvlink/combine.cu and its LogFMT build for gfx942"
    assert [c[1] for c in setup if c[0] == "hipModuleGetFunction"] == [
        "ll_dispatch_send", "ll_dispatch_recv", "ll_combine_send", "ll_combine_recv",
        "ll_combine_send", "ll_combine_recv"]  # the last two: the LogFMT build

    # the dispatch: layout (work words, peer tables, clean), then the two kernels on torch's stream
    names = [c[0] for c in dispatch if c[0] != "hipSetDevice"]
    assert names == ["hipExtMallocWithFlags", "hipMemcpyHtoD", "hipMemsetD8Async", "hipMemsetD8Async",
                     "hipDeviceSynchronize", "hipModuleLaunchKernel", "hipModuleLaunchKernel"], dispatch
    send, recv = [c for c in dispatch if c[0] == "hipModuleLaunchKernel"]
    assert send[1:10] == ["ll_dispatch_send", "3", "1", "1", "512", "1", "1", str(8 * 8), "0x5150"]
    assert recv[1:10] == ["ll_dispatch_recv", "4", "1", "1", "256", "1", "1", recv[8], "0x5150"]
    p = dict(zip(send_f, struct.unpack(f"<{len(send_f)}Q", bytes.fromhex(send[10]))))
    assert (p["x"], p["topk_idx"], p["num_tokens"], p["hidden"], p["num_experts"], p["num_ranks"], p["rank"],
            p["num_max"], p["use_fp8"]) == (out["x"], out["topk"], 3, 2048, 8, 2, 0, 4, 1)
    q = dict(zip(recv_f, struct.unpack(f"<{len(recv_f)}Q", bytes.fromhex(recv[10]))))
    assert (q["recv_x"], q["recv_count"], q["error"], q["num_local_experts"]) == (
        out["recv_x"], out["count"], out["error"], 4)


def test_rocm_torch_selects_the_hip_path_with_hipcc(tmp_path, monkeypatch):
    """Under a ROCm torch (torch.version.hip) the cuda executor asks for the HIP runtime and hipcc, and
    says which is missing; with both it can serve (backend="auto" then picks it first)."""
    import torch

    from uccl_ep.cuda import executor, runtime
    from uccl_ep.topology import Topology
    monkeypatch.setattr(torch.version, "hip", "7.2.0")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(runtime, "driver_unavailable_reason", lambda: None)
    monkeypatch.delenv("UCCL_EP_FORCE_PROXY", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert runtime.torch_gpu_runtime() == "hip"
    ctx = SimpleNamespace(num_ranks=8, topology=Topology(8, 8), low_latency_mode=False,
                          allow_nvlink_for_low_latency_mode=True, options={})
    monkeypatch.setenv("UCCL_EP_HIPCC", str(tmp_path / "rocm" / "bin" / "hipcc"))
    why = executor.unavailable_reason(ctx)
    assert why is not None and "hipcc" in why and "UCCL_EP_HIPCC" in why and "nvcc" not in why, why
    monkeypatch.setenv("UCCL_EP_HIPCC", str(hip_toolchain.hipcc_wrapper(tmp_path / "bin")))
    assert executor.unavailable_reason(ctx) is None


def test_block_sizes_count_wavefronts_under_a_rocm_torch(monkeypatch):
    """Warps are 64 lanes on AMD: thread counts validated and derived in warps follow (ll.py, ht.py)."""
    import torch

    from uccl_ep.cuda import ll, runtime
    from uccl_ep.errors import InvalidArgument
    assert runtime.warp_size() == 32
    monkeypatch.setattr(torch.version, "hip", "7.2.0")
    assert runtime.warp_size() == 64
    from uccl_ep.tuning import Tuning
    with pytest.raises(InvalidArgument, match="a multiple of 64"):  # three CUDA warps, 1.5 wavefronts
        ll._combine_recv_threads(Tuning(ll_combine_recv_threads=96))
    assert ll._combine_recv_threads(Tuning(ll_combine_recv_threads=128)) == 128


def test_doctor_reports_the_runtime_found_and_why_the_other_is_absent(tmp_path):
    lib = tmp_path / "lib"
    _standin(lib)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "STANDIN_LOG": str(tmp_path / "calls.log")}
    res = subprocess.run([sys.executable, "-m", "uccl_ep.cli", "doctor", "--json"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    rt = json.loads(res.stdout)["gpu_runtimes"]
    assert rt["hip"] == {"loadable": True, "usable": True, "path": "libamdhip64.so", "why": "", "version": 60342134}
    if not rt["cuda"]["usable"]:  # no NVIDIA driver here: the reason names the library
        assert rt["cuda"]["why"].startswith("cannot load the CUDA driver (libcuda.so.1): ")
    assert rt["torch_uses"] in ("cuda", "auto")  # this torch is not a ROCm build


NORMAL = """
import json
from types import SimpleNamespace
import torch
from uccl_ep.cuda import ht, runtime
from uccl_ep.cuda.engine_context import EngineContext
from uccl_ep.tuning import Tuning

torch.version.hip, torch.version.cuda = "7.2.0", None  # a ROCm torch, as far as uccl_ep can tell
drv = runtime.driver()
nvl = runtime.DeviceMemory(0, 1 << 22)
errors = runtime.MappedHostMemory(0, 16384)
ex = EngineContext(device=0, ctx=SimpleNamespace(num_ranks=8, rank=0, tuning=Tuning()), nvl_mem=nvl, drv=drv,
                   nvl_peer_base=[nvl.ptr] * 8, timeout_ns=10**9, errors=errors, error_dev_ptr=errors.dev_ptr)
eng = ht.NormalEngine(ex)
print(json.dumps({"block": eng.block, "combine_block": eng.combine_block, "G": eng.G, "smem": eng.combine_smem}))
"""


def test_normal_mode_blocks_are_wavefronts_on_amd(tmp_path):
    """The HT engine on the HIP runtime: R x G warps per block are 64-lane wavefronts (16 warps of 8 ranks:
    1024 threads), its kernels JIT-compile for gfx942 at that block size and load by name."""
    if hip_toolchain.clang() is None:
        if os.environ.get("CI"):
            pytest.fail("clang-22 / HIP headers missing on CI: ci/setup.d/20-gpu-toolchain.sh should install them")
        pytest.skip("clang-22 with Debian's HIP headers not installed (ci/setup.d/20-gpu-toolchain.sh)")
    lib, log = tmp_path / "lib", tmp_path / "calls.log"
    _standin(lib)
    out = _run(lib, log, NORMAL, UCCL_EP_CUDA_ARCH="gfx942", UCCL_EP_HIPCC=str(hip_toolchain.hipcc_wrapper(tmp_path)),
               UCCL_EP_JIT_CACHE_DIR=os.path.expanduser("~/.cache/uccl_ep/ci-hip-jit"))
    assert out == {"block": 1024, "combine_block": 1024, "G": 2, "smem": 0}
    calls = _calls(log)
    # the copy-engine kernels load with the engine too (before the constructor's barrier)
    assert [c[1] for c in calls if c[0] == "hipModuleGetFunction"] == [
        "ht_layout", "ht_notify", "ht_dispatch", "ht_combine", "ht_combine_ce", "ht_ce_begin", "ht_ce_wait",
        "ht_dispatch_ce"]
    assert all(c == ["hipModuleLoadData", "elf=1", "mach=0x4c"] for c in calls if c[0] == "hipModuleLoadData")
