"""Host path of eager calls, uccl-ep beside DeepEP (when `deep_ep` imports the real library): not a test.

python tools/lab/host_path.py ll|ht|all uccl|deepep [--profile] [--python-path]   (one library per process: DeepEP's
NVSHMEM takes one low-latency Buffer per process, and a crash of one library must not hide the other's rows)

Per library and shape (every GPU as one rank):
  eager     mean device time of back-to-back calls between CUDA events (what DeepEP's bench sees)
  host      host time to issue one call while the GPU is kept busy by a sleep kernel: what the
            Python + driver path costs, with no device wait hidden in it (a host-synchronizing call
            shows up here as the sleep's length)
  synced    event-to-event time of one call issued on an idle GPU and waited for
LL: dispatch + combine (FP8 dispatch), HT: layout + dispatch (fresh), cached dispatch, combine.
--profile adds cProfile of rank 0's uccl-ep host path (top functions by own time); --python-path runs
uccl-ep's LL engine without its torch ops (Tuning(ll_torch_ops=False)); --layers adds, for LL, the host
time per call of each layer (uccl-ep: Buffer, executor, engine; 5 torch.empty as a yardstick), best
of several batches issued while the GPU sleeps.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402

PYTHON_PATH = "--python-path" in sys.argv
LAYERS = "--layers" in sys.argv
LL_SHAPES = [(128, 7168, 288, 8), (64, 4096, 64, 8)]
HT_SHAPES = [(512, 4096, 64, 6), (4096, 7168, 256, 8)]


def _deepep():
    try:
        import deep_ep
        import deep_ep_cpp  # noqa: F401  the real library, not uccl-ep's drop-in package
        return deep_ep
    except ImportError:
        return None


def _time(fn, iters=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    eager = s.elapsed_time(e) * 1e3 / iters
    # host: the GPU sleeps ~20 ms first, so every launch below is only queued
    dist.barrier()
    torch.cuda._sleep(int(2e7 * 1.98))
    t0 = time.perf_counter()
    n = 10
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    dist.barrier()
    synced = []
    for _ in range(10):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        synced.append(a.elapsed_time(b) * 1e3)
    synced.sort()
    return dict(eager=eager, host=host, synced=synced[len(synced) // 2])


def _host_only(fn, n=20, batches=7):
    """Best host µs per call of `fn` over `batches` batches of `n` calls, each batch issued while
    the GPU sleeps (nothing waits for the device; collective calls stay paired across ranks)."""
    best = float("inf")
    for _ in range(batches):
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda._sleep(int(2e7 * 1.98))
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    torch.cuda.synchronize()
    dist.barrier()
    return best


def _ll_layers(buf, x, idx, w, y, T, E, dev):
    """Host µs per dispatch and per combine at each layer of uccl-ep's LL path."""
    ex = buf._executor
    eng = ex._ll or ex._ll_engine()
    _, _, h, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)
    out = {"5 torch.empty": _host_only(lambda: [torch.empty(T, 7168, dtype=torch.bfloat16, device=dev)
                                                for _ in range(5)])}
    out["dispatch: Buffer"] = _host_only(lambda: buf.low_latency_dispatch(x, idx, T, E, use_fp8=True))
    out["dispatch: executor"] = _host_only(lambda: ex.low_latency_dispatch(x, idx, T, E, True, False, False, (), None,
                                                                           None, recv_follows=True)[3](True))
    out["dispatch: engine"] = _host_only(lambda: eng.dispatch(buf, x, idx, T, E, True, False, False, (), None, None,
                                                             recv_follows=True)[3](True))
    out["combine: Buffer"] = _host_only(lambda: buf.low_latency_combine(y, idx, w, h))
    out["combine: executor"] = _host_only(lambda: ex.low_latency_combine(y, idx, w, h, (), None, None,
                                                                         recv_follows=True)[1](True))
    out["combine: engine"] = _host_only(lambda: eng.combine(y, idx, w, h, (), None, None, False,
                                                           recv_follows=True)[1](True))
    return out


def _cprofile(fn, n=100):
    import cProfile
    import io
    import pstats
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    st = pstats.Stats(prof, stream=text)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(40)
    return text.getvalue()


