"""Low-latency protocol on host threads (ARCHITECTURE.md "Data path, one LL dispatch").

Dispatch, per token and selected expert: one counted Write of the token message (16-byte header
with the source token index, then FP8 + scales or BF16) into the destination's slab
[local expert][source rank][slot]; then, per (destination, local expert), one fenced Atomic
carrying count + 1 that the receiving proxy holds until that many writes landed. Combine, per
received token: one counted Write of the expert output row into the source's slab
[global expert][token]; then the fenced count per (source, local expert). Receivers wait on the
count signals and copy slabs into DeepEP-shaped outputs (segments in source-rank order, rows in
token order: the reference's layout). Two buffer sets alternate, as in DeepEP.

Every op also sends every peer one control signal (an unfenced Atomic on LL_CTRL(set, phase))
carrying num_max and "I mask you" (shrink mode): the receiver checks num_max agrees, learns who
masked it (DeepEP learns it from a timeout) and knows exactly which count signals will come, so
counters stay exact across masking. Masked peers are excluded in the proxy: if they die, they
are marked dead and skipped instead of failing this rank.

Shrink mode (enable_shrink): every peer is excluded in the proxy from the start, and a peer that
misses a signal within the timeout, or dies, is masked (DeepEP: a timed-out wait masks the rank):
the op completes without it, and it is not waited for again while it stays masked (``ex.lost``).
``masked_barrier`` is the barrier of clean_low_latency_buffer and destroy in that mode.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..errors import InvalidArgument, LimitExceeded, PeerFailure, PeerProtocolError, Timeout
from ..handles import LowLatencyHandle
from ..protocol.layout import LL_MAX_LOCAL_EXPERTS, LL_SYNC_COUNTER, align16, ll_counter, ll_ctrl_counter
from ..protocol.ll_plan import LowLatencyPlan
from ..proxy import check_protocol_limits
from ..refs import logfmt
from ..refs.fp8 import pack_ue8m0, per_token_cast_to_fp8
from ..refs.low_latency import check_distinct_experts
from .ht_common import plain

__all__ = ["LowLatencyLayout", "dispatch", "combine", "combine_send_view", "masked_barrier"]

_HEADER = 16
_MAX_CTRL_NUM_MAX = (32767 - 2) // 2   # control value 1 + 2 * num_max + flag fits an int16


class LowLatencyLayout:
    """Byte offsets of the two LL buffer sets in the shared area (within DeepEP's size hint)."""

    def __init__(self, num_max: int, hidden: int, num_ranks: int, num_experts: int, shared_bytes: int) -> None:
        self.num_max, self.hidden, self.num_ranks, self.num_experts = num_max, hidden, num_ranks, num_experts
        self.num_local = num_experts // num_ranks
        if self.num_local > LL_MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_experts", "experts per rank (host executor counters)", self.num_local,
                                LL_MAX_LOCAL_EXPERTS)
        check_protocol_limits(num_ranks, num_experts=num_experts, num_max_tokens=num_max, hidden=hidden)
        if num_max > _MAX_CTRL_NUM_MAX:
            raise LimitExceeded("num_max_dispatch_tokens_per_rank", "tokens per rank (host executor control signal)",
                                num_max, _MAX_CTRL_NUM_MAX)
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


def _wait_signals(ex, srcs: np.ndarray, counters: np.ndarray, phase: str, skippable=frozenset(),
                  mask_missing: set | None = None) -> np.ndarray:
    """Wait for one signal per (src, counter); return how much each added (counters only grow).

    A PeerFailure of a source in `skippable` (an excluded peer found dead) drops that source: its
    entries come back as -1. With `mask_missing` (shrink mode) every source that fails or misses the
    deadline is dropped the same way and added to it (DeepEP: a timed-out wait masks the rank); one
    deadline covers the whole set, so several silent peers cost one timeout, not one each."""
    prev = ex.seen[srcs, counters].copy()
    todo = np.ones(srcs.size, dtype=bool)
    deadline = time.monotonic() + ex.timeout_s
    while True:
        idx = np.nonzero(todo)[0]
        try:
            ex.C.wait_counters(ex.proxy, srcs[idx].astype(np.int32), counters[idx].astype(np.int32),
                               (prev[idx] + 1).astype(np.int64), max(deadline - time.monotonic(), 1e-3), phase)
            break
        except (PeerFailure, Timeout) as e:
            if mask_missing is not None and e.peer is not None and e.peer >= 0:
                mask_missing.add(int(e.peer))
            elif not (isinstance(e, PeerFailure) and e.peer in skippable):
                raise
            todo &= srcs != e.peer
    now = ex.counters.numpy()[srcs, counters]
    ex.seen[srcs[todo], counters[todo]] = now[todo]
    return np.where(todo, now - prev, -1)


