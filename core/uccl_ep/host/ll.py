"""Low-latency protocol on host threads (ARCHITECTURE.md "Data path, one LL dispatch").

Dispatch, per token and selected expert: one counted Write of the token message (16-byte header
with the source token index, then FP8 + scales or BF16) into the destination's slab
[local expert][source rank][slot]; then, per (destination, local expert), one fenced Atomic
carrying count + 1 that the receiving proxy holds until that many writes landed. Combine, per
received token: one counted Write of the expert output row into the source's slab
[global expert][token]; then the fenced count per (source, local expert). Receivers wait on the
count signals and copy slabs into DeepEP-shaped outputs (segments in source-rank order, rows in
token order: the reference's layout). Two buffer sets alternate, as in DeepEP.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..errors import LimitExceeded, PeerProtocolError
from ..handles import LowLatencyHandle
from ..proxy import check_protocol_limits
from ..refs.fp8 import pack_ue8m0, per_token_cast_to_fp8
from ..refs.low_latency import LowLatencyPlan
from .layout import LL_MAX_LOCAL_EXPERTS, align16, ll_counter

__all__ = ["LowLatencyLayout", "dispatch", "combine", "combine_send_view"]

_HEADER = 16


class LowLatencyLayout:
    """Byte offsets of the two LL buffer sets in the shared area (within DeepEP's size hint)."""

    def __init__(self, num_max: int, hidden: int, num_ranks: int, num_experts: int, shared_bytes: int) -> None:
        self.num_max, self.hidden, self.num_ranks, self.num_experts = num_max, hidden, num_ranks, num_experts
        self.num_local = num_experts // num_ranks
        if self.num_local > LL_MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_experts", "experts per rank (host executor counters)", self.num_local,
                                LL_MAX_LOCAL_EXPERTS)
        check_protocol_limits(num_ranks, num_experts=num_experts, num_max_tokens=num_max, hidden=hidden)
        self.dispatch_msg = _HEADER + 2 * hidden            # DeepEP's max(BF16, FP8 + scales) + header
        self.combine_msg = align16(2 * hidden)              # one BF16 row
        self.send_bytes = align16(max(num_max * self.dispatch_msg, num_experts * num_max * self.combine_msg))
        self.recv_bytes = align16(num_experts * num_max * max(self.dispatch_msg, self.combine_msg))
        self.set_bytes = self.send_bytes + self.recv_bytes
        self.total_bytes = 2 * self.set_bytes
        if self.total_bytes > shared_bytes:
            raise LimitExceeded("num_rdma_bytes", "bytes of the host executor's low-latency buffers",
                                self.total_bytes, shared_bytes,
                                hint="build the Buffer with num_rdma_bytes >= Buffer.get_low_latency_rdma_size_hint(...)")

    def send(self, s: int) -> int:
        return s * self.set_bytes

    def recv(self, s: int) -> int:
        return s * self.set_bytes + self.send_bytes


def _view(ex, offset: int, nbytes: int) -> torch.Tensor:
    return ex.region[offset:offset + nbytes]


def _wait_signals(ex, srcs: np.ndarray, counters: np.ndarray, phase: str) -> np.ndarray:
    """Wait for one fenced signal per (src, counter); return the write counts they carried."""
    prev = ex.seen[srcs, counters]
    ex.C.wait_counters(ex.proxy, srcs.astype(np.int32), counters.astype(np.int32), (prev + 1).astype(np.int64),
                       ex.timeout_s, phase)
    now = ex.counters.numpy()[srcs, counters]
    ex.seen[srcs, counters] = now
    return now - prev - 1


