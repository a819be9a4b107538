"""Host path of the cuda executor's low-latency engine on a CPU, with no GPU: not a test.

python tools/lab/host_path_standin.py [--profile [--sort tottime|cumtime]] [--iters N] [--python-path]

The engine (`uccl_ep.cuda.ll.LowLatencyEngine`) runs over the HIP stand-in runtime of the CPU tests
(core/tests/cpu/hip_standin.c: every driver call answers at once, kernels are JIT-compiled for gfx942
with Debian's clang 22, as `test_hip_runtime_loader.py` does), on CPU tensors, one rank of 2. It
prints the host time of one dispatch (send + receive launch) and of one dispatch + combine, best of
15 rounds, at the engine and through `Buffer.low_latency_dispatch` / `low_latency_combine` (every
check and object the public call makes); `--profile` adds cProfile of the Buffer's calls by own time. What it measures is the
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
import torch
from uccl_ep.cuda import ll
from uccl_ep.tuning import Tuning
from standin_engine import engine_context

ec, errors, mem = engine_context(Tuning(ll_torch_ops=sys.argv[4] == "1"), 1 << 26)
eng = ll.LowLatencyEngine(ec)
T, H, E, num_max = 8, 2048, 16, 8
x = torch.randn(T, H).to(torch.bfloat16)
topk = torch.stack([torch.randperm(E)[:4] for _ in range(T)])
w = torch.rand(T, 4)
y = torch.empty(E // 2, 2 * num_max, H, dtype=torch.bfloat16)


def dispatch():
    out = eng.dispatch(None, x, topk, num_max, E, True, False, False, set(), None, None, recv_follows=True)
    out[3](True)
    return out[2]


def step():
    out, finish = eng.combine(y, topk, w, dispatch(), set(), None, None, False, recv_follows=True)
    finish(True)


# the same engine under the public API: a Buffer and a cuda executor around it, built without their
# constructors (no process group, no CUDA torch); only the device check, which wants a cuda tensor,
# is left out
from uccl_ep.buffer import Buffer
from uccl_ep.cuda.executor import CudaExecutor

buf = Buffer.__new__(Buffer)
ex = CudaExecutor.__new__(CudaExecutor)
ex.__dict__.update(_failure=None, errors=errors, _ll=eng, owner=buf, device=0)
ex._check_cuda = lambda name, t: None
buf.__dict__.update(_destroyed=False, low_latency_mode=True, group_size=2, rank=0, num_rdma_bytes=mem.nbytes,
                    _executor=ex, enable_shrink=False)
buf._init_low_latency_state()
x_gpu_like = x  # CPU tensors: Buffer runs its CPU-only id range check on them; keep it out of the timing
import uccl_ep.buffer_low_latency as bll
bll.check_topk_ids_in_range = lambda *a: None


def api_dispatch():
    recv_x, count, handle, event, hook = buf.low_latency_dispatch(x, topk, num_max, E, use_fp8=True)
    return handle


def api_step():
    buf.low_latency_combine(y, topk, w, api_dispatch())


def ex_dispatch():
    out = ex.low_latency_dispatch(x, topk, num_max, E, True, False, False, (), None, None, recv_follows=True)
    out[3](True)
    return out[2]


def ex_step():
    out, finish = ex.low_latency_combine(y, topk, w, ex_dispatch(), (), None, None, recv_follows=True)
    finish(True)


def api_hook_step():  # the receive phases through the hooks (two-batch overlap, as SGLang and vLLM run it)
    recv_x, count, handle, event, hook = buf.low_latency_dispatch(x, topk, num_max, E, use_fp8=True,
                                                                  return_recv_hook=True)
    hook()
    buf.low_latency_combine(y, topk, w, handle, return_recv_hook=True)[2]()


iters = int(sys.argv[1])
print(f"engine path: {'torch op' if eng._torch_ops is not None else 'Python'}")
# NOTES: rounds of every variant in turn, best of each: a small shared machine's noise comes in stretches
variants = (("dispatch", dispatch), ("dispatch + combine", step), ("executor dispatch", ex_dispatch),
            ("executor D + C", ex_step), ("Buffer dispatch", api_dispatch),
            ("Buffer D + C", api_step), ("Buffer D + C, hooks", api_hook_step))
best = {name: float("inf") for name, _ in variants}
for _ in range(15):
    for name, fn in variants:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best[name] = min(best[name], (time.perf_counter() - t0) / iters)
for name, fn in variants:
    # the function calls (Python and builtin) of one call, as cProfile counts them: noise-free
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        fn()
    prof.disable()
    calls = sum(v[1] for v in pstats.Stats(prof).stats.values()) / 100
    print(f"{name:20s} {best[name] * 1e6:7.1f} us host per call (best of 15 rounds x {iters}), {calls:5.0f} "
          "function calls")
if sys.argv[2] == "1":
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        api_step()
    prof.disable()
    pstats.Stats(prof).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "tottime").print_stats(25)
"""


def main(argv: list[str]) -> int:
    profile = "--profile" in argv
    iters = int(argv[argv.index("--iters") + 1]) if "--iters" in argv else 300
    clang = hip_toolchain.clang()
    if clang is None:
        print("needs clang-22 with Debian's HIP headers (ci/setup.d/20-gpu-toolchain.sh)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp)
        subprocess.run([clang, "-shared", "-fPIC", "-O1", str(ROOT / "core" / "tests" / "cpu" / "hip_standin.c"),
                        "-o", str(lib / "libamdhip64.so")], check=True)
        env = dict(os.environ, LD_LIBRARY_PATH=str(lib), STANDIN_LOG="none",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "core" / "tests" / "cpu"), os.environ.get("PYTHONPATH", "")]), UCCL_EP_CUDA_ARCH="gfx942",
                   UCCL_EP_HIPCC=str(hip_toolchain.hipcc_wrapper(lib)),
                   UCCL_EP_JIT_CACHE_DIR=os.path.expanduser("~/.cache/uccl_ep/ci-hip-jit"))
        sort = argv[argv.index("--sort") + 1] if "--sort" in argv else "tottime"
        python_path = "--python-path" in argv
        return subprocess.run([sys.executable, "-c", CHILD, str(iters), "1" if profile else "0", sort,
                               "0" if python_path else "1"],
                              env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
