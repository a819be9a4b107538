"""Reference normal (high-throughput) mode: layout, dispatch, cached dispatch, combine.

Semantics (DeepEP V1's; docs/api.md, "Normal (high-throughput) mode"), the ground truth for every executor:
- dispatch deduplicates per rank: a destination rank receives one copy of a token however many
  of its experts the token selects; rows are ordered by (source rank, source token index);
- ``recv_topk_idx`` holds local expert ids, -1 for experts elsewhere; ``recv_topk_weights`` is 0
  where the id is -1;
- ``num_recv_tokens_per_expert_list[e]`` = sum over sources of their ``num_tokens_per_expert``
  for this rank's expert e, rounded up to ``expert_alignment``;
- combine is an unweighted sum: ``out[t] = (b0[t] + b1[t]) + x_0[row] + x_1[row] + ...`` over
  the ranks that received t, in ascending rank order, in fp32, cast to the input dtype; combined
  ``topk_weights`` are the same plain sum (no bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidArgument, LimitExceeded
from ..handles import NormalHandle
from ..protocol.packing import pack_rows, unpack_rows
from ..topology import Topology
from .comm import GroupComm
from ..routing import channel_ranges, order_index, pad_rows, per_channel_counts, split_dispatch_fields

__all__ = ["dispatch_layout", "NormalPlan", "dispatch", "cached_dispatch", "combine", "channel_ranges"]


def dispatch_layout(topk_idx: torch.Tensor, num_experts: int, topo: Topology):
    """(num_tokens_per_rank [R] i32, num_tokens_per_rdma_rank [N] i32 | None,
    num_tokens_per_expert [E] i32, is_token_in_rank [T, R] bool)."""
    num_tokens = topk_idx.shape[0]
    num_ranks = topo.num_ranks
    experts_per_rank = num_experts // num_ranks
    valid = topk_idx >= 0
    num_tokens_per_expert = torch.bincount(topk_idx[valid].long(), minlength=num_experts).to(torch.int32)
    rank_of = torch.where(valid, topk_idx // experts_per_rank, torch.full_like(topk_idx, num_ranks))
    hits = torch.zeros(num_tokens, num_ranks + 1, dtype=torch.bool, device=topk_idx.device)
    hits.scatter_(1, rank_of.long(), True)
    is_token_in_rank = hits[:, :num_ranks].contiguous()
    num_tokens_per_rank = is_token_in_rank.sum(0, dtype=torch.int32)
    num_tokens_per_rdma_rank = None
    if topo.is_internode:
        in_node = is_token_in_rank.view(num_tokens, topo.num_nodes, topo.ranks_per_node).any(-1)
        num_tokens_per_rdma_rank = in_node.sum(0, dtype=torch.int32)
    return num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank


@dataclass
class NormalPlan:
    """What a reference dispatch decided, reused by cached dispatch and combine."""

    num_tokens: int                 # T on this rank (sender side)
    send_idx: list[torch.Tensor]    # per destination rank: token indices sent, ascending (int64)
    recv_counts: list[int]          # per source rank: rows received
    num_recv: int                   # valid received rows
    num_rows: int                   # rows of dispatch outputs (num_recv, or num_worst_tokens)


def dispatch(comm: GroupComm, topo: Topology, owner: object, x: torch.Tensor, x_scales: torch.Tensor | None,
             topk_idx: torch.Tensor | None, topk_weights: torch.Tensor | None, num_tokens_per_rank: torch.Tensor,
             is_token_in_rank: torch.Tensor, num_tokens_per_expert: torch.Tensor, expert_alignment: int,
             num_worst_tokens: int, num_channels: int):
    """Fresh dispatch. Returns (recv_x, recv_scales, recv_topk_idx, recv_topk_weights, list, handle)."""
    device = x.device
    me, num_ranks = comm.rank, comm.size
    num_tokens = x.shape[0]
    num_experts = num_tokens_per_expert.numel()
    experts_per_rank = num_experts // num_ranks

    # Every rank's send counts -> counts[i][j] = tokens i sends to j.
    counts = comm.all_gather_int64(num_tokens_per_rank.to(torch.int64), device, "dispatch (counts)").cpu()
    rank_prefix = counts.cumsum(0).to(torch.int32)                      # [R, R] inclusive over sources
    send_idx = [torch.nonzero(is_token_in_rank[:, r], as_tuple=False).flatten() for r in range(num_ranks)]

    channel_counts = per_channel_counts(is_token_in_rank, num_channels)  # [R, C]
    channel_prefix = channel_counts.cumsum(1)
    nodes, gpn = topo.num_nodes, topo.ranks_per_node
    is_token_in_node = is_token_in_rank.view(num_tokens, nodes, gpn).any(-1)
    node_channel_counts = per_channel_counts(is_token_in_node, num_channels)  # [N, C]

    # Small per-destination metadata: this rank's counts of the destination's experts, its
    # channel prefix toward the destination, and its per-channel count toward the destination's node.
    meta = []
    for r in range(num_ranks):
        ntpe = num_tokens_per_expert[r * experts_per_rank:(r + 1) * experts_per_rank].to(torch.int64).cpu()
        meta.append(torch.cat([ntpe, channel_prefix[r].cpu(), node_channel_counts[topo.node_of(r)].cpu()]).view(1, -1))
    recv_meta = [m.view(-1) for m in comm.exchange_rows(meta, torch.device("cpu"), "dispatch (metadata)")]

    # Payload rows: x bytes | scales | topk idx | topk weights | source index | node bitmask.
    my_nodes_mask = []
    for r in range(num_ranks):
        node = topo.node_of(r)
        bits = is_token_in_rank[:, node * gpn:(node + 1) * gpn].to(torch.int64)
        weights = (1 << torch.arange(gpn, dtype=torch.int64, device=device))
        my_nodes_mask.append((bits * weights).sum(1).to(torch.int32))
    per_dest = []
    for r in range(num_ranks):
        sel = send_idx[r]
        cols = [x[sel]]
        if x_scales is not None:
            cols.append(x_scales[sel])
        if topk_idx is not None:
            cols.extend([topk_idx[sel], topk_weights[sel]])
        cols.extend([sel.to(torch.int32).view(-1, 1), my_nodes_mask[r][sel].view(-1, 1)])
        per_dest.append(pack_rows(cols))
    received = comm.exchange_rows(per_dest, device, "dispatch")
    recv_counts = [int(t.shape[0]) for t in received]
    num_recv = sum(recv_counts)
    blob = torch.cat(received) if received else torch.empty(0, 0, dtype=torch.uint8, device=device)

    specs = [(x.dtype, tuple(x.shape[1:]))]
    if x_scales is not None:
        specs.append((x_scales.dtype, tuple(x_scales.shape[1:])))
    if topk_idx is not None:
        specs.extend([(topk_idx.dtype, tuple(topk_idx.shape[1:])), (topk_weights.dtype, tuple(topk_weights.shape[1:]))])
    specs.extend([(torch.int32, (1,)), (torch.int32, (1,))])
    recv_x, recv_scales, recv_topk_idx, recv_topk_weights, rest = split_dispatch_fields(
        unpack_rows(blob, specs, num_recv), x_scales is not None, topk_idx is not None, me, experts_per_rank)
    recv_src_idx, recv_nvl_mask = (p.view(-1) for p in rest)

    # Per-expert received counts, from the senders' per-expert counts (DeepEP semantics).
    per_expert = torch.zeros(experts_per_rank, dtype=torch.int64)
    for m in recv_meta:
        per_expert += m[:experts_per_rank]
    align = expert_alignment
    num_recv_tokens_per_expert_list = [int((c + align - 1) // align * align) for c in per_expert.tolist()]

    num_rows = num_recv
    if num_worst_tokens > 0:
        if num_recv > num_worst_tokens:
            raise LimitExceeded("num_worst_tokens", "tokens received by this rank", num_recv, num_worst_tokens,
                                hint=f"rank {me} received {num_recv} rows")
        num_rows = num_worst_tokens
        recv_x = pad_rows(recv_x, num_rows, 0)
        recv_scales = pad_rows(recv_scales, num_rows, 0) if recv_scales is not None else None
        recv_topk_idx = pad_rows(recv_topk_idx, num_rows, -1) if recv_topk_idx is not None else None
        recv_topk_weights = pad_rows(recv_topk_weights, num_rows, 0) if recv_topk_weights is not None else None
        recv_src_idx = pad_rows(recv_src_idx, num_rows, -1)
        num_recv_tokens_per_expert_list = []

    plan = NormalPlan(num_tokens=num_tokens, send_idx=send_idx, recv_counts=recv_counts, num_recv=num_recv,
                      num_rows=num_rows)
    # recv_channel_prefix[i][c] = first row in recv_x of source i's channel c.
    recv_block_start = [0] + rank_prefix[:, me].tolist()[:-1]
    recv_channel_prefix = torch.zeros(num_ranks, num_channels, dtype=torch.int32)
    for i, m in enumerate(recv_meta):
        src_channel_prefix = m[experts_per_rank:experts_per_rank + num_channels]
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), src_channel_prefix[:-1]])
        recv_channel_prefix[i] = (starts + recv_block_start[i]).to(torch.int32)

    send_head = torch.stack([order_index(send_idx[r], num_tokens, device) for r in range(num_ranks)], 1) \
        if num_ranks else torch.empty(num_tokens, 0, dtype=torch.int32, device=device)
    if not topo.is_internode:
        items = (rank_prefix.to(device), channel_prefix.to(torch.int32).to(device),
                 recv_channel_prefix.to(device), recv_src_idx, is_token_in_rank, send_head)
    else:
        items = _internode_handle_items(comm, topo, device, counts, recv_counts, recv_meta, experts_per_rank,
                                        num_channels, channel_prefix, node_channel_counts, recv_channel_prefix,
                                        is_token_in_rank, is_token_in_node, recv_src_idx, recv_nvl_mask, send_head)
    handle = NormalHandle(items, owner, plan)
    return recv_x, recv_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle


def _internode_handle_items(comm, topo, device, counts, recv_counts, recv_meta, experts_per_rank, num_channels,
                            channel_prefix, node_channel_counts, recv_channel_prefix, is_token_in_rank,
                            is_token_in_node, recv_src_idx, recv_nvl_mask, send_head):
    """DeepEP's 10-tuple internode handle, computed from the reference's routing.

    The "RDMA" level is DeepEP's: rank (node n, local l) receives from ranks (m, l) every token
    that goes to node n once, then forwards it over NVLink to the local ranks that need it.
    """
    me, num_ranks = comm.rank, comm.size
    nodes, gpn = topo.num_nodes, topo.ranks_per_node
    my_local = topo.local_rank_of(me)
    num_tokens = is_token_in_rank.shape[0]
    rdma_channel_prefix = node_channel_counts.cumsum(1).to(torch.int32)
    # RDMA-level receive: counts per channel from (m, my_local) for every node m.
    recv_rdma_channel = torch.zeros(nodes, num_channels, dtype=torch.int64)
    for m in range(nodes):
        src = m * gpn + my_local
        recv_rdma_channel[m] = recv_meta[src][experts_per_rank + num_channels:experts_per_rank + 2 * num_channels]
    recv_rdma_rank_prefix_sum = recv_rdma_channel.sum(1).cumsum(0).to(torch.int32)
    recv_gbl_rank_prefix_sum = torch.tensor(recv_counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    recv_src_meta = torch.zeros(len(recv_src_idx), 8, dtype=torch.uint8, device=device)
    src_node = torch.cat([torch.full((c,), topo.node_of(i), dtype=torch.int32) for i, c in enumerate(recv_counts)]) \
        if recv_counts else torch.zeros(0, dtype=torch.int32)
    n_valid = src_node.numel()
    recv_src_meta[:n_valid, 0:4] = src_node.to(device).view(-1, 1).view(torch.uint8).view(-1, 4)
    recv_src_meta[:n_valid, 4:8] = recv_nvl_mask[:n_valid].contiguous().view(-1, 1).view(torch.uint8).view(-1, 4)
    send_rdma_head = torch.stack([order_index(torch.nonzero(is_token_in_node[:, n]).flatten(), num_tokens, device)
                                  for n in range(nodes)], 1)
    # send_nvl_head: for every token this rank receives at RDMA level, its row in each local rank
    # of this node, or -1. The sender computes the rows and ships them to (node, same local).
    col_prefix = counts.cumsum(0)  # [R, R]
    per_dest = []
    for r in range(num_ranks):
        if topo.local_rank_of(r) != topo.local_rank_of(me):
            per_dest.append(torch.zeros(0, gpn, dtype=torch.int32))
            continue
        n = topo.node_of(r)
        sel = torch.nonzero(is_token_in_node[:, n]).flatten().cpu()
        rows = torch.full((sel.numel(), gpn), -1, dtype=torch.int32)
        for g in range(gpn):
            dst = n * gpn + g
            base = int(col_prefix[me - 1, dst]) if me > 0 else 0
            head = send_head[:, dst].cpu()[sel]
            rows[:, g] = torch.where(head >= 0, head + base, head)
        per_dest.append(rows)
    got = comm.exchange_rows(per_dest, torch.device("cpu"), "dispatch (internode handle)")
    send_nvl_head = (torch.cat(got) if got else torch.zeros(0, gpn, dtype=torch.int32)).to(device)
    return (is_token_in_rank, rdma_channel_prefix.to(device), channel_prefix.to(torch.int32).to(device),
            recv_rdma_channel.cumsum(1).to(torch.int32).to(device), recv_rdma_rank_prefix_sum.to(device),
            recv_channel_prefix.to(device), recv_gbl_rank_prefix_sum.to(device), recv_src_meta,
            send_rdma_head, send_nvl_head)


def cached_dispatch(comm: GroupComm, x: torch.Tensor, x_scales: torch.Tensor | None, handle: NormalHandle):
    """Dispatch ``x`` with the routing of an earlier dispatch. Returns (recv_x, recv_scales)."""
    plan: NormalPlan = handle.plan
    if x.shape[0] != plan.num_tokens:
        raise InvalidArgument("x", f"{plan.num_tokens} rows (the token count of the dispatch that made `handle`)",
                              x.shape[0])
    cols_of = lambda sel: [x[sel]] + ([x_scales[sel]] if x_scales is not None else [])  # noqa: E731
    received = comm.exchange_rows([pack_rows(cols_of(sel)) for sel in plan.send_idx], x.device, "cached_dispatch")
    blob = torch.cat(received)
    specs = [(x.dtype, tuple(x.shape[1:]))] + ([(x_scales.dtype, tuple(x_scales.shape[1:]))] if x_scales is not None else [])
    parts = unpack_rows(blob, specs, plan.num_recv)
    recv_x = pad_rows(parts[0], plan.num_rows, 0)
    recv_scales = pad_rows(parts[1], plan.num_rows, 0) if x_scales is not None else None
    return recv_x, recv_scales


def combine(comm: GroupComm, x: torch.Tensor, handle: NormalHandle, topk_weights: torch.Tensor | None,
            biases: tuple[torch.Tensor | None, torch.Tensor | None]):
    """Unweighted sum back to the source tokens. Returns (combined_x, combined_topk_weights)."""
    plan: NormalPlan = handle.plan
    if x.shape[0] != plan.num_rows:
        raise InvalidArgument("x", f"{plan.num_rows} rows (the rows of the dispatch output for `handle`)", x.shape[0])
    if topk_weights is not None and topk_weights.shape[0] != plan.num_rows:
        raise InvalidArgument("topk_weights", f"{plan.num_rows} rows", topk_weights.shape[0])
    device = x.device
    # Row blocks by source rank, in the order that source sent them.
    bounds = torch.tensor([0] + plan.recv_counts).cumsum(0).tolist()
    back = []
    for i in range(comm.size):
        cols = [x[bounds[i]:bounds[i + 1]]]
        if topk_weights is not None:
            cols.append(topk_weights[bounds[i]:bounds[i + 1]])
        back.append(pack_rows(cols))
    received = comm.exchange_rows(back, device, "combine")
    specs = [(x.dtype, tuple(x.shape[1:]))] + ([(topk_weights.dtype, tuple(topk_weights.shape[1:]))]
                                               if topk_weights is not None else [])
    acc = torch.zeros(plan.num_tokens, *x.shape[1:], dtype=torch.float32, device=device)
    b0, b1 = biases
    if b0 is not None or b1 is not None:
        # NOTES: (b0 + b1) first, then the ranks in ascending order: the kernels' exact fp32 order.
        zero = torch.zeros((), dtype=torch.float32, device=device)
        acc = (b0.float() if b0 is not None else zero) + (b1.float() if b1 is not None else zero) + acc
    acc_w = torch.zeros(plan.num_tokens, topk_weights.shape[1], dtype=torch.float32, device=device) \
        if topk_weights is not None else None
    for r, blob in enumerate(received):
        parts = unpack_rows(blob, specs, plan.send_idx[r].numel())
        idx = plan.send_idx[r].to(device)
        acc.index_add_(0, idx, parts[0].float())
        if acc_w is not None:
            acc_w.index_add_(0, idx, parts[1].float())
    combined_w = acc_w.to(topk_weights.dtype) if acc_w is not None else None
    return acc.to(x.dtype), combined_w