def dispatch(ex, set_idx, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0, masked,
             cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats):
    R, me = ex.num_ranks, ex.rank
    T, H = x.shape
    lay = LowLatencyLayout(num_max, H, R, num_experts, ex.shared_bytes)
    E_loc = lay.num_local
    msg = lay.dispatch_msg

    # 1. Token messages in the send slab: header (token index) + payload.
    if use_fp8:
        q, scale_inv = per_token_cast_to_fp8(x, round_scale=round_scale)
        payload = torch.cat([q.view(torch.uint8), scale_inv.contiguous().view(torch.uint8)], dim=1)
    else:
        payload = x.contiguous().view(torch.uint8)
    used = _HEADER + payload.shape[1]
    send = _view(ex, lay.send(set_idx), T * msg).view(T, msg)
    send[:, :_HEADER] = 0
    send[:, :4] = torch.arange(T, dtype=torch.int32).view(-1, 1).view(torch.uint8)
    send[:, _HEADER:used] = payload

    # 2. Routing: one write per valid (token, expert) to a live rank, slot = rank of the token
    #    among this source's tokens for that expert (token order).
    valid = topk_idx >= 0
    if masked:
        owner = torch.where(valid, topk_idx // E_loc, torch.zeros_like(topk_idx))
        for r in masked:
            valid &= owner != r
    tok = torch.arange(T).view(-1, 1).expand_as(topk_idx)[valid]
    exp = topk_idx[valid]
    order = torch.argsort(exp * max(T, 1) + tok, stable=True)
    tok, exp = tok[order], exp[order]
    per_expert = torch.bincount(exp, minlength=num_experts)
    seg_start = torch.cumsum(per_expert, 0) - per_expert
    slot = torch.arange(exp.numel()) - seg_start[exp]
    dst, e_loc = exp // E_loc, exp % E_loc
    recv0 = lay.recv(set_idx)
    dst_off = recv0 + ((e_loc * R + me) * num_max + slot) * msg
    counter = ll_counter(set_idx, 0, 0) + e_loc
    live = np.array([r for r in range(R) if r not in masked], dtype=np.int32)
    f_dst = np.repeat(live, E_loc)
    f_loc = np.tile(np.arange(E_loc), live.size)
    f_writes = per_expert.view(R, E_loc).numpy()[f_dst, f_loc] if live.size else np.zeros(0, np.int64)
    ex.C.push_counted(ex.proxy, dst.to(torch.int32).numpy(), (lay.send(set_idx) + tok * msg).numpy(),
                      dst_off.numpy(), counter.to(torch.int32).numpy(), used, f_dst,
                      (ll_counter(set_idx, 0, 0) + f_loc).astype(np.int32), f_writes.astype(np.int32), ex.threads,
                      ex.timeout_s)
    t_sent = time.perf_counter_ns()

    # 3. Outputs, filled by the receive phase (now, or by the recv hook).
    slab = R * num_max
    if use_fp8:
        recv_x = torch.zeros(E_loc, slab, H, dtype=torch.float8_e4m3fn)
        if use_ue8m0:
            scales_alloc = torch.zeros(E_loc, H // 512, slab, dtype=torch.int32)
        else:
            scales_alloc = torch.zeros(E_loc, H // 128, slab, dtype=torch.float32)
        recv_scales = scales_alloc.transpose(1, 2)
    else:
        recv_x = torch.zeros(E_loc, slab, H, dtype=torch.bfloat16)
        recv_scales = None
    recv_count = torch.zeros(E_loc, dtype=torch.int32)
    src_info = torch.full((E_loc, slab), -1, dtype=torch.int32)
    layout_range = torch.zeros(E_loc, R, dtype=torch.int64)

    def finish() -> None:
        srcs = np.repeat(live, E_loc)
        locs = np.tile(np.arange(E_loc), live.size)
        t0 = time.perf_counter_ns()
        counts = _wait_signals(ex, srcs, ll_counter(set_idx, 0, 0) + locs, "low_latency_dispatch recv")
        waited = time.perf_counter_ns() - min(t0, t_sent) if live.size else 0
        n = torch.zeros(R, E_loc, dtype=torch.int64)
        n[torch.from_numpy(srcs).long(), torch.from_numpy(locs).long()] = torch.from_numpy(counts)
        if bool((n > num_max).any()):
            raise PeerProtocolError(f"rank {me}: a peer announced more than num_max_dispatch_tokens_per_rank="
                                    f"{num_max} tokens for one expert (mismatched num_max across ranks?)")
        begin = (torch.cumsum(n, 0) - n)  # [R, E_loc]: segment start per (source, expert)
        slabs = _view(ex, recv0, E_loc * R * num_max * msg).view(E_loc, R, num_max, msg)
        for e in range(E_loc):
            cnt, beg = n[:, e], begin[:, e]
            total = int(cnt.sum())
            if total == 0:
                continue
            j = torch.repeat_interleave(torch.arange(R), cnt)
            i = torch.arange(total) - torch.repeat_interleave(beg, cnt)
            rows = slabs[e, j, i]  # [total, msg] in (source, slot) order
            src_info[e, :total] = rows[:, :4].contiguous().view(torch.int32).view(-1)
            body = rows[:, _HEADER:used].contiguous()
            if use_fp8:
                recv_x[e, :total] = body[:, :H].view(torch.float8_e4m3fn)
                scales = body[:, H:].contiguous().view(torch.float32)
                recv_scales[e, :total] = pack_ue8m0(scales) if use_ue8m0 else scales
            else:
                recv_x[e, :total] = body.view(torch.bfloat16)
            layout_range[e] = torch.where(cnt > 0, (beg << 32) | cnt, torch.zeros_like(cnt))
        recv_count.copy_(n.sum(0).to(torch.int32))
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats.add_(recv_count)
        if dispatch_wait_recv_cost_stats is not None:
            cost = torch.zeros(R, dtype=torch.int64)
            cost[torch.from_numpy(live).long()] = waited
            dispatch_wait_recv_cost_stats.add_(cost)

    plan = LowLatencyPlan(num_tokens=T, num_max=num_max, hidden=H, num_experts=num_experts, recv_count=recv_count,
                          masked_at_dispatch=tuple(sorted(masked)))
    handle = LowLatencyHandle((src_info, layout_range, num_max, H, num_experts), ex.owner, plan)
    out_x = (recv_x, recv_scales) if use_fp8 else recv_x
    return out_x, recv_count, handle, finish


def combine_send_view(ex, set_idx: int, handle) -> torch.Tensor:
    """BF16 [E_loc, R*num_max, H] view of set `set_idx`'s send slab (the zero-copy buffer)."""
    _, _, num_max, H, E = handle
    lay = LowLatencyLayout(num_max, H, ex.num_ranks, E, ex.shared_bytes)
    rows = lay.num_local * ex.num_ranks * num_max
    return _view(ex, lay.send(set_idx), rows * lay.combine_msg).view(torch.bfloat16).view(
        lay.num_local, ex.num_ranks * num_max, H)


def combine(ex, set_idx, y, topk_idx, topk_weights, handle, masked, out, combine_wait_recv_cost_stats, zero_copy):
    R, me = ex.num_ranks, ex.rank
    src_info, layout_range, num_max, H, E = handle
    lay = LowLatencyLayout(num_max, H, R, E, ex.shared_bytes)
    E_loc, msg = lay.num_local, lay.combine_msg
    T = topk_idx.shape[0]

    send = combine_send_view(ex, set_idx, handle)
    if not zero_copy:
        send.copy_(y)
    # Expert side: every received token's row goes back to its source, slot [global expert][token].
    begin, count = layout_range >> 32, layout_range & 0xFFFFFFFF
    live = [j for j in range(R) if j not in masked]
    e_idx, p_idx, j_idx = [], [], []
    for e in range(E_loc):
        for j in live:
            c, b = int(count[e, j]), int(begin[e, j])
            if c:
                e_idx.append(torch.full((c,), e, dtype=torch.int64))
                p_idx.append(torch.arange(b, b + c))
                j_idx.append(torch.full((c,), j, dtype=torch.int64))
    if e_idx:
        e_t, p_t, j_t = torch.cat(e_idx), torch.cat(p_idx), torch.cat(j_idx)
    else:
        e_t = p_t = j_t = torch.zeros(0, dtype=torch.int64)
    token = src_info[e_t, p_t].long()
    src_off = lay.send(set_idx) + (e_t * R * num_max + p_t) * msg
    dst_off = lay.recv(set_idx) + ((me * E_loc + e_t) * num_max + token) * msg
    live_np = np.array(live, dtype=np.int32)
    f_dst = np.repeat(live_np, E_loc)
    f_loc = np.tile(np.arange(E_loc), live_np.size)
    f_writes = count.t().numpy()[f_dst, f_loc] if live_np.size else np.zeros(0, np.int64)
    ex.C.push_counted(ex.proxy, j_t.to(torch.int32).numpy(), src_off.numpy(), dst_off.numpy(),
                      (ll_counter(set_idx, 1, 0) + e_t).to(torch.int32).numpy(), 2 * H, f_dst,
                      (ll_counter(set_idx, 1, 0) + f_loc).astype(np.int32), f_writes.astype(np.int32), ex.threads,
                      ex.timeout_s)
    t_sent = time.perf_counter_ns()
    result = out if out is not None else torch.empty(T, H, dtype=torch.bfloat16)

    def finish() -> None:
        srcs = np.repeat(live_np, E_loc)
        locs = np.tile(np.arange(E_loc), live_np.size)
        t0 = time.perf_counter_ns()
        got = _wait_signals(ex, srcs, ll_counter(set_idx, 1, 0) + locs, "low_latency_combine recv")
        waited = time.perf_counter_ns() - min(t0, t_sent) if live_np.size else 0
        # Every (token, expert) this rank dispatched to a live rank must have come back.
        valid = topk_idx >= 0
        owner = torch.where(valid, topk_idx // E_loc, torch.zeros_like(topk_idx))
        use_all = valid.clone()
        for r in masked:
            use_all &= owner != r
        expected = torch.bincount(topk_idx[use_all], minlength=E).view(R, E_loc).numpy()[srcs, locs]
        if not np.array_equal(expected, got):
            bad = int(np.nonzero(expected != got)[0][0])
            raise PeerProtocolError(
                f"rank {me}: low_latency_combine got {int(got[bad])} rows from rank {int(srcs[bad])} for its local "
                f"expert {int(locs[bad])}, expected {int(expected[bad])}; the expert outputs or topk_idx differ "
                f"from the dispatch that made `handle`")
        slabs = _view(ex, lay.recv(set_idx), E * num_max * msg).view(torch.bfloat16).view(E, num_max, H)
        acc = torch.zeros(T, H, dtype=torch.float32)
        tokens = torch.arange(T)
        for k in range(topk_idx.shape[1]):
            ids = topk_idx[:, k]
            use = use_all[:, k]
            rows = slabs[ids.clamp_min(0), tokens]
            contrib = rows.float() * topk_weights[:, k].float().view(-1, 1)
            acc = torch.where(use.view(-1, 1), acc + contrib, acc)
        result.copy_(acc.to(result.dtype))
        if combine_wait_recv_cost_stats is not None:
            cost = torch.zeros(R, dtype=torch.int64)
            cost[torch.from_numpy(live_np).long()] = waited
            combine_wait_recv_cost_stats.add_(cost)

    return result, finish
