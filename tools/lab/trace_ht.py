"""Device timeline of one HT op per kind (torch profiler, CUPTI): every kernel and copy of one cached
BF16 dispatch, one cached FP8 dispatch and one combine, per rank, with its stream, start (us after
the op's first device event) and duration. For finding what bounds a path (e.g. the copy-engine
dispatch, ht_dispatch_ce=1); not a test.

python tools/lab/trace_ht.py [--repeat N] [num_sms] [out_dir] [KEY=VALUE ...]   (every GPU; KEY=VALUE:
uccl_ep.Tuning fields, as bench --tune; the caller's UCCL_EP_* settings, e.g. UCCL_EP_RANKS_PER_NODE=1
UCCL_EP_NIC_MODEL=efa-400g for the internode path under the NIC model)

--repeat N profiles N back-to-back calls of each op (default 1): the gaps between them and each
op's start-of-op kernels (the proxy path's handshake) show.

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


def _timeline(path: str) -> list[tuple]:
    """(start us, duration us, stream, name) of the device events in a chrome trace, from the first."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") in _DEVICE_CATS and "dur" in e]
    if not events:
        return []
    t0 = min(e["ts"] for e in events)
    return sorted((e["ts"] - t0, e["dur"], e.get("tid"), e["name"][:60]) for e in events)


def worker(rank, world, num_sms, out_dir, tune=(), repeat=1):
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
    for name, fn in ops.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(repeat):
                fn()
            torch.cuda.synchronize()
        dist.barrier()
        path = os.path.join(out_dir or tempfile.mkdtemp(), f"trace_{name}_r{rank}.json")
        prof.export_chrome_trace(path)
        out[name] = _timeline(path)
    buf._executor.check_error()
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    repeat = 1
    if args[:1] == ["--repeat"]:
        repeat, args = int(args[1]), args[2:]
    sms = int(args[0]) if args else 24
    out_dir = args[1] if len(args) > 1 else ""
    tune = tuple(args[2:])
    res = run_ranks(worker, min(torch.cuda.device_count(), 8), sms, out_dir, tune, repeat, backend="nccl",
                    timeout_s=300)
    for r, per_op in enumerate(res):
        for name, rows in per_op.items():
            end = max((s + d for s, d, _, _ in rows), default=0)
            print(f"--- rank {r} {name} ({sms} SMs): {len(rows)} device events, {end:.1f} us first start -> last end")
            for s, d, tid, n in rows:
                print(f"rank {r} {name:14s} {s:8.1f} +{d:7.1f}  stream {tid!s:>4}  {n}")
