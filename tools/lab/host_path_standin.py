"""Host path of the cuda executor's low-latency engine on a CPU, with no GPU: not a test.

python tools/lab/host_path_standin.py [--profile] [--iters N]

The engine (`uccl_ep.cuda.ll.LowLatencyEngine`) runs over the HIP stand-in runtime of the CPU tests
(core/tests/cpu/hip_standin.c: every driver call answers at once, kernels are JIT-compiled for gfx942
with Debian's clang 22, as `test_hip_runtime_loader.py` does), on CPU tensors, one rank of 2. It
prints the host time of one dispatch (send + receive launch) and of one dispatch + combine, best of
five rounds; `--profile` adds cProfile of the engine's calls by own time. What it measures is the
Python and launch path the engine runs per call; the GPU machine's figures add the CUDA-side torch
calls and the real driver (`host_path.py`). Needs clang-22 and the HIP headers
(ci/setup.d/20-gpu-toolchain.sh).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "core" / "tests" / "cpu"))
import hip_toolchain  # noqa: E402

CHILD = r"""
import cProfile, pstats, sys, time
from types import SimpleNamespace
import torch
from uccl_ep.cuda import ll, runtime
from uccl_ep.cuda.engine_context import EngineContext
from uccl_ep.tuning import Tuning

torch.version.hip, torch.version.cuda = "7.2.0", None  # a ROCm torch, as far as uccl_ep can tell
torch.cuda.synchronize = lambda *a, **k: None
ll.current_stream = lambda device=None: 0x5150
drv = runtime.driver()
errors = runtime.MappedHostMemory(0, 16384)
mem = runtime.DeviceMemory(0, 1 << 26)
handles = [mem.ipc_handle(), mem.ipc_handle()]
mask = runtime.DeviceMemory(0, 8)


def check_error():
    assert errors.int32(0) == 0


ec = EngineContext(ctx=SimpleNamespace(num_ranks=2, rank=0, enable_shrink=False, tuning=Tuning()), device=0, drv=drv,
                   timeout_ns=10**9, errors=errors, error_dev_ptr=errors.dev_ptr, mask_ptr=mask.ptr, ll_mem=mem,
                   ll_peer_base=[mem.ptr, mem.open_peer(handles[1])], check_error=check_error)
eng = ll.LowLatencyEngine(ec)
T, H, E, num_max = 8, 2048, 16, 8
x = torch.randn(T, H).to(torch.bfloat16)
topk = torch.stack([torch.randperm(E)[:4] for _ in range(T)])
w = torch.rand(T, 4)
y = torch.empty(E // 2, 2 * num_max, H, dtype=torch.bfloat16)


def dispatch():
    out = eng.dispatch(None, x, topk, num_max, E, True, False, False, set(), None, None)
    out[3](True)
    return out[2]


def step():
    out, finish = eng.combine(y, topk, w, dispatch(), set(), None, None, False)
    finish(True)


iters = int(sys.argv[1])
for name, fn in (("dispatch", dispatch), ("dispatch + combine", step)):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    print(f"{name:20s} {best * 1e6:7.1f} us host per call (best of 5 x {iters})")
if sys.argv[2] == "1":
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)
"""


def main(argv: list[str]) -> int:
    profile = "--profile" in argv
    iters = int(argv[argv.index("--iters") + 1]) if "--iters" in argv else 2000
    clang = hip_toolchain.clang()
    if clang is None:
        print("needs clang-22 with Debian's HIP headers (ci/setup.d/20-gpu-toolchain.sh)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp)
        subprocess.run([clang, "-shared", "-fPIC", "-O1", str(ROOT / "core" / "tests" / "cpu" / "hip_standin.c"),
                        "-o", str(lib / "libamdhip64.so")], check=True)
        env = dict(os.environ, LD_LIBRARY_PATH=str(lib), STANDIN_LOG="/dev/null", UCCL_EP_CUDA_ARCH="gfx942",
                   UCCL_EP_HIPCC=str(hip_toolchain.hipcc_wrapper(lib)),
                   UCCL_EP_JIT_CACHE_DIR=os.path.expanduser("~/.cache/uccl_ep/ci-hip-jit"))
        return subprocess.run([sys.executable, "-c", CHILD, str(iters), "1" if profile else "0"], env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
