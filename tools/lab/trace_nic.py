"""Where the NIC model's link idles inside an HT op through the proxy: the model's event trace
(nic_model.cc `trace=n`: every post with its link exit and due time, every delivery) of N
back-to-back cached BF16 dispatches, cached FP8 dispatches and combines, 2 ranks as 2 nodes.

UCCL_EP_RANKS_PER_NODE=1 python tools/lab/trace_nic.py [--repeat N] [--backend cuda|host]
    [--model SPEC] [--tokens T] [--kernels] [num_sms] [out_dir]

--kernels: the ops run under torch's profiler too, and each raw event file gets the device's kernel
spans on the model's clock ("kernels": [name, start ns, end ns], mapped through one annotation per op).

For each op kind and rank it prints the link's idle stretches of >= 2 us and, at the start of
each, what let every ring (channel) of that rank's streams post again, from the trace alone:
`credit` (its next post came within 8 us of a credit -- the receiver's HEAD atomic -- for it: the
window was full), `open` (no credit came first: the window had room and the producer -- the GPU's
staging or the proxy's polling -- was late), `done` (it posts no more in the trace), with the us
from the gap's start to that post; the ring whose post ended the stretch labels it. With out_dir it writes the raw events
(nic_<op>_r<rank>.json: rows [thread, kind, t_ns, a, b, bytes, peer, imm], nic_model.cc
TraceRecorder) for a closer look. Rank 0 also prints, per direction, where a data Write's time goes
after the model releases it (the stand-in's copy and inbox hand-off), and each op boundary: the
last Write's stages, the last data and credit this rank received, and its next post. Not a test.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402
from uccl_ep.protocol.layout import RING_HEAD_BASE as HEAD_BASE  # noqa: E402  (HEAD(r) = base + ring)

POST, REFUSED, RELEASE, DELIVER, DONE = 0, 1, 2, 3, 4
GAP_NS = 2000
CREDIT_NS = 8000  # a post this soon after a credit of its ring counts as released by it


@functools.lru_cache(maxsize=None)
def _imm_fields(imm: int) -> tuple[int, int, int]:
    """(kind, counter, count): count = an ordered Write's increment or an atomic's value
    (immediate.h's decoder through the bindings)."""
    from uccl_ep.proxy import native
    d = native().imm_decode(imm)
    return d["kind"], d["counter"], d["increment"] if d["kind"] == 1 else d["value"] if d["kind"] == 2 else 0


def analyse(rows: list, bw: float) -> dict:
    """Idle stretches of the link (from the posts' exit times) and each ring's state at their start."""
    rows = sorted(rows, key=lambda r: r[2])
    posts = [r for r in rows if r[1] == POST and r[5] > 0]
    if not posts:
        return {"posts": 0}
    # link busy intervals [exit - bytes / bw, exit): the link is serial, so they do not overlap
    busy = sorted((r[3] - int(r[5] * 1e9 / bw), r[3]) for r in posts)
    gaps = [(a_end, b_start) for (_, a_end), (b_start, _) in zip(busy, busy[1:]) if b_start - a_end >= GAP_NS]
    # per ring: cumulative messages posted (ordered Writes) and credited (HEAD atomics delivered)
    events = []  # (t, ring, d_posted, d_credited)
    for r in rows:
        kind, counter, count = _imm_fields(r[7])
        if r[1] == POST and r[5] > 0 and kind == 1:
            events.append((r[2], counter, count, 0))
        elif r[1] == DELIVER and kind == 2 and counter >= HEAD_BASE:
            events.append((r[2], counter - HEAD_BASE, 0, count))
    events.sort()
    posts_of, credits_of = defaultdict(list), defaultdict(list)
    for t, ring, dp, dc in events:
        (posts_of if dp else credits_of)[ring].append(t)
    summary, detail = defaultdict(float), []
    for g0, g1 in gaps:
        # what let each ring post again after the link went idle: a credit that arrived shortly
        # before its next post ("credit"), or nothing ("open": its window had room, the producer
        # was late); "done": it posts no more in the trace
        state = {}
        for ring, times in posts_of.items():
            nxt = next((t for t in times if t > g0), None)
            if nxt is None:
                state[ring] = "done"
                continue
            credit = max((t for t in credits_of.get(ring, []) if g0 - CREDIT_NS < t <= nxt), default=None)
            state[ring] = "credit" if credit is not None and nxt - credit <= CREDIT_NS else "open"
            state[ring] += f"+{(nxt - g0) / 1e3:.0f}"
        ender = min((r for r in posts_of if not state[r].startswith("done")),
                    key=lambda r: next(t for t in posts_of[r] if t > g0), default=None)
        label = state[ender].split("+")[0] if ender is not None else "done"
        summary[label] += (g1 - g0) / 1e3
        detail.append(((g0 - busy[0][0]) / 1e3, (g1 - g0) / 1e3, f"{label}({ender})", state))
    span = (busy[-1][1] - busy[0][0]) / 1e3
    waits = [(r[4] - r[2]) / 1e3 for r in posts]
    return {"posts": len(posts), "span_us": span, "busy_us": sum(b - a for a, b in busy) / 1e3,
            "gaps": len(gaps), "gap_us": sum(g1 - g0 for g0, g1 in gaps) / 1e3, "ended_by_us": dict(summary),
            "post_to_due_us": sum(waits) / len(waits), "detail": detail}


def _quantiles(values: list) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return "/".join(f"{v[int(q * (len(v) - 1))]:.1f}" for q in (0.1, 0.5, 0.9))


def hops(rows_by_rank: list) -> dict:
    """Per direction, p10/p50/p90 (us) of a data Write's stages after it leaves the model: release
    (due -> handed to the inner transport), copy (handed -> the inner transport's local completion:
    the stand-in's copy and its record in the receiver's inbox), inbox (that completion -> the
    receiving proxy took the immediate); and the gaps between two data posts of one rank above 40 us
    (the op boundaries, back to back)."""
    out = {}
    for s, rows in enumerate(rows_by_rank):
        done_at = defaultdict(list)
        for r in rows:
            if r[1] == DONE:
                done_at[(r[0], r[4])].append(r[2])
        deliver_at = defaultdict(list)
        for r in rows_by_rank[1 - s]:
            if r[1] == DELIVER and _imm_fields(r[7])[0] == 1:
                deliver_at[r[7]].append(r[2])
        late, copy, inbox = [], [], []
        for r in rows:
            if r[1] != RELEASE or r[5] == 0:
                continue
            late.append((r[2] - r[3]) / 1e3)
            done = next((t for t in done_at[(r[0], r[4])] if t >= r[2]), None)
            if done is None:
                continue
            copy.append((done - r[2]) / 1e3)
            got = next((t for t in deliver_at[r[7]] if t >= done - 1000), None)
            if got is not None:
                inbox.append((got - done) / 1e3)
        t = sorted(r[2] for r in rows if r[1] == POST and r[5] > 0)
        out[f"{s}->{1 - s}"] = {"release_us": _quantiles(late), "copy_us": _quantiles(copy),
                                "inbox_us": _quantiles(inbox),
                                "op_gaps_us": [round((b - a) / 1e3) for a, b in zip(t, t[1:]) if b - a > 40000]}
    return out


def boundaries(rows_by_rank: list) -> list:
    """Each op boundary of each rank (a gap of over 40 us between two of its data posts), us from
    the trace's start: its last data post of the op, that Write's due time, release and local
    completion, the last data and the last credit delivered to this rank before its next post, and
    that next post (which of them it waited for shows as the smallest step before it)."""
    t0 = min(r[2] for rows in rows_by_rank for r in rows)
    us = lambda t: round((t - t0) / 1e3, 1) if t is not None else None  # noqa: E731
    out = []
    for me, rows in enumerate(rows_by_rank):
        rows = sorted(rows, key=lambda r: r[2])  # the threads' events, merged in time
        posts = [r for r in rows if r[1] == POST and r[5] > 0]
        for last, nxt in zip(posts, posts[1:]):
            if nxt[2] - last[2] <= 40000:
                continue
            rel = next((r for r in rows if r[1] == RELEASE and r[7] == last[7] and r[2] >= last[2]), None)
            done = next((r for r in rows if rel is not None and r[1] == DONE and r[0] == rel[0] and r[4] == rel[4]
                         and r[2] >= rel[2]), None)
            into = [r for r in rows if r[1] == DELIVER and r[2] < nxt[2]]
            data_in = max((r[2] for r in into if _imm_fields(r[7])[0] == 1), default=None)
            credit_in = max((r[2] for r in into if _imm_fields(r[7])[0] == 2), default=None)
            out.append({"rank": me, "last_post": us(last[2]), "due": us(last[4]), "released": us(rel[2] if rel else None),
                        "local_done": us(done[2] if done else None), "last_data_in": us(data_in),
                        "last_credit_in": us(credit_in), "next_post": us(nxt[2])})
    return out


def _kernel_profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])


