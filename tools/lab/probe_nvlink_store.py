"""Probe (not a test): SM pushes of 14 KB rows over NVLink in both directions at once, the LL
combine's NVLink leg, with 16-byte stores (with and without a system fence per row) and with
cp.async.bulk; torch's peer copy of the same bytes for comparison. Every GPU pair (2 ranks).

python tools/lab/probe_nvlink_store.py [rows] [row_bytes] [few]
  few: instead, what a handful of SMs (6, 12, 24 blocks) can push: the HT kernels' budget at <= 12 SMs.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402


def _compile(arch: str) -> bytes:
    from uccl_ep.cuda import jit
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_nvlink_store.cu")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.cubin")
        cmd = [str(jit.find_nvcc()), *jit.default_flags(arch), f"-I{jit.include_dir()}", src, "-o", out]
        subprocess.run(cmd, check=True)
        return open(out, "rb").read()


def worker(rank, world, rows, row_bytes, few):
    from uccl_ep.cuda import runtime as rt
    dev = torch.cuda.current_device()
    drv = rt.driver()
    mod = drv.module_load(dev, _compile(rt.device_arch(dev)))
    kern = {n: rt.Kernel(dev, drv.module_function(mod, n), n) for n in ("probe_warp16", "probe_bulk")}
    nbytes = rows * row_bytes
    # The combine's real pattern at 128 tokens / 288 experts / EP2: item i (in expert order) reads row
    # r of local expert e's slab [144][256 rows] and writes row [global expert][token] of [288][128].
    E_loc, slab, num_max = 144, 256, 128
    area = E_loc * slab * row_bytes
    g = torch.Generator().manual_seed(rank)
    e_of = torch.arange(rows) * E_loc // rows
    first = torch.searchsorted(e_of, e_of)
    src_idx = (e_of * slab + torch.arange(rows) - first).cuda()
    dst_idx = ((e_of + E_loc * (torch.arange(rows) % 2)) * num_max + torch.randint(0, num_max, (rows,), generator=g)).cuda()
    recv = rt.DeviceMemory(dev, area)
    handles = [None] * world
    dist.all_gather_object(handles, recv.ipc_handle())
    peer = recv.open_peer(handles[(rank + 1) % world])
    src = torch.randn(area // 2, device="cuda").to(torch.bfloat16).view(torch.uint8)
    local = torch.empty(area, dtype=torch.uint8, device="cuda")
    peer_t = torch.empty(area, dtype=torch.uint8, device=f"cuda:{(dev + 1) % torch.cuda.device_count()}")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    slot = (row_bytes + 127) // 128 * 128

    def timed(fn, iters=50):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        dist.barrier()
        return s.elapsed_time(e) / iters * 1e3

    def launch(name, grid, block, remote_every, fence, smem=0, scatter=False):
        sidx, didx = (src_idx.data_ptr(), dst_idx.data_ptr()) if scatter else (0, 0)
        params = struct.pack("<QQQqqqqQQ", peer, local.data_ptr(), src.data_ptr(), rows, row_bytes, remote_every,
                             fence, sidx, didx)
        return lambda: kern[name].launch(grid, block, params, rt.current_stream(), smem=smem)

    out = []
    if few:
        for remote_every, what in ((1, "all remote"), (2, "half remote"), (0, "all local")):
            rbytes = nbytes if remote_every in (0, 1) else nbytes // 2  # local: bytes copied
            for blocks in (6, 12, 24):
                cases = [(f"warp16 {blocks}x{t}", launch("probe_warp16", blocks, t, remote_every, 0))
                         for t in (256, 512, 1024)]
                cases += [(f"bulk {blocks}x{w * 32}", launch("probe_bulk", blocks, w * 32, remote_every, 1,
                                                               smem=2 * w * slot)) for w in (4, 7)]
                for label, fn in cases:
                    us = timed(fn, iters=10)
                    out.append((what, label, us, rbytes / us / 1e3))
        recv.free()
        return out
    for remote_every, what in ((1, "all remote"), (2, "half remote"), (0, "all local")):
        rbytes = nbytes if remote_every == 1 else (nbytes // 2 if remote_every == 2 else 0)
        cases = [
            ("warp16 2x256/SM", launch("probe_warp16", 2 * num_sms, 256, remote_every, 0)),
            ("warp16 2x256/SM fence/row", launch("probe_warp16", 2 * num_sms, 256, remote_every, 1)),
            ("warp16 1x256/SM", launch("probe_warp16", num_sms, 256, remote_every, 0)),
            ("warp16 4x256/SM", launch("probe_warp16", 4 * num_sms, 256, remote_every, 0)),
            ("bulk 1x128/SM", launch("probe_bulk", num_sms, 128, remote_every, 1, smem=8 * slot)),
            ("bulk 64 blocks", launch("probe_bulk", 64, 128, remote_every, 1, smem=8 * slot)),
            ("scattered warp16 2x256/SM", launch("probe_warp16", 2 * num_sms, 256, remote_every, 1, scatter=True)),
            ("scattered warp16 1x256/SM", launch("probe_warp16", num_sms, 256, remote_every, 1, scatter=True)),
            ("scattered bulk 1x128/SM", launch("probe_bulk", num_sms, 128, remote_every, 1, smem=8 * slot,
                                               scatter=True)),
        ]
        for label, fn in cases:
            us = timed(fn)
            out.append((what, label, us, rbytes / us / 1e3 if rbytes else 0.0))
    if world == 2 and torch.cuda.device_count() >= 2:
        us = timed(lambda: peer_t[:nbytes].copy_(local[:nbytes], non_blocking=True))
        out.append(("all remote", "torch peer copy (copy engine)", us, nbytes / us / 1e3))
    torch.cuda.synchronize()
    recv.free()
    return out


if __name__ == "__main__":
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    row_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 7168 * 2
    few = len(sys.argv) > 3 and sys.argv[3] == "few"
    res = run_ranks(worker, 2, rows, row_bytes, few, backend="nccl", timeout_s=300)
    print(f"{rows} rows x {row_bytes} B per rank, both ranks pushing at once")
    print(f"{'rows':12s} {'kernel':34s} {'rank0 us':>9s} {'GB/s':>7s} {'rank1 us':>9s} {'GB/s':>7s}")
    for a, b in zip(res[0], res[1]):
        print(f"{a[0]:12s} {a[1]:34s} {a[2]:9.1f} {a[3]:7.1f} {b[2]:9.1f} {b[3]:7.1f}")