def _sync_exclusions(ex, masked: set) -> None:
    """Peers whose death must not fail this rank's proxy are excluded there (marked dead instead):
    masked peers, and in shrink mode every peer (any of them may fail and be masked)."""
    shrink = ex.ctx.enable_shrink
    for j in range(ex.num_ranks):
        want = j != ex.rank and (shrink or j in masked)
        if ex.excluded[j] != want:
            ex.proxy.set_excluded(j, want)
            ex.excluded[j] = want


def masked_barrier(ex, masked: set, phase: str) -> None:
    """Shrink mode's barrier: every unmasked peer, one unfenced Atomic on LL_SYNC each way; a peer
    that misses it within the timeout (or died) is masked (DeepEP's clean_low_latency_buffer with
    enable_shrink). Masked peers are not waited for."""
    R, me = ex.num_ranks, ex.rank
    _sync_exclusions(ex, masked)
    live = np.array([j for j in range(R) if j != me and j not in masked], dtype=np.int64)
    if live.size == 0:
        return
    none = np.zeros(0, dtype=np.int64)
    _push(ex, (none, none, none, none), [(live.astype(np.int32), np.full(live.size, LL_SYNC_COUNTER, dtype=np.int32),
                                         np.ones(live.size, dtype=np.int32), np.zeros(live.size, dtype=np.uint8))], 0)
    missing: set = set()
    _wait_signals(ex, live, np.full(live.size, LL_SYNC_COUNTER), phase, mask_missing=missing)
    masked.update(missing)


def _control_atomics(ex, set_idx: int, phase: int, num_max: int, send_masked: set, shrink: bool):
    """One control signal to every rank: value 1 + 2 * num_max + (I mask you)."""
    R = ex.num_ranks
    flags = np.array([1 if (shrink and j in send_masked) else 0 for j in range(R)], dtype=np.int32)
    return (np.arange(R, dtype=np.int32), np.full(R, ll_ctrl_counter(set_idx, phase), dtype=np.int32),
            1 + 2 * num_max + flags, np.zeros(R, dtype=np.uint8))


def _push(ex, writes, atomics, length: int) -> None:
    dst, src_off, dst_off, counter = writes
    a_dst, a_counter, a_value, a_fenced = (np.concatenate(parts) for parts in zip(*atomics))
    ex.C.push_counted(ex.proxy, dst.astype(np.int32), src_off.astype(np.int64), dst_off.astype(np.int64),
                      counter.astype(np.int32), length, a_dst.astype(np.int32), a_counter.astype(np.int32),
                      a_value.astype(np.int32), a_fenced.astype(np.uint8), ex.threads, ex.timeout_s)


def _fence_atomics(set_idx: int, phase: int, live: np.ndarray, E_loc: int, writes: np.ndarray):
    """Per (live destination, local expert): a fenced atomic over its writes (value writes + 1)."""
    f_dst = np.repeat(live, E_loc)
    f_loc = np.tile(np.arange(E_loc), live.size)
    return (f_dst.astype(np.int32), (ll_counter(set_idx, phase, 0) + f_loc).astype(np.int32),
            (writes[f_dst, f_loc] + 1).astype(np.int32), np.ones(f_dst.size, dtype=np.uint8))


