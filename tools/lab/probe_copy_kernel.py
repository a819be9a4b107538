"""Probe (not a test): the ipc transport's copy kernel (transport/copy_ring.cu) alone, without proxies.

Each of 2 ranks fills a copy ring in pinned host memory with descriptors (this rank's buffer ->
the peer's buffer, opened through CUDA IPC) exactly as the proxy does (dma_ring.h), counts their
bytes in `pushed`, and launches the real kernel; both ranks at once, as in the LL proxy path. Two
shapes: one launch per descriptor (what each LL op does) and one launch for all of them
(throughput). A torch peer copy of the same bytes is the baseline. It tells whether the kernel's
~100 GB/s in the proxy path (docs/benchmarks.md) is the kernel's own rate or its surroundings.

python tools/lab/probe_copy_kernel.py [bytes_per_descriptor] [blocks_per_ring ...]
  defaults: 3784704 (the 128-token dispatch region) and blocks 4 8 16 32
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

CAPACITY = 8192          # dma_ring.h kDmaRingCapacity
HEADER, DESC = 64, 32    # DmaRingHeader, DmaDesc
CONSUMER = 128           # DmaConsumer (dma_ring.h)


def worker(rank, world, nbytes, blocks_list):
    from uccl_ep.cuda import runtime as rt
    dev = torch.cuda.current_device()
    kern = rt.load_kernel(dev, "transport/copy_ring.cu", "ll_proxy_dma")
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    recv = rt.DeviceMemory(dev, nbytes)
    handles = [None] * world
    dist.all_gather_object(handles, recv.ipc_handle())
    peer = recv.open_peer(handles[(rank + 1) % world])
    ring = torch.zeros(HEADER + CAPACITY * DESC, dtype=torch.uint8, pin_memory=True)  # UVA: host = device address
    words = ring.view(torch.int64)
    status = torch.zeros(8, dtype=torch.int64, pin_memory=True)
    error = torch.zeros(8, dtype=torch.int32, pin_memory=True)
    state = torch.zeros(CONSUMER // 8, dtype=torch.int64, device="cuda")
    finish = torch.zeros(CAPACITY, dtype=torch.int32, device="cuda")
    mirror = torch.zeros(CAPACITY * DESC, dtype=torch.uint8, device="cuda")
    pushed = torch.zeros(1, dtype=torch.int64, device="cuda")
    table = torch.tensor([ring.data_ptr()], dtype=torch.int64, device="cuda")
    nxt = [0]

    def post(n):  # the proxy's part: n descriptors, seq written last
        for _ in range(n):
            i = nxt[0] % CAPACITY
            base = (HEADER + i * DESC) // 8
            words[base:base + 3] = torch.tensor([peer, src.data_ptr(), nbytes], dtype=torch.int64)
            words[base + 3] = nxt[0] + 1
            nxt[0] += 1

    def params(blocks):
        return rt.pack_params("LLProxyDmaParams", rings=table.data_ptr(), pushed=pushed.data_ptr(),
                              state=state.data_ptr(), finish=finish.data_ptr(), mirror=mirror.data_ptr(), status=status.data_ptr(),
                              error=error.data_ptr(), num_rings=1, blocks_per_ring=blocks, rank=rank,
                              timeout_ns=20 * 10**9)

    def run(blocks, per_launch, count):
        p = params(blocks)
        post(count)
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        if per_launch:
            for _ in range(count):
                pushed.add_(nbytes)
                kern.launch(blocks, 512, p, rt.current_stream())
        else:
            pushed.add_(nbytes * count)
            kern.launch(blocks, 512, p, rt.current_stream())
        e.record()
        torch.cuda.synchronize()
        assert int(error[0]) == 0, f"rank {rank}: device error {error.tolist()}"
        dist.barrier()
        return s.elapsed_time(e) / count * 1e3

    out = []
    run(8, True, 3)  # warm-up
    for blocks in blocks_list:
        for per_launch in (True, False):
            us = run(blocks, per_launch, 20)
            out.append((f"{blocks} blocks, {'a launch per descriptor' if per_launch else 'one launch for 20'}",
                        us, nbytes / us / 1e3))
    # The copy loop alone (ll_proxy_dma_probe): to the peer and to local memory, both ranks at once
    # or rank 0 alone, with and without the per-descriptor system fence.
    lab = LabModule(dev, "probe_copy_ring.cu")
    probe = lab.kernel("ll_proxy_dma_probe")
    local = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def pure(dst, blocks, fence, both, reps=20):
        p = lab.pack("CopyProbeParams", dst=dst, src=src.data_ptr(), len=nbytes, reps=reps, fence=fence)
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        if both or rank == 0:
            probe.launch(blocks, 512, p, rt.current_stream())
        e.record()
        torch.cuda.synchronize()
        dist.barrier()
        return s.elapsed_time(e) / reps * 1e3

    pure(peer, 8, 0, True, 2)  # warm-up
    for target, addr in (("peer", peer), ("local", local.data_ptr())):
        for both in ((True, False) if target == "peer" else (True,)):
            for blocks in (8, 16, 32, 64, 132):
                for fence in (0, 1):
                    us = pure(addr, blocks, fence, both)
                    label = f"loop only -> {target}, {blocks} blocks{', fenced' if fence else ''}{'' if both else ', rank 0 alone'}"
                    out.append((label, us, nbytes / us / 1e3 if us > 1 else 0.0))
    if torch.cuda.device_count() >= 2:
        dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{(dev + 1) % torch.cuda.device_count()}")
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            dst.copy_(src, non_blocking=True)
        e.record()
        torch.cuda.synchronize()
        us = s.elapsed_time(e) / 20 * 1e3
        out.append(("torch peer copy (copy engine)", us, nbytes / us / 1e3))
    dist.barrier()
    recv.free()
    return out


if __name__ == "__main__":
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 3784704
    blocks = [int(b) for b in sys.argv[2:]] or [4, 8, 16, 32]
    res = run_ranks(worker, 2, nbytes, blocks, backend="nccl", timeout_s=300)
    print(f"{nbytes} B per descriptor, both ranks copying to each other at once")
    print(f"{'case':44s} {'rank0 us':>9s} {'GB/s':>7s} {'rank1 us':>9s} {'GB/s':>7s}")
    for a, b in zip(res[0], res[1]):
        print(f"{a[0]:44s} {a[1]:9.1f} {a[2]:7.1f} {b[1]:9.1f} {b[2]:7.1f}")
