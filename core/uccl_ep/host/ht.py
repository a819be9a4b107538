"""High-throughput (normal) protocol on host threads, one node.

dispatch:  meta handshake (each rank sends each rank its counts: per rank, per channel, per
           expert, per ring) -> one ring phase: every (destination, ring) stream carries the
           tokens of that destination whose DeepEP channel maps to the ring, in token order, as
           chunked ordered writes -> received rows placed in (source rank, token) order.
combine:   handshake -> one ring phase back: each rank returns every row to the rank it came
           from, in the order it arrived -> the source sums (biases first, then ranks ascending,
           fp32), exactly the reference's order.
cached:    handshake -> the dispatch's streams again with new data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidArgument, LimitExceeded
from ..handles import NormalHandle
from ..protocol.packing import unpack_rows
from ..protocol.rings import ring_spec
from ..routing import order_index, pad_rows, per_channel_counts, split_dispatch_fields
from .ht_common import Streams, exchange_meta, host_rings, pack_table, run_phase, specs_width, token_rings

__all__ = ["HostPlan", "dispatch", "cached_dispatch", "combine", "dispatch_specs", "unpack_dispatch",
           "reduce_combine", "shape_outputs", "unpack_cached"]


@dataclass
class HostPlan:
    """What a host dispatch decided; cached dispatch and combine replay it."""

    num_tokens: int
    send_idx: list                 # per destination: token indices, ascending
    recv_counts: list              # per source: rows received
    num_recv: int
    num_rows: int                  # num_recv, or num_worst_tokens
    rings: int
    send_streams: Streams          # dispatch streams (combine receives along them)
    recv_streams: Streams
    order: torch.Tensor            # output row i = received row order[i]
    position: torch.Tensor         # received row j -> output row position[j]
    extra: dict                    # protocol-specific (internode)


def dispatch_specs(x, x_scales, topk_idx, topk_weights, extra_int32: int):
    specs = [(x.dtype, tuple(x.shape[1:]))]
    if x_scales is not None:
        specs.append((x_scales.dtype, tuple(x_scales.shape[1:])))
    if topk_idx is not None:
        specs += [(topk_idx.dtype, tuple(topk_idx.shape[1:])), (topk_weights.dtype, tuple(topk_weights.shape[1:]))]
    specs += [(torch.int32, (1,))] * extra_int32
    return specs


def unpack_dispatch(rows: torch.Tensor, specs, x, x_scales, topk_idx, me: int, experts_per_rank: int):
    parts = unpack_rows(rows[:, :specs_width(specs)].contiguous(), specs, rows.shape[0])
    *fields, rest = split_dispatch_fields(parts, x_scales is not None, topk_idx is not None, me, experts_per_rank)
    return (*fields, [p.view(-1) for p in rest])


def shape_outputs(outs, recv_expert: torch.Tensor, expert_alignment: int, num_worst_tokens: int, me: int):
    """DeepEP's dispatch outputs from the placed rows: per-expert counts rounded to the
    alignment, and with num_worst_tokens every output padded to that many rows (expert list
    empty). outs = (recv_x, recv_scales, recv_topk_idx, recv_topk_weights, recv_src_idx)."""
    num_recv = outs[0].shape[0]
    a = expert_alignment
    expert_list = [int((c + a - 1) // a * a) for c in recv_expert.sum(0).tolist()]
    if num_worst_tokens <= 0:
        return outs, expert_list, num_recv
    if num_recv > num_worst_tokens:
        raise LimitExceeded("num_worst_tokens", "tokens received by this rank", num_recv, num_worst_tokens,
                            hint=f"rank {me} received {num_recv} rows")
    fills = (0, 0, -1, 0, -1)
    padded = tuple(pad_rows(t, num_worst_tokens, f) if t is not None else None for t, f in zip(outs, fills))
    return padded, [], num_worst_tokens


def dispatch(ex, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
             expert_alignment, num_worst_tokens, config):
    R, me = ex.num_ranks, ex.rank
    T = x.shape[0]
    C = config.num_channels
    E = num_tokens_per_expert.numel()
    E_loc = E // R
    rings = host_rings(ex, C)
    ring_of = token_rings(T, C, rings)
    send_idx = [torch.nonzero(is_token_in_rank[:, d], as_tuple=False).flatten() for d in range(R)]
    channel_counts = per_channel_counts(is_token_in_rank, C)  # [R, C]
    ring_counts = torch.stack([torch.bincount(ring_of[s], minlength=rings) for s in send_idx]) if R else None

    # 1. meta: [counts row R | channel counts C | expert counts E_loc | ring counts]
    row = num_tokens_per_rank.to(torch.int64)
    per_dst = torch.cat([row.view(1, -1).expand(R, R), channel_counts,
                         num_tokens_per_expert.to(torch.int64).view(R, E_loc), ring_counts], dim=1)
    meta = torch.from_numpy(exchange_meta(ex, ex.next_ht_parity(), per_dst.numpy(), "dispatch meta"))
    counts = meta[:, :R]                                  # counts[i][j]: tokens i sends to j
    recv_channel = meta[:, R:R + C]                       # from each source, per channel, to me
    recv_expert = meta[:, R + C:R + C + E_loc]
    recv_ring = meta[:, R + C + E_loc:]

    # 2. data: one stream per (destination, ring), token order within it.
    specs = dispatch_specs(x, x_scales, topk_idx, topk_weights, 1)
    cols = [x] + ([x_scales] if x_scales is not None else []) + \
        ([topk_idx, topk_weights] if topk_idx is not None else []) + [torch.arange(T, dtype=torch.int32).view(-1, 1)]
    table, msg = pack_table(cols, T)
    spec = ring_spec(ex, msg, rings, config.num_max_nvl_chunked_recv_tokens, config.num_max_nvl_chunked_send_tokens,
                     "dispatch")
    streams = Streams()
    for d in range(R):
        for r in range(rings):
            streams.send(d, r, send_idx[d][ring_of[send_idx[d]] == r])
    src_of = []
    for s in range(R):
        for r in range(rings):
            n = int(recv_ring[s, r])
            streams.recv(s, r, n)
            if n:
                src_of.append(torch.full((n,), s, dtype=torch.int64))
    got = run_phase(ex, spec, table, streams, "dispatch")
    num_recv = got.shape[0]
    if num_recv != int(counts[:, me].sum()):
        raise InvalidArgument("num_tokens_per_rank", "the same counts as is_token_in_rank on every rank",
                              f"{int(counts[:, me].sum())} announced, {num_recv} in the rings")

    # 3. place rows in (source rank, source token) order.
    src = torch.cat(src_of) if src_of else torch.zeros(0, dtype=torch.int64)
    src_tok = got[:, specs_width(specs) - 4:specs_width(specs)].contiguous().view(torch.int32).view(-1).long()
    order = torch.argsort(src * (1 << 40) + src_tok)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    rows = got[order]
    recv_x, recv_scales, recv_topk_idx, recv_topk_weights, extra = unpack_dispatch(
        rows, specs, x, x_scales, topk_idx, me, E_loc)
    (recv_x, recv_scales, recv_topk_idx, recv_topk_weights, recv_src_idx), num_recv_tokens_per_expert_list, num_rows = \
        shape_outputs((recv_x, recv_scales, recv_topk_idx, recv_topk_weights, extra[0]), recv_expert,
                      expert_alignment, num_worst_tokens, me)

    # 4. DeepEP's intranode handle, from the exchanged counts.
    rank_prefix = counts.cumsum(0).to(torch.int32)
    channel_prefix = channel_counts.cumsum(1).to(torch.int32)
    recv_block_start = [0] + rank_prefix[:, me].tolist()[:-1]
    starts = torch.cat([torch.zeros(R, 1, dtype=torch.int64), recv_channel.cumsum(1)[:, :-1]], dim=1)
    recv_channel_prefix = (starts + torch.tensor(recv_block_start).view(-1, 1)).to(torch.int32)
    send_head = torch.stack([order_index(send_idx[d], T, x.device) for d in range(R)], 1) \
        if R else torch.empty(T, 0, dtype=torch.int32)
    items = (rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head)
    plan = HostPlan(num_tokens=T, send_idx=send_idx, recv_counts=counts[:, me].tolist(), num_recv=num_recv,
                    num_rows=num_rows, rings=rings, send_streams=streams, recv_streams=streams, order=order,
                    position=position, extra={})
    handle = NormalHandle(items, ex.owner, plan)
    return recv_x, recv_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle


def cached_dispatch(ex, x, x_scales, handle, config):
    plan: HostPlan = handle.plan
    if x.shape[0] != plan.num_tokens:
        raise InvalidArgument("x", f"{plan.num_tokens} rows (the token count of the dispatch that made `handle`)",
                              x.shape[0])
    exchange_meta(ex, ex.next_ht_parity(), None, "cached dispatch handshake")
    specs = dispatch_specs(x, x_scales, None, None, 0)
    table, msg = pack_table([x] + ([x_scales] if x_scales is not None else []), x.shape[0])
    spec = ring_spec(ex, msg, plan.rings, config.num_max_nvl_chunked_recv_tokens,
                     config.num_max_nvl_chunked_send_tokens, "cached dispatch")
    got = run_phase(ex, spec, table, plan.send_streams, "cached dispatch")
    return unpack_cached(got[plan.order], specs, x_scales, plan)


def unpack_cached(rows: torch.Tensor, specs, x_scales, plan: HostPlan):
    """(recv_x, recv_scales) of a cached dispatch from its placed rows, padded like the dispatch."""
    parts = unpack_rows(rows[:, :specs_width(specs)].contiguous(), specs, plan.num_recv)
    recv_x = pad_rows(parts[0], plan.num_rows, 0)
    recv_scales = pad_rows(parts[1], plan.num_rows, 0) if x_scales is not None else None
    return recv_x, recv_scales


def reduce_combine(num_tokens: int, hidden_shape, x_dtype, topk_weights_dtype, num_topk, biases,
                   contributions) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference's sum: (bias0 + bias1) in fp32, then every contribution (tokens, rows fp32,
    weights fp32 | None) in the given order; cast back."""
    acc = torch.zeros(num_tokens, *hidden_shape, dtype=torch.float32)
    b0, b1 = biases
    if b0 is not None or b1 is not None:
        zero = torch.zeros((), dtype=torch.float32)
        acc = (b0.float() if b0 is not None else zero) + (b1.float() if b1 is not None else zero) + acc
    acc_w = torch.zeros(num_tokens, num_topk, dtype=torch.float32) if num_topk is not None else None
    for tokens, rows, weights in contributions:
        acc.index_add_(0, tokens, rows)
        if acc_w is not None:
            acc_w.index_add_(0, tokens, weights)
    return acc.to(x_dtype), (acc_w.to(topk_weights_dtype) if acc_w is not None else None)