def _receive_counts(ex, set_idx: int, phase: int, num_max: int, send_masked: set, E_loc: int, what: str):
    """Control signals, then count signals: returns (n [R, E_loc] writes per (source, local
    expert) to use, recv_masked, masked_by). Sources in recv_masked contribute n = 0."""
    R, me = ex.num_ranks, ex.rank
    # shrink mode: a source that misses a signal is masked (mask_missing), not waited for again
    missing: set | None = set() if ex.ctx.enable_shrink else None
    # Masked peers that are alive still send their signals (waited for: the counters stay exact);
    # peers masked because they missed one (ex.lost) are not waited for while they stay masked.
    srcs = np.array([j for j in range(R) if not ex.proxy.peer_dead(j) and not (j in ex.lost and j in send_masked)],
                    dtype=np.int64)
    ctrl = _wait_signals(ex, srcs, np.full(srcs.size, ll_ctrl_counter(set_idx, phase)), f"{what} control",
                         skippable=frozenset(send_masked), mask_missing=missing)
    dead = {j for j in range(R) if j not in set(srcs.tolist())} | set(srcs[ctrl < 0].tolist())
    masked_by, sends_me = set(), []
    for j, v in zip(srcs.tolist(), ctrl.tolist()):
        if v < 0:
            continue
        their_max, flag = (v - 1) >> 1, (v - 1) & 1
        if their_max != num_max:
            raise InvalidArgument("num_max_dispatch_tokens_per_rank",
                                  f"the same value on every rank (rank {me} has {num_max})", f"{their_max} on rank {j}")
        if flag:
            masked_by.add(j)
        else:
            sends_me.append(j)
    # Count signals come from every rank that did not mask this one (masked or not here: the
    # counters must stay exact); only those outside recv_masked are used.
    senders = np.repeat(np.array(sends_me, dtype=np.int64), E_loc)
    locs = np.tile(np.arange(E_loc), len(sends_me))
    got = _wait_signals(ex, senders, ll_counter(set_idx, phase, 0) + locs, f"{what} recv", frozenset(send_masked),
                        mask_missing=missing)
    n = torch.zeros(R, E_loc, dtype=torch.int64)
    ok = got >= 0
    n[torch.from_numpy(senders[ok]), torch.from_numpy(locs[ok])] = torch.from_numpy(got[ok] - 1)
    dead |= set(senders[~ok].tolist()) | (missing or set())
    dead |= {j for j in ex.lost if j in send_masked}
    ex.lost.update(missing or ())
    recv_masked = set(send_masked) | masked_by | dead
    for j in recv_masked:
        n[j] = 0
    return n, recv_masked, masked_by | dead


