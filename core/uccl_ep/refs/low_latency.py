"""Reference low-latency mode: per-expert dispatch into padded slabs, weighted combine.

Semantics (DeepEP V1's; docs/api.md, "Low-latency mode"):
- dispatch sends one message per (token, selected expert) to the expert's rank; the receiver's
  slab for local expert e holds, in rows [0, recv_count[e]), one contiguous segment per source
  rank; ``layout_range[e][j] = (begin << 32) | count``; ``src_info`` holds the source token index.
  The reference orders segments by source rank and rows in a segment by token index (kernels
  may order both differently: compare per (expert, source) segment, sorted by ``src_info``);
- FP8 is DeepEP's in-kernel per-128-channel cast (``refs.fp8``), scales column-major;
- combine: ``out[t] = sum_k w[t,k] * y[expert(t,k)][slot(t,k)]``, k ascending, fp32, cast to
  BF16; -1 ids and masked ranks are skipped; no bias.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..errors import InvalidArgument, PeerProtocolError
from ..handles import LowLatencyHandle
from ..protocol.ll_plan import LowLatencyPlan
from ..protocol.packing import pack_rows, unpack_rows
from .comm import GroupComm
from . import logfmt
from .fp8 import pack_ue8m0, per_token_cast_to_fp8

__all__ = ["LowLatencyPlan", "dispatch", "combine", "exchange_control", "check_distinct_experts", "shrink_masker"]


def check_distinct_experts(name: str, topk_idx: torch.Tensor) -> None:
    """Refuse a top-k row that selects one expert twice (-1 may repeat).

    NOTES: DeepEP routes a token to each selected expert once; a low-latency slab holds
    ``num_max_dispatch_tokens_per_rank`` rows per (expert, source), so a repeated selection would
    need more slots than a slab has. Refused on the sender, before anything is sent."""
    if topk_idx.dim() != 2 or topk_idx.shape[1] < 2 or topk_idx.numel() == 0:
        return
    s = topk_idx.sort(dim=1).values
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    if bool(dup.any()):
        row = int(torch.nonzero(dup.any(1)).flatten()[0])
        expert = int(s[row, 1:][dup[row]][0])
        raise InvalidArgument(name, "distinct expert ids in each row (a token selects an expert at most once; "
                              "-1 may repeat)", f"expert {expert} more than once in row {row}")


def shrink_masker(shrink: bool, masked: set[int], comm: GroupComm) -> Callable[[int, BaseException], bool] | None:
    """In shrink mode, a peer that misses an exchange (Timeout: it stalled or stopped calling;
    PeerFailure: it died) is masked -- added to the Buffer's live mask, announced to the peers --
    instead of failing the op (DeepEP: a timed-out wait masks the rank). None otherwise."""
    if not shrink:
        return None

    def mask(peer: int, error: BaseException) -> bool:
        masked.add(peer)
        comm.publish_skips(masked)
        return True
    return mask


def exchange_data(comm: GroupComm, per_dest: list[torch.Tensor], device: torch.device, phase: str,
                  send_masked: set[int], masked: set[int], shrink: bool) -> tuple[list[torch.Tensor], set[int], int]:
    """One op's rows to every peer not in ``send_masked`` and theirs back: (the blobs received, the
    peers masked for receiving, the ns spent waiting). ``masked`` grows by the peers that mask this
    rank or, in shrink mode, missed the exchange."""
    t0 = time.perf_counter_ns()
    received = comm.exchange_rows(per_dest, device, phase, skip=send_masked,
                                  on_missing=shrink_masker(shrink, masked, comm), learn_skips=shrink)
    masked.update(comm.skipped_by())
    return received, set(masked), time.perf_counter_ns() - t0


def exchange_control(comm: GroupComm, masked: set[int], num_max: int, shrink: bool, phase: str) -> set[int]:
    """Tell every unmasked peer this rank's ``num_max``, check theirs agree, and return the peers
    that mask this rank (and, in shrink mode, those that missed the exchange, masked now).

    NOTES: in DeepEP a rank that masks a peer stops sending to it, and the peer, waiting in vain,
    times out and masks it back (shrink mode). Here the masking rank publishes its mask, so the
    peer learns it without waiting for its timeout; the outcome is the same.
    """
    before = set(masked)
    comm.publish_skips(masked)
    rows = [torch.tensor([[num_max]], dtype=torch.int64) for _ in range(comm.size)]
    got = comm.exchange_rows(rows, torch.device("cpu"), f"{phase} (control)", skip=before,
                             on_missing=shrink_masker(shrink, masked, comm), learn_skips=shrink)
    for j, row in enumerate(got):
        if row.shape[0] and int(row[0, 0]) != num_max:
            raise InvalidArgument("num_max_dispatch_tokens_per_rank",
                                  f"the same value on every rank (rank {comm.rank} has {num_max})",
                                  f"{int(row[0, 0])} on rank {j}")
    return (comm.skipped_by() | set(masked)) - before


def dispatch(comm: GroupComm, owner: object, x: torch.Tensor, topk_idx: torch.Tensor, num_max: int, num_experts: int,
             use_fp8: bool, round_scale: bool, use_ue8m0: bool, masked: set[int], shrink: bool,
             cumulative_local_expert_recv_stats: torch.Tensor | None,
             dispatch_wait_recv_cost_stats: torch.Tensor | None):
    """Returns (recv_x or (recv_x_fp8, scales), recv_count, handle, finish) where ``finish()``
    writes the received data into the outputs (run at once, or by the recv hook)."""
    device = x.device
    num_ranks = comm.size
    num_tokens, hidden = x.shape
    num_local = num_experts // num_ranks
    slab_rows = num_ranks * num_max
    check_distinct_experts("topk_idx", topk_idx)
    masked_by = exchange_control(comm, masked, num_max, shrink, "low_latency_dispatch")
    masked.update(masked_by)  # the live mask of the Buffer learns who cut this rank off
    send_masked = set(masked)

    if use_fp8:
        q, scale_inv = per_token_cast_to_fp8(x, round_scale=round_scale)
        payload_cols = [q, scale_inv]
    else:
        payload_cols = [x]

    # Selections per destination, ordered by (local expert, token): token t, local expert e.
    tok = torch.arange(num_tokens, device=device).view(-1, 1).expand_as(topk_idx)
    valid = topk_idx >= 0
    per_dest = []
    for r in range(num_ranks):
        if r in send_masked:
            sel_t = torch.zeros(0, dtype=torch.int64, device=device)
            sel_e = sel_t
        else:
            m = valid & (topk_idx // num_local == r)
            sel_e = (topk_idx[m] - r * num_local).long()
            sel_t = tok[m].long()
            order = torch.argsort(sel_e * max(num_tokens, 1) + sel_t, stable=True)
            sel_e, sel_t = sel_e[order], sel_t[order]
        header = torch.stack([sel_e.to(torch.int32), sel_t.to(torch.int32)], 1)
        per_dest.append(pack_rows([header] + [c[sel_t] for c in payload_cols]))
    received, recv_masked, waited_ns = exchange_data(comm, per_dest, device, "low_latency_dispatch", send_masked,
                                                     masked, shrink)

    specs = [(torch.int32, (2,))] + [(c.dtype, tuple(c.shape[1:])) for c in payload_cols]
    decoded = [unpack_rows(blob, specs, blob.shape[0]) for blob in received]

    # Outputs (allocated now; filled by finish()).
    if use_fp8:
        recv_x = torch.zeros(num_local, slab_rows, hidden, dtype=torch.float8_e4m3fn, device=device)
        if use_ue8m0:
            scales_alloc = torch.zeros(num_local, hidden // 512, slab_rows, dtype=torch.int32, device=device)
        else:
            scales_alloc = torch.zeros(num_local, hidden // 128, slab_rows, dtype=torch.float32, device=device)
        recv_scales = scales_alloc.transpose(1, 2)  # column-major in the last two dims
    else:
        recv_x = torch.zeros(num_local, slab_rows, hidden, dtype=torch.bfloat16, device=device)
        recv_scales = None
    recv_count = torch.zeros(num_local, dtype=torch.int32, device=device)
    src_info = torch.full((num_local, slab_rows), -1, dtype=torch.int32, device=device)
    layout_range = torch.zeros(num_local, num_ranks, dtype=torch.int64, device=device)

    def finish(follows_send: bool = False) -> None:
        fill = torch.zeros(num_local, dtype=torch.int64)
        for j in range(num_ranks):
            parts = decoded[j]
            header = parts[0]
            if j in recv_masked or header.shape[0] == 0:
                continue
            exp_ids = header[:, 0].long()
            for e in torch.unique(exp_ids).tolist():
                rows = torch.nonzero(exp_ids == e).flatten()
                n = rows.numel()
                begin = int(fill[e])
                src_info[e, begin:begin + n] = header[rows, 1]
                if use_fp8:
                    recv_x[e, begin:begin + n] = parts[1][rows]
                    scales = parts[2][rows]
                    recv_scales[e, begin:begin + n] = pack_ue8m0(scales) if use_ue8m0 else scales
                else:
                    recv_x[e, begin:begin + n] = parts[1][rows]
                layout_range[e, j] = (begin << 32) | n
                fill[e] += n
        recv_count.copy_(fill.to(torch.int32))
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats.add_(recv_count.to(cumulative_local_expert_recv_stats.device))
        if dispatch_wait_recv_cost_stats is not None:
            cost = torch.full((num_ranks,), waited_ns, dtype=torch.int64)
            for j in recv_masked:
                cost[j] = 0
            dispatch_wait_recv_cost_stats.add_(cost.to(dispatch_wait_recv_cost_stats.device))

    plan = LowLatencyPlan(num_tokens=num_tokens, num_max=num_max, hidden=hidden, num_experts=num_experts,
                          recv_count=recv_count, masked_at_dispatch=tuple(sorted(recv_masked)))
    handle = LowLatencyHandle((src_info, layout_range, num_max, hidden, num_experts), owner, plan)
    out_x = (recv_x, recv_scales) if use_fp8 else recv_x
    return out_x, recv_count, handle, finish


def combine(comm: GroupComm, y: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
            handle: LowLatencyHandle, masked: set[int], shrink: bool, out: torch.Tensor | None,
            combine_wait_recv_cost_stats: torch.Tensor | None, use_logfmt: bool = False):
    """Returns (combined_x, finish) where ``finish()`` computes the weighted sum into the output.

    ``use_logfmt``: each expert output row is summed as ``logfmt.round_trip(row)`` (fp32), in the
    same order and with the same operations as the BF16 sum."""
    device = y.device
    me, num_ranks = comm.rank, comm.size
    src_info, layout_range, num_max, hidden, num_experts = handle
    num_local = num_experts // num_ranks
    num_tokens = topk_idx.shape[0]
    check_distinct_experts("topk_idx", topk_idx)
    masked.update(exchange_control(comm, masked, num_max, shrink, "low_latency_combine"))
    send_masked = set(masked)

    # Expert side: send each source rank its rows back, tagged with (global expert, token).
    per_dest = []
    for j in range(num_ranks):
        if j in send_masked:
            per_dest.append(pack_rows([torch.zeros(0, 2, dtype=torch.int32, device=device),
                                       torch.zeros(0, hidden, dtype=y.dtype, device=device)]))
            continue
        tags, rows = [], []
        for e in range(num_local):
            packed = int(layout_range[e, j])
            begin, count = packed >> 32, packed & 0xFFFFFFFF
            if count == 0:
                continue
            tags.append(torch.stack([torch.full((count,), me * num_local + e, dtype=torch.int32, device=device),
                                     src_info[e, begin:begin + count].to(torch.int32)], 1))
            rows.append(y[e, begin:begin + count])
        tag = torch.cat(tags) if tags else torch.zeros(0, 2, dtype=torch.int32, device=device)
        row = torch.cat(rows) if rows else torch.zeros(0, hidden, dtype=y.dtype, device=device)
        per_dest.append(pack_rows([tag, row]))
    received, recv_masked, waited_ns = exchange_data(comm, per_dest, device, "low_latency_combine", send_masked,
                                                     masked, shrink)
    specs = [(torch.int32, (2,)), (y.dtype, (hidden,))]
    decoded = [unpack_rows(blob, specs, blob.shape[0]) for blob in received]

    result = out if out is not None else torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=device)

    def finish(follows_send: bool = False) -> None:
        # Map (global expert, token) -> received row.
        keys, values = [], []
        for j, (tag, rows) in enumerate(decoded):
            if j in recv_masked or tag.shape[0] == 0:
                continue
            keys.append(tag[:, 0].long() * max(num_tokens, 1) + tag[:, 1].long())
            values.append(logfmt.round_trip(rows) if use_logfmt else rows)
        acc = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=device)
        if keys:
            all_keys = torch.cat(keys)
            all_rows = torch.cat(values)
            order = torch.argsort(all_keys)
            sorted_keys = all_keys[order]
            for k in range(topk_idx.shape[1]):
                ids = topk_idx[:, k].long()
                use = ids >= 0
                if recv_masked:
                    owner_rank = torch.where(use, ids // num_local, torch.zeros_like(ids))
                    for mr in recv_masked:
                        use &= owner_rank != mr
                want = ids * max(num_tokens, 1) + torch.arange(num_tokens, device=device)
                pos = torch.searchsorted(sorted_keys, want.clamp_min(0))
                pos = pos.clamp_max(max(sorted_keys.numel() - 1, 0))
                found = use & (sorted_keys[pos] == want)
                if bool((use & ~found).any()):
                    t_missing = int(torch.nonzero(use & ~found).flatten()[0])
                    raise PeerProtocolError(
                        f"rank {me}: low_latency_combine got no row for token {t_missing}, expert "
                        f"{int(ids[t_missing])}; the expert outputs or topk_idx differ from the dispatch that made `handle`")
                contrib = all_rows[order[pos]].float() * topk_weights[:, k].float().view(-1, 1)
                acc = torch.where(found.view(-1, 1), acc + contrib, acc)
        result.copy_(acc.to(result.dtype))
        if combine_wait_recv_cost_stats is not None:
            cost = torch.full((num_ranks,), waited_ns, dtype=torch.int64)
            for j in recv_masked:
                cost[j] = 0
            combine_wait_recv_cost_stats.add_(cost.to(combine_wait_recv_cost_stats.device))

    return result, finish

