"""Probe (not a test): push -> descriptor seen through a real proxy thread, on the GPU clock.

One GPU thread (ll_proxy_rtt_probe, tools/lab/probe_copy_ring.cu) pushes a small counted Write and its fenced
Atomic into the FIFO that serves the peer, exactly as the LL send kernels do, and polls the copy
ring of the proxy thread serving that FIFO until the proxy's descriptor for it appears; then it
plays the copy kernel (copies the bytes, publishes `done`) so the proxy delivers the immediate as
usual. Nothing else runs: no send kernel, no copy kernel polling, so the numbers are what the FIFO,
the proxy thread and the copy ring cost alone, to compare with the same hop in the LL path (the
bench's `push→seen` column) and with a bare GPU -> CPU -> GPU echo (probe_host_echo.cu); the
numbers are in docs/benchmarks.md.

UCCL_EP_FORCE_PROXY=1 python tools/lab/probe_proxy_rtt.py [iters]
Prints, per case, p10 / p50 / p90 of the push itself, push -> the descriptor's seq seen, the read of
its other words (three 8-byte loads, or two 16-byte loads), and the 16-byte copy + done.
"""

from __future__ import annotations

import os
import struct
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402
from lab_kernels import LabModule  # noqa: E402  (beside this file)


def _pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] / 1e3


def worker(rank, world, iters):
    from uccl_ep import Buffer
    from uccl_ep.cuda import runtime as rt
    from uccl_ep.cuda.ll_proxy import counter_base
    dev = torch.cuda.current_device()
    group = dist.group.WORLD
    nbytes = Buffer.get_low_latency_rdma_size_hint(128, 7168, world, 288)
    buf = Buffer(group, 0, nbytes, low_latency_mode=True, backend="cuda", allow_nvlink_for_low_latency_mode=False)
    eng = buf._executor._ll_engine()
    assert eng.copy_kernel, "needs the ipc transport's copy kernel (UCCL_EP_IPC_COPY=kernel)"
    lab = LabModule(dev, "probe_copy_ring.cu")
    kern = lab.kernel("ll_proxy_rtt_probe")
    peer = (rank + 1) % world
    f = peer % eng.num_fifos  # fifo_for(dst) in the kernels
    g = f % eng.num_proxy_threads
    ring = struct.unpack("<Q", eng.drv.memcpy_dtoh(dev, eng.dma_mem.ptr + 8 * g, 8))[0]  # the ring table
    out = torch.zeros(iters * 4, dtype=torch.int64, device="cuda")
    nxt = [0]
    results = []

    def case(label, gap_us, both, read_mode=0):
        p = lab.pack("ProxyRttProbeParams", fifo=eng.fifo_table.ptr + f * eng.C.FIFO_LAYOUT_BYTES, ring=ring,
                           out=out.data_ptr(), status=eng.status_dev, error=eng.ec.error_dev_ptr,
                           first_idx=nxt[0], iters=iters, gap_ns=int(gap_us * 1000), dst=peer, len=16,
                           counter=counter_base(0, 0), rank=rank, timeout_ns=10 * 10**9,
                           read_mode=read_mode)
        torch.cuda.synchronize()
        dist.barrier()
        if both or rank == 0:
            kern.launch(1, 32, p, rt.current_stream())
            nxt[0] += iters
        torch.cuda.synchronize()
        eng.ec.check_error()
        dist.barrier()
        if both or rank == 0:
            v = out.view(iters, 4).cpu().tolist()[5:]
            results.append((label, [_pct([r[k] for r in v], q) for k in range(4) for q in (0.1, 0.5, 0.9)]))
        else:
            results.append((label, None))

    for gap in (0, 20):
        case(f"gap {gap:>2} us, both ranks", gap, True)
        case(f"gap {gap:>2} us, rank 0 alone", gap, False)
        case(f"gap {gap:>2} us, both, 16 B reads", gap, True, 1)
    torch.cuda.synchronize()
    dist.barrier()
    return results


if __name__ == "__main__":
    os.environ.setdefault("UCCL_EP_FORCE_PROXY", "1")
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    res = run_ranks(worker, 2, n, backend="nccl", timeout_s=300)
    print(f"{n} round trips per case, us (p10 / p50 / p90); threads={os.environ.get('UCCL_EP_NUM_PROXY_THREADS', '4')} "
          f"idle={os.environ.get('UCCL_EP_PROXY_IDLE_SLEEP_US', 'auto')}")
    print(f"{'rank case':34s} {'push':>18s} {'push -> seq seen':>20s} {'descriptor read':>18s} {'copy + done':>18s}")
    for r, rows in enumerate(res):
        for label, v in rows:
            if v is not None:
                print(f"{r} {label:32s} " + "  ".join("/".join(f"{x:5.1f}" for x in v[3 * k:3 * k + 3]) for k in range(4)))