def dispatch(ex, set_idx, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0, masked,
             cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats):
    R, me = ex.num_ranks, ex.rank
    T, H = x.shape
    lay = LowLatencyLayout(num_max, H, R, num_experts, ex.shared_bytes)
    E_loc = lay.num_local
    msg = lay.dispatch_msg
    shrink = ex.ctx.enable_shrink
    check_distinct_experts("topk_idx", topk_idx)
    send_masked = set(masked)
    _sync_exclusions(ex, send_masked)

    # 1. Token messages in the send slab: header (token index) + payload.
    if use_fp8:
        q, scale_inv = per_token_cast_to_fp8(x, round_scale=round_scale)
        payload = torch.cat([plain(q).view(torch.uint8), plain(scale_inv).view(torch.uint8)], dim=1)
    else:
        payload = plain(x).view(torch.uint8)
    used = _HEADER + payload.shape[1]
    send = _view(ex, lay.send(set_idx), T * msg).view(T, msg)
    send[:, :_HEADER] = 0
    send[:, :4] = torch.arange(T, dtype=torch.int32).view(-1, 1).view(torch.uint8)
    send[:, _HEADER:used] = payload

    # 2. Routing: one write per valid (token, expert) to an unmasked rank, slot = rank of the
    #    token among this source's tokens for that expert (token order).
    valid = topk_idx >= 0
    owner = torch.where(valid, topk_idx // E_loc, torch.zeros_like(topk_idx))
    for r in send_masked:
        valid &= owner != r
    tok = torch.arange(T).view(-1, 1).expand_as(topk_idx)[valid]
    exp = topk_idx[valid]
    order = torch.argsort(exp * max(T, 1) + tok, stable=True)
    tok, exp = tok[order], exp[order]
    per_expert = torch.bincount(exp, minlength=num_experts)
    slot = torch.arange(exp.numel()) - (torch.cumsum(per_expert, 0) - per_expert)[exp]
    e_loc = exp % E_loc
    if slot.numel() and int(slot.max()) >= num_max:  # never past a slab (distinct experts keep slot < T)
        raise LimitExceeded("topk_idx", "selections of one expert by this rank (num_max_dispatch_tokens_per_rank)",
                            int(slot.max()) + 1, num_max)
    recv0 = lay.recv(set_idx)
    writes = ((exp // E_loc).numpy(), (lay.send(set_idx) + tok * msg).numpy(),
              (recv0 + ((e_loc * R + me) * num_max + slot) * msg).numpy(), (ll_counter(set_idx, 0, 0) + e_loc).numpy())
    live = np.array([r for r in range(R) if r not in send_masked], dtype=np.int64)
    _push(ex, writes, [_control_atomics(ex, set_idx, 0, num_max, send_masked, shrink),
                       _fence_atomics(set_idx, 0, live, E_loc, per_expert.view(R, E_loc).numpy())], used)
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
    state = {}

    def finish(follows_send: bool = False) -> None:
        n, recv_masked, learned = _receive_counts(ex, set_idx, 0, num_max, send_masked, E_loc,
                                                  "low_latency_dispatch")
        masked.update(learned)
        state["recv_masked"] = recv_masked
        waited = time.perf_counter_ns() - t_sent
        if bool((n > num_max).any()):
            raise PeerProtocolError(f"rank {me}: a peer announced more than num_max_dispatch_tokens_per_rank="
                                    f"{num_max} tokens for one expert")
        begin = (torch.cumsum(n, 0) - n)  # [R, E_loc]: segment start per (source, expert)
        slabs = _view(ex, recv0, E_loc * R * num_max * msg).view(E_loc, R, num_max, msg)
        # Every received row at once: (expert, source, slot) -> output row begin + slot.
        flat = n.t().reshape(-1)                                    # (expert, source) major
        total = int(flat.sum())
        if total:
            ej = torch.repeat_interleave(torch.arange(E_loc * R), flat)
            i = torch.arange(total) - torch.repeat_interleave(torch.cumsum(flat, 0) - flat, flat)
            e, j = ej // R, ej % R
            pos = begin[j, e] + i
            rows = slabs[e, j, i]
            src_info[e, pos] = rows[:, :4].contiguous().view(torch.int32).view(-1)
            body = rows[:, _HEADER:used]
            if use_fp8:
                recv_x[e, pos] = body[:, :H].contiguous().view(torch.float8_e4m3fn)
                scales = body[:, H:].contiguous().view(torch.float32)
                recv_scales[e, pos] = pack_ue8m0(scales) if use_ue8m0 else scales
            else:
                recv_x[e, pos] = body.contiguous().view(torch.bfloat16)
        layout_range.copy_(torch.where(n > 0, (begin << 32) | n, torch.zeros_like(n)).t())
        recv_count.copy_(n.sum(0).to(torch.int32))
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats.add_(recv_count)
        if dispatch_wait_recv_cost_stats is not None:
            cost = torch.full((R,), waited, dtype=torch.int64)
            for j in recv_masked:
                cost[j] = 0
            dispatch_wait_recv_cost_stats.add_(cost)

    plan = LowLatencyPlan(num_tokens=T, num_max=num_max, hidden=H, num_experts=num_experts, recv_count=recv_count,
                          masked_at_dispatch=tuple(sorted(send_masked)))
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


def combine(ex, set_idx, y, topk_idx, topk_weights, handle, masked, out, combine_wait_recv_cost_stats, zero_copy,
            use_logfmt=False):
    """LL combine; with ``use_logfmt`` the receiver sums each row as refs.logfmt.round_trip(row).

    NOTES: the rows still cross the host transport as BF16 and are put through LogFMT's round trip
    where they are summed: the same sum as the kernels' (each row encoded once, decoded once). The
    CPU path carries the semantics into CI; a wire format of its own would be a second copy of the
    kernels' (device/logfmt.cuh) that no kernel runs."""
    R, me = ex.num_ranks, ex.rank
    src_info, layout_range, num_max, H, E = handle
    lay = LowLatencyLayout(num_max, H, R, E, ex.shared_bytes)
    E_loc, msg = lay.num_local, lay.combine_msg
    T = topk_idx.shape[0]
    check_distinct_experts("topk_idx", topk_idx)
    send_masked = set(masked)
    _sync_exclusions(ex, send_masked)

    send = combine_send_view(ex, set_idx, handle)
    if not zero_copy:
        send.copy_(y)
    # Expert side: every received token's row goes back to its source, slot [global expert][token].
    begin, count = layout_range >> 32, layout_range & 0xFFFFFFFF
    live_count = count.clone()
    live_count[:, sorted(send_masked)] = 0
    flat = live_count.reshape(-1)                                   # (expert, source) major
    total = int(flat.sum())
    ej = torch.repeat_interleave(torch.arange(E_loc * R), flat)
    e_t, j_t = ej // R, ej % R
    p_t = begin.reshape(-1)[ej] + torch.arange(total) - torch.repeat_interleave(torch.cumsum(flat, 0) - flat, flat)
    token = src_info[e_t, p_t].long()
    writes = (j_t.numpy(), (lay.send(set_idx) + (e_t * R * num_max + p_t) * msg).numpy(),
              (lay.recv(set_idx) + ((me * E_loc + e_t) * num_max + token) * msg).numpy(),
              (ll_counter(set_idx, 1, 0) + e_t).numpy())
    live = np.array([j for j in range(R) if j not in send_masked], dtype=np.int64)
    _push(ex, writes, [_control_atomics(ex, set_idx, 1, num_max, send_masked, ex.ctx.enable_shrink),
                       _fence_atomics(set_idx, 1, live, E_loc, live_count.t().numpy())], 2 * H)
    t_sent = time.perf_counter_ns()
    result = out if out is not None else torch.empty(T, H, dtype=torch.bfloat16)

    def finish(follows_send: bool = False) -> None:
        got, recv_masked, learned = _receive_counts(ex, set_idx, 1, num_max, send_masked, E_loc,
                                                    "low_latency_combine")
        masked.update(learned)
        waited = time.perf_counter_ns() - t_sent
        # Every (token, expert) this rank dispatched to a rank still in the game must come back.
        use_all = topk_idx >= 0
        owner = torch.where(use_all, topk_idx // E_loc, torch.zeros_like(topk_idx))
        for r in recv_masked:
            use_all &= owner != r
        expected = torch.bincount(topk_idx[use_all], minlength=E).view(R, E_loc)
        if not torch.equal(expected, got):
            bad = torch.nonzero(expected != got)[0].tolist()
            raise PeerProtocolError(
                f"rank {me}: low_latency_combine got {int(got[bad[0], bad[1]])} rows from rank {bad[0]} for its local "
                f"expert {bad[1]}, expected {int(expected[bad[0], bad[1]])}; the expert outputs or topk_idx differ "
                f"from the dispatch that made `handle`")
        slabs = _view(ex, lay.recv(set_idx), E * num_max * msg).view(torch.bfloat16).view(E, num_max, H)
        acc = torch.zeros(T, H, dtype=torch.float32)
        tokens = torch.arange(T)
        for k in range(topk_idx.shape[1]):
            ids = topk_idx[:, k]
            rows = slabs[ids.clamp_min(0), tokens]
            if use_logfmt:
                rows = logfmt.round_trip(rows)
            contrib = rows.float() * topk_weights[:, k].float().view(-1, 1)
            acc = torch.where(use_all[:, k].view(-1, 1), acc + contrib, acc)
        result.copy_(acc.to(result.dtype))
        if combine_wait_recv_cost_stats is not None:
            cost = torch.full((R,), waited, dtype=torch.int64)
            for j in recv_masked:
                cost[j] = 0
            combine_wait_recv_cost_stats.add_(cost)

    return result, finish
