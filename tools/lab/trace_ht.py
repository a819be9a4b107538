"""Device timeline of one HT op per kind (torch profiler, CUPTI): every kernel and copy of one cached
BF16 dispatch, one cached FP8 dispatch and one combine, per rank, with its stream, start (us after
the op's first device event) and duration. For finding what bounds a path (e.g. the copy-engine
dispatch, ht_dispatch_ce=1); not a test.

python tools/lab/trace_ht.py [--repeat N] [--synced] [num_sms] [out_dir] [KEY=VALUE ...]   (every GPU; KEY=VALUE:
uccl_ep.Tuning fields, as bench --tune; the caller's UCCL_EP_* settings, e.g. UCCL_EP_RANKS_PER_NODE=1
UCCL_EP_NIC_MODEL=efa-400g for the internode path under the NIC model)

--repeat N profiles N back-to-back calls of each op (default 1): the gaps between them and each
op's start-of-op kernels (the proxy path's handshake) show.

--synced: each call is waited for before the next (as `bench`'s synced rows), and the host side is
traced too (each call's span, the runtime and driver calls: launches, copies, the synchronize), on
the same clock as the device events: where a synced call's time goes between host and device.

Prints each rank's timelines; with out_dir, also writes the chrome traces there
(trace_<op>_r<rank>.json).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_HOST_CATS = ("cuda_runtime", "cuda_driver", "user_annotation")


def _timeline(path: str, host: bool = False) -> list[tuple]:
    """(start us, duration us, stream, name) of the device events in a chrome trace, from the first
    (with `host`, the host's runtime / driver calls and annotated spans too, stream "host")."""
    cats = _DEVICE_CATS + (_HOST_CATS if host else ())
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") in cats and "dur" in e]
    for e in events:
        if e.get("cat") in _HOST_CATS:
            e["tid"] = "host"
    if not events:
        return []
    t0 = min(e["ts"] for e in events)
    return sorted((e["ts"] - t0, e["dur"], e.get("tid"), e["name"][:60]) for e in events)


def worker(rank, world, num_sms, out_dir, tune=(), repeat=1, synced=False):
    from uccl_ep import Buffer, Tuning
    from uccl_ep.refs.fp8 import per_token_cast_to_fp8
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(rank)
    T, H, E = 4096, 7168, 256
    Buffer.set_num_sms(num_sms)
    cfg = Buffer.get_dispatch_config(world)
    buf = Buffer(group, cfg.get_nvl_buffer_size_hint(H * 2, world), 0, backend="cuda", tuning=Tuning.from_pairs(tune))
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    x_fp8 = per_token_cast_to_fp8(x)
    idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(8, -1).indices.to(dev)
    a, _, c, d, _ = buf.get_dispatch_layout(idx, E)
    rx, _, _, _, h, _ = buf.dispatch(x, num_tokens_per_rank=a, is_token_in_rank=d, num_tokens_per_expert=c, config=cfg)
    ops = {"dispatch_bf16": lambda: buf.dispatch(x, handle=h, config=cfg),
           "dispatch_fp8": lambda: buf.dispatch(x_fp8, handle=h, config=cfg),
           "combine": lambda: buf.combine(rx, h, config=cfg)}
    out = {}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    for name, fn in ops.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        acts = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if synced else [])
        with torch.profiler.profile(activities=acts) as prof:
            for i in range(repeat):
                with torch.profiler.record_function(f"{name}#{i}"):
                    fn()
                if synced:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
        dist.barrier()
        path = os.path.join(out_dir or tempfile.mkdtemp(), f"trace_{name}_r{rank}.json")
        prof.export_chrome_trace(path)
        out[name] = _timeline(path, host=synced)
    buf._executor.check_error()
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    repeat, synced = 1, False
    while args[:1] in (["--repeat"], ["--synced"]):
        if args[0] == "--synced":
            synced, args = True, args[1:]
        else:
            repeat, args = int(args[1]), args[2:]
    sms = int(args[0]) if args else 24
    out_dir = args[1] if len(args) > 1 else ""
    tune = tuple(args[2:])
    res = run_ranks(worker, min(torch.cuda.device_count(), 8), sms, out_dir, tune, repeat, synced, backend="nccl",
                    timeout_s=300)
    for r, per_op in enumerate(res):
        for name, rows in per_op.items():
            end = max((s + d for s, d, _, _ in rows), default=0)
            print(f"--- rank {r} {name} ({sms} SMs): {len(rows)} device events, {end:.1f} us first start -> last end")
            for s, d, tid, n in rows:
                print(f"rank {r} {name:14s} {s:8.1f} +{d:7.1f}  stream {tid!s:>4}  {n}")