def _kernel_spans(prof, marks: list[int]) -> list[tuple]:
    """(name, start ns, end ns) of every kernel the profiler saw, on CLOCK_MONOTONIC: the profiler's
    clock is mapped through the `op#i` annotations, each opened right after `marks[i]` was read (the
    smallest offset over the ops: an annotation opens after its mark, never before)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    opened = {e["name"]: e["ts"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("op#")}
    offsets = [opened[f"op#{i}"] * 1e3 - m for i, m in enumerate(marks) if f"op#{i}" in opened]
    if not offsets:
        return []
    off = min(offsets)
    return sorted((e["name"][:40], int(e["ts"] * 1e3 - off), int((e["ts"] + e["dur"]) * 1e3 - off))
                  for e in events if e.get("cat") == "kernel" and "dur" in e)


def worker(rank, world, backend, num_sms, tokens, repeat, model, out_dir, kernels=False):
    from uccl_ep import Buffer
    from uccl_ep.proxy.nic_model import parse_nic_model
    from uccl_ep.refs.fp8 import per_token_cast_to_fp8
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device()) if backend == "cuda" else torch.device("cpu")
    gen = torch.Generator().manual_seed(rank)
    T, H, E = tokens, 7168, 256
    Buffer.set_num_sms(num_sms)
    cfg = Buffer.get_dispatch_config(world)
    buf = Buffer(group, cfg.get_nvl_buffer_size_hint(H * 2, world), cfg.get_rdma_buffer_size_hint(H * 2, world),
                 backend=backend)
    ex = buf._executor
    proxy = getattr(getattr(ex, "_ht", None), "proxy", None) or getattr(ex, "proxy", None)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    x_fp8 = per_token_cast_to_fp8(x)
    idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(8, -1).indices.to(dev)
    a, _, c, d, _ = buf.get_dispatch_layout(idx, E)
    rx, _, _, _, h, _ = buf.dispatch(x, num_tokens_per_rank=a, is_token_in_rank=d, num_tokens_per_expert=c, config=cfg)
    proxy = proxy or getattr(getattr(ex, "_ht", None), "proxy", None)
    ops = {"dispatch_bf16": lambda: buf.dispatch(x, handle=h, config=cfg),
           "dispatch_fp8": lambda: buf.dispatch(x_fp8, handle=h, config=cfg),
           "combine": lambda: buf.combine(rx, h, config=cfg)}
    sync = torch.cuda.synchronize if backend == "cuda" else (lambda: None)
    bw = parse_nic_model(model).bw
    out = {}
    for name, fn in ops.items():
        for _ in range(3):
            fn()
        sync()
        dist.barrier()
        prof = _kernel_profiler() if kernels else contextlib.nullcontext()
        marks = []
        with prof:
            t0 = time.monotonic_ns()  # CLOCK_MONOTONIC: the steady clock of the model's events
            for i in range(repeat):
                marks.append(time.monotonic_ns())
                with torch.profiler.record_function(f"op#{i}") if kernels else contextlib.nullcontext():
                    fn()
            sync()
            t1 = time.monotonic_ns()
        dist.barrier()
        rows = [r for r in proxy.transport_trace() if t0 <= r[2] <= t1]
        spans = _kernel_spans(prof, marks) if kernels else []
        everyone = [None] * world
        dist.all_gather_object(everyone, rows)
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f"nic_{name}_r{rank}.json"), "w") as f:
                json.dump({"t0": t0, "t1": t1, "rows": rows, "kernels": spans}, f)
        res = analyse(rows, bw)
        res["wall_us_per_op"] = (t1 - t0) / 1e3 / repeat
        if rank == 0:
            res["hops"] = hops(everyone)
            res["boundaries"] = boundaries(everyone)
        out[name] = res
    return out


def main() -> None:
    args = sys.argv[1:]
    opts = {"--repeat": "3", "--backend": "cuda", "--model": "efa-400g", "--tokens": "4096"}
    kernels = "--kernels" in args
    args = [a for a in args if a != "--kernels"]
    while args[:1] and args[0] in opts:
        opts[args[0]], args = args[1], args[2:]
    model = opts["--model"] + ",trace=200000"
    os.environ["UCCL_EP_NIC_MODEL"] = model  # the proxies read it at start (this lab script's own processes)
    sms = int(args[0]) if args else 24
    out_dir = args[1] if len(args) > 1 else ""
    backend = opts["--backend"]
    world = 2
    res = run_ranks(worker, world, backend, sms, int(opts["--tokens"]), int(opts["--repeat"]), model, out_dir, kernels,
                    backend="nccl" if backend == "cuda" else "gloo", timeout_s=600)
    for r, per_op in enumerate(res):
        for name, s in per_op.items():
            detail = s.pop("detail", [])
            for direction, h in s.pop("hops", {}).items():
                print(f"--- {name} {direction}: " + json.dumps(h))
            for b in s.pop("boundaries", []):
                print(f"--- {name} op boundary: " + json.dumps(b))
            print(f"=== rank {r} {name}: " + json.dumps({k: (round(v, 1) if isinstance(v, float) else v)
                                                        for k, v in s.items()}))
            for at, length, label, rings in detail:
                print(f"  gap at {at:8.1f} us  {length:6.1f} us  {label:11s} " +
                      " ".join(f"{k}:{v}" for k, v in rings.items()))


if __name__ == "__main__":
    main()
