"""Per-kernel device times of the cuda backend (torch profiler), and the host time of one call, for
tuning; not a test.

python tools/lab/profile_kernels.py [ll|ht] [KEY=VALUE ...]   (every GPU; prints each rank's table;
                                                   KEY=VALUE: uccl_ep.Tuning fields, as bench --tune)
python tools/lab/profile_kernels.py llhost    (cProfile of rank 0's eager LL dispatch + combine
                                                   host path: where the per-call host time goes)

`host/call` is the wall time of issuing one call without waiting for the device (mean over a
back-to-back loop): when it exceeds the call's kernel times, back-to-back calls are host-bound.
LL is profiled as dispatch + combine (what the graph replays) and as dispatch alone (what the
bench's eager dispatch row repeats). The LL receive kernels run with Tuning(ll_pdl=False) here unless
the caller passes ll_pdl=1: launched early (the default), a receive kernel's span includes waiting for its
send kernel and the peer, so its device time no longer says what it costs.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402
try:  # a tree from before uccl_ep.Tuning (run_device.sh compare) profiles with its defaults
    from uccl_ep.tuning import Tuning  # noqa: E402
except ImportError:
    Tuning = None


def _tuning(pairs) -> dict:
    """Buffer's tuning= argument for KEY=VALUE pairs (nothing on a tree without uccl_ep.Tuning)."""
    return {"tuning": Tuning.from_pairs(tuple(pairs))} if Tuning is not None else {}


def _profile(fn, iters=20, tag=""):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host_us = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = {f"{tag}host/call": (iters, host_us)}
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA and evt.key.startswith(("ll_", "ht_", "copy_ring")):
            rows[tag + evt.key] = (evt.count, evt.device_time_total / max(evt.count, 1))
    return rows


def worker(rank, world, what, tune=()):
    from uccl_ep import Buffer
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(rank)
    out = {}
    if what in ("ll", "llhost"):
        T, H, E = 128, 7168, 288
        buf = Buffer(group, 0, Buffer.get_low_latency_rdma_size_hint(T, H, world, E), low_latency_mode=True,
                     backend="cuda", **_tuning(("ll_pdl=0",) + tuple(tune)))
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
        idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(8, -1).indices.to(dev)
        w = torch.rand(T, 8, generator=gen).to(dev)
        _, _, h, _, _ = buf.low_latency_dispatch(x, idx, T, E)
        y = torch.randn(E // world, world * T, H, generator=gen).to(torch.bfloat16).to(dev)

        def step():
            _, _, hh, _, _ = buf.low_latency_dispatch(x, idx, T, E)
            buf.low_latency_combine(y, idx, w, hh)
        if what == "llhost":
            import cProfile
            import io
            import pstats
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            dist.barrier()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                step()
            prof.disable()
            torch.cuda.synchronize()
            dist.barrier()
            text = io.StringIO()
            st = pstats.Stats(prof, stream=text)
            st.sort_stats("tottime").print_stats(30)
            st.sort_stats("cumulative").print_stats(30)
            return {"cprofile": text.getvalue()} if rank == 0 else {}
        out = _profile(step, tag="d+c ")
        out.update(_profile(lambda: buf.low_latency_dispatch(x, idx, T, E), tag="dispatch-only "))
    else:
        T, H, E = 4096, 7168, 256
        Buffer.set_num_sms(24)
        cfg = Buffer.get_dispatch_config(world)
        buf = Buffer(group, cfg.get_nvl_buffer_size_hint(H * 2, world), 0, backend="cuda",
                     **_tuning(tune))
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
        idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(8, -1).indices.to(dev)
        a, _, c, d, _ = buf.get_dispatch_layout(idx, E)
        rx, _, _, _, h, _ = buf.dispatch(x, num_tokens_per_rank=a, is_token_in_rank=d, num_tokens_per_expert=c,
                                         config=cfg)

        def step():
            buf.dispatch(x, handle=h, config=cfg)
            buf.combine(rx, h)
        out = _profile(step)
    return out


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "ll"
    tune = tuple(sys.argv[2:])
    _tuning(tune)  # a bad KEY=VALUE is refused before any rank starts
    res = run_ranks(worker, min(torch.cuda.device_count(), 8), what, tune, backend="nccl", timeout_s=300)
    for r, rows in enumerate(res):
        if "cprofile" in rows:
            print(rows.pop("cprofile"))
        for k, (n, us) in sorted(rows.items()):
            print(f"rank {r} {k:40s} x{n:3d} {us:9.1f} us")