def _ll(lib, group, rank, world, dev, shape, profile, name):
    T, H, E, K = shape
    gen = torch.Generator().manual_seed(rank + 7)
    hint = lib.Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    kw = dict(num_qps_per_rank=E // world, allow_nvlink_for_low_latency_mode=True) if name == "deepep" else \
        dict(backend="cuda", explicitly_destroy=True, tuning=lib.Tuning(ll_torch_ops=not PYTHON_PATH))
    buf = lib.Buffer(group, 0, hint, low_latency_mode=True, **kw)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(K, -1).indices.to(dev)
    w = torch.rand(T, K, generator=gen).to(dev)
    y = torch.randn(E // world, world * T, H, generator=gen).to(torch.bfloat16).to(dev)

    def step():
        _, _, h, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)
        buf.low_latency_combine(y, idx, w, h)
    out = {f"ll {T}x{H} e{E} k{K} d+c": _time(step)}
    out[f"ll {T}x{H} e{E} k{K} dispatch"] = _time(lambda: buf.low_latency_dispatch(x, idx, T, E, use_fp8=True))
    if LAYERS and name != "deepep":
        for k, v in _ll_layers(buf, x, idx, w, y, T, E, dev).items():
            out[f"ll {T}x{H} host {k}"] = dict(eager=0.0, host=v, synced=0.0)
    prof = _cprofile(step) if profile else None  # every rank runs the calls (they are collective)
    torch.cuda.synchronize()
    dist.barrier()
    buf.destroy() if hasattr(buf, "destroy") and name != "deepep" else None
    return out, prof


def _ht(lib, group, rank, world, dev, shape, profile, name):
    T, H, E, K = shape
    gen = torch.Generator().manual_seed(rank + 11)
    lib.Buffer.set_num_sms(24)
    cfg = lib.Buffer.get_dispatch_config(world)
    ccfg = lib.Buffer.get_combine_config(world)
    kw = {} if name == "deepep" else dict(backend="cuda", explicitly_destroy=True)
    buf = lib.Buffer(group, max(cfg.get_nvl_buffer_size_hint(H * 2, world), ccfg.get_nvl_buffer_size_hint(H * 2, world)),
                     0, **kw)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    scores = torch.randn(T, E, generator=gen).abs() + 1
    idx = scores.topk(K, -1).indices.to(dev)
    w = torch.rand(T, K, generator=gen).to(dev)

    def fresh():
        a, b, c, d, _ = buf.get_dispatch_layout(idx, E)
        return buf.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=a, num_tokens_per_rdma_rank=b,
                            is_token_in_rank=d, num_tokens_per_expert=c, config=cfg)
    rx, _, rw, _, h, _ = fresh()
    tag = f"ht {T}x{H} e{E} k{K}"
    out = {f"{tag} layout+dispatch": _time(fresh),
           f"{tag} cached dispatch": _time(lambda: buf.dispatch(x, handle=h, config=cfg)),
           f"{tag} combine": _time(lambda: buf.combine(rx, h, topk_weights=rw, config=ccfg))}
    prof = None
    if profile:  # every rank runs the calls (they are collective)
        prof = _cprofile(lambda: (fresh(), buf.combine(rx, h, topk_weights=rw, config=ccfg)), n=50)
    torch.cuda.synchronize()
    dist.barrier()
    return out, prof


def worker(rank, world, what, which, profile):
    import uccl_ep
    torch.cuda.set_device(rank % torch.cuda.device_count())
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    libs = [("uccl", uccl_ep)] if which == "uccl" else []
    de = _deepep() if which == "deepep" else None
    if de is not None:
        libs.append(("deepep", de))
    rows, profs = {}, []
    for name, lib in libs:
        for kind, shapes, fn in (("ll", LL_SHAPES, _ll), ("ht", HT_SHAPES, _ht)):
            if what not in (kind, "all"):
                continue
            for shape in shapes:
                try:
                    out, prof = fn(lib, group, rank, world, dev, shape, profile and name == "uccl", name)
                except Exception as e:  # noqa: BLE001  a lab tool: report and go on
                    out, prof = {f"{kind} {shape} FAILED {type(e).__name__}: {str(e)[:200]}": {}}, None
                rows.update({f"{name:6s} {k}": v for k, v in out.items()})
                print(f"rank {rank}: {name} {kind} {shape} done", file=sys.stderr, flush=True)
                if prof:
                    profs.append(f"--- uccl {kind} {shape}\n{prof}")
    return {"rows": rows, "profs": profs}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    what, which = (args + ["all", "uccl"][len(args):])[:2]
    # NOTES: gloo: a barrier must not queue GPU work behind (or in front of) the kernels it separates
    res = run_ranks(worker, min(torch.cuda.device_count(), 8), what, which, "--profile" in sys.argv, backend="gloo",
                    timeout_s=600)
    for p in res[0]["profs"]:  # rank 0's
        print(p)
    print(f"{'rank':4s} {'row':52s} {'eager us':>9s} {'host us':>9s} {'synced us':>9s}")
    for r, out in enumerate(res):
        for k, v in out["rows"].items():
            if v:
                print(f"{r:<4d} {k:52s} {v['eager']:9.1f} {v['host']:9.1f} {v['synced']:9.1f}")
            else:
                print(f"{r:<4d} {k}")