def combine(ex, x, handle, topk_weights, biases, config):
    plan: HostPlan = handle.plan
    if x.shape[0] != plan.num_rows:
        raise InvalidArgument("x", f"{plan.num_rows} rows (the rows of the dispatch output for `handle`)", x.shape[0])
    if topk_weights is not None and topk_weights.shape[0] != plan.num_rows:
        raise InvalidArgument("topk_weights", f"{plan.num_rows} rows", topk_weights.shape[0])
    R = ex.num_ranks
    exchange_meta(ex, ex.next_ht_parity(), None, "combine handshake")
    specs = [(x.dtype, tuple(x.shape[1:]))] + ([(topk_weights.dtype, tuple(topk_weights.shape[1:]))]
                                               if topk_weights is not None else [])
    table, msg = pack_table([x] + ([topk_weights] if topk_weights is not None else []), x.shape[0])
    spec = ring_spec(ex, msg, plan.rings, config.num_max_nvl_chunked_recv_tokens,
                     config.num_max_nvl_chunked_send_tokens, "combine")
    # Back along the dispatch: what arrived on (source, ring) returns on (source, ring), same order.
    fwd = plan.recv_streams
    back = Streams()
    offsets = fwd.recv_offsets()
    for src, ring, off, n in zip(fwd.recv_src, fwd.recv_ring, offsets, fwd.recv_count):
        back.send(src, ring, plan.position[int(off):int(off) + n])
    tokens_from = [[] for _ in range(R)]
    for dst, ring, rows in zip(plan.send_streams.send_dst, plan.send_streams.send_ring, plan.send_streams.send_rows):
        back.recv(dst, ring, rows.numel())
        tokens_from[dst].append(rows)
    got = run_phase(ex, spec, table, back, "combine")
    parts = unpack_rows(got[:, :specs_width(specs)].contiguous(), specs, got.shape[0])
    # Rows arrive grouped by (peer, ring) in `back.recv_*` order, i.e. by peer ascending.
    contributions, at = [], 0
    for peer in range(R):
        toks = torch.cat(tokens_from[peer]) if tokens_from[peer] else torch.zeros(0, dtype=torch.int64)
        n = toks.numel()
        w = parts[1][at:at + n].float() if topk_weights is not None else None
        contributions.append((toks, parts[0][at:at + n].float(), w))
        at += n
    return reduce_combine(plan.num_tokens, tuple(x.shape[1:]), x.dtype,
                          topk_weights.dtype if topk_weights is not None else None,
                          topk_weights.shape[1] if topk_weights is not None else None, biases, contributions)
