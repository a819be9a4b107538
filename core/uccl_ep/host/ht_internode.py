"""High-throughput protocol across nodes on host threads: DeepEP's two-level design.

N nodes x G ranks; rank (n, l). dispatch:
  meta     every rank sends every rank its counts (as intranode, plus per-node counts);
  hop 1    ("RDMA") source (m, l) sends each token once per destination NODE n, to the rank
           (n, l) of its rail: dedup per node; the message carries the token's source rank and the
           bitmask of the ranks of node n that want it;
  hop 2    ("NVL") that forwarder sends each received token to the local ranks in its bitmask;
  final    rows placed in (source rank, token) order, as the reference does.
combine (hierarchical reduce):
  hop A    every rank returns each row to the forwarder it came from;
  reduce   the forwarder sums its node's rows of a token in fp32, local ranks ascending;
  hop B    it returns one fp32 partial per token to the source;
  final    the source sums (biases first) the partials of the nodes in ascending order.
NOTES: partials travel in fp32 (DeepEP rounds them to BF16): for BF16 data the sums are then
exact in almost every case, so results match the reference's flat rank order bit for bit except
when one token's values span more than 2^14 in magnitude; the tests allow one BF16 ulp there.
Hop 1 / hop B use ring area 0, hop 2 / hop A area 1: the two hops of an op never share slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidArgument
from ..handles import NormalHandle
from ..protocol.packing import unpack_rows
from ..protocol.rings import ring_spec
from ..routing import order_index, per_channel_counts
from .ht import HostPlan, dispatch_specs, reduce_combine, shape_outputs, unpack_cached, unpack_dispatch
from .ht_common import Streams, exchange_meta, host_rings, pack_table, run_phase, specs_width, token_rings

__all__ = ["dispatch", "cached_dispatch", "combine"]


@dataclass
class Hops:
    hop1: Streams          # source -> forwarders (this rank's sends and its receives as forwarder)
    hop2: Streams          # forwarder -> local ranks
    order1: torch.Tensor   # hop-1 received rows in (source, token) order (send_nvl_head order)


def _specs(ex, cfg, msg: int, rings: int, phase: str):
    rdma = ring_spec(ex, msg, rings, cfg.num_max_rdma_chunked_recv_tokens, cfg.num_max_rdma_chunked_send_tokens,
                     phase + " hop 1", area=0, areas=2)
    nvl = ring_spec(ex, msg, rings, cfg.num_max_nvl_chunked_recv_tokens, cfg.num_max_nvl_chunked_send_tokens,
                    phase + " hop 2", area=1, areas=2)
    return rdma, nvl


def dispatch(ex, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
             expert_alignment, num_worst_tokens, config):
    topo = ex.topology
    R, me, N, G = ex.num_ranks, ex.rank, topo.num_nodes, topo.ranks_per_node
    n0, l0 = topo.node_of(me), topo.local_rank_of(me)
    T, C = x.shape[0], config.num_channels
    E_loc = num_tokens_per_expert.numel() // R
    rings = host_rings(ex, C)
    ring_of = token_rings(T, C, rings)
    in_node = is_token_in_rank.view(T, N, G).any(-1)
    send_idx = [torch.nonzero(is_token_in_rank[:, d], as_tuple=False).flatten() for d in range(R)]
    node_idx = [torch.nonzero(in_node[:, n], as_tuple=False).flatten() for n in range(N)]
    channel_counts = per_channel_counts(is_token_in_rank, C)        # [R, C]
    node_channel_counts = per_channel_counts(in_node, C)            # [N, C]
    ring_counts = torch.stack([torch.bincount(ring_of[s], minlength=rings) for s in send_idx])
    node_ring_counts = torch.stack([torch.bincount(ring_of[s], minlength=rings) for s in node_idx])

    # 1. meta: [counts row R | channel C | experts E_loc | rings | node channel C | node rings]
    nodes_of = torch.arange(R) // G
    per_dst = torch.cat([num_tokens_per_rank.to(torch.int64).view(1, -1).expand(R, R), channel_counts,
                         num_tokens_per_expert.to(torch.int64).view(R, E_loc), ring_counts,
                         node_channel_counts[nodes_of], node_ring_counts[nodes_of]], dim=1)
    meta = torch.from_numpy(exchange_meta(ex, ex.next_ht_parity(), per_dst.numpy(), "dispatch meta"))
    at = 0

    def take(n):
        nonlocal at
        at += n
        return meta[:, at - n:at]

    counts, recv_channel, recv_expert, recv_ring, recv_node_channel, recv_node_ring = \
        take(R), take(C), take(E_loc), take(rings), take(C), take(rings)

    # 2. hop 1: one copy per destination node, to the rank of my rail there.
    specs = dispatch_specs(x, x_scales, topk_idx, topk_weights, 3)
    base_cols = [x] + ([x_scales] if x_scales is not None else []) + \
        ([topk_idx, topk_weights] if topk_idx is not None else []) + \
        [torch.arange(T, dtype=torch.int32).view(-1, 1), torch.full((T, 1), me, dtype=torch.int32)]
    weights = 1 << torch.arange(G)
    masks = [(is_token_in_rank[:, n * G:(n + 1) * G].to(torch.int64) * weights).sum(1).to(torch.int32).view(-1, 1)
             for n in range(N)]
    table = torch.cat([pack_table(base_cols + [masks[n]], T)[0] for n in range(N)])  # row n*T + t
    msg = table.shape[1]
    rdma, nvl = _specs(ex, config, msg, rings, "dispatch")
    hop1 = Streams()
    for n in range(N):
        for r in range(rings):
            hop1.send(n * G + l0, r, node_idx[n][ring_of[node_idx[n]] == r] + n * T)
    rails = [m * G + l0 for m in range(N)]
    for s in rails:
        for r in range(rings):
            hop1.recv(s, r, int(recv_node_ring[s, r]))
    got1 = run_phase(ex, rdma, table, hop1, "dispatch hop 1")
    w = specs_width(specs)
    fields1 = got1[:, w - 12:w].contiguous().view(torch.int32).view(-1, 3)  # src_idx, src_rank, mask

    # 3. hop 2: forward each token to the local ranks in its mask, stream by (local rank, ring).
    hop2 = Streams()
    offsets = hop1.recv_offsets()
    for g in range(G):
        for r in range(rings):
            rows = [torch.arange(int(o), int(o) + n)[(fields1[int(o):int(o) + n, 2] >> g) & 1 == 1]
                    for s, rr, o, n in zip(hop1.recv_src, hop1.recv_ring, offsets, hop1.recv_count) if rr == r]
            hop2.send(n0 * G + g, rings + r, torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64))
    for l in range(G):
        for r in range(rings):
            hop2.recv(n0 * G + l, rings + r, int(sum(int(recv_ring[m * G + l, r]) for m in range(N))))
    got2 = run_phase(ex, nvl, got1, hop2, "dispatch hop 2")

    # 4. final placement in (source rank, token) order.
    fields2 = got2[:, w - 12:w].contiguous().view(torch.int32).view(-1, 3).long()
    order = torch.argsort(fields2[:, 1] * (1 << 40) + fields2[:, 0])
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    rows = got2[order]
    num_recv = rows.shape[0]
    if num_recv != int(counts[:, me].sum()):
        raise InvalidArgument("num_tokens_per_rank", "the same counts as is_token_in_rank on every rank",
                              f"{int(counts[:, me].sum())} announced, {num_recv} forwarded")
    recv_x, recv_scales, recv_topk_idx, recv_topk_weights, extra = unpack_dispatch(
        rows, specs, x, x_scales, topk_idx, me, E_loc)
    _, recv_src_rank, recv_mask = extra
    (recv_x, recv_scales, recv_topk_idx, recv_topk_weights, recv_src_idx), expert_list, num_rows = shape_outputs(
        (recv_x, recv_scales, recv_topk_idx, recv_topk_weights, extra[0]), recv_expert, expert_alignment,
        num_worst_tokens, me)

    # 5. DeepEP's internode handle.
    order1 = torch.argsort(fields1[:, 1].long() * (1 << 40) + fields1[:, 0].long())
    items = _handle_items(topo, me, T, counts, channel_counts, node_channel_counts, recv_channel, recv_node_channel,
                          is_token_in_rank, in_node, recv_src_rank, recv_mask, recv_src_idx.numel(), fields1[order1],
                          rails)
    plan = HostPlan(num_tokens=T, send_idx=send_idx, recv_counts=counts[:, me].tolist(), num_recv=num_recv,
                    num_rows=num_rows, rings=rings, send_streams=hop1, recv_streams=hop2, order=order,
                    position=position, extra=dict(hops=Hops(hop1, hop2, order1)))
    handle = NormalHandle(items, ex.owner, plan)
    return recv_x, recv_scales, recv_topk_idx, recv_topk_weights, expert_list, handle


def _handle_items(topo, me, T, counts, channel_counts, node_channel_counts, recv_channel, recv_node_channel,
                  is_token_in_rank, in_node, recv_src_rank, recv_mask, num_rows, rdma_fields, rails):
    R, N, G = topo.num_ranks, topo.num_nodes, topo.ranks_per_node
    recv_rdma_channel = torch.stack([recv_node_channel[s] for s in rails])  # [N, C]
    rank_prefix = counts.cumsum(0)
    recv_block_start = [0] + rank_prefix[:, me].tolist()[:-1]
    starts = torch.cat([torch.zeros(R, 1, dtype=torch.int64), recv_channel.cumsum(1)[:, :-1]], dim=1)
    recv_channel_prefix = (starts + torch.tensor(recv_block_start).view(-1, 1)).to(torch.int32)
    recv_src_meta = torch.zeros(num_rows, 8, dtype=torch.uint8)
    n_valid = recv_src_rank.numel()
    recv_src_meta[:n_valid, 0:4] = (recv_src_rank // G).to(torch.int32).view(-1, 1).view(torch.uint8).view(-1, 4)
    recv_src_meta[:n_valid, 4:8] = recv_mask.to(torch.int32).contiguous().view(-1, 1).view(torch.uint8).view(-1, 4)
    send_rdma_head = torch.stack([order_index(torch.nonzero(in_node[:, n]).flatten(), T, "cpu") for n in range(N)], 1)
    # send_nvl_head: for every token received at RDMA level ((source, token) order), its row in
    # each local rank of this node: rows of sources before it there + its rank among the source's
    # tokens for that local rank.
    col_prefix = counts.cumsum(0)
    src, mask = rdma_fields[:, 1].long(), rdma_fields[:, 2].long()
    send_nvl_head = torch.full((src.numel(), G), -1, dtype=torch.int32)
    node = topo.node_of(me)
    for g in range(G):
        dst = node * G + g
        bit = (mask >> g) & 1
        for s in torch.unique(src).tolist():
            sel = torch.nonzero(src == s).flatten()
            head = torch.cumsum(bit[sel], 0) - 1
            base = int(col_prefix[s - 1, dst]) if s > 0 else 0
            send_nvl_head[sel, g] = torch.where(bit[sel] == 1, head + base, torch.full_like(head, -1)).to(torch.int32)
    return (is_token_in_rank, node_channel_counts.cumsum(1).to(torch.int32), channel_counts.cumsum(1).to(torch.int32),
            recv_rdma_channel.cumsum(1).to(torch.int32), recv_rdma_channel.sum(1).cumsum(0).to(torch.int32),
            recv_channel_prefix, torch.tensor(counts[:, me].tolist()).cumsum(0).to(torch.int32), recv_src_meta,
            send_rdma_head, send_nvl_head)


def cached_dispatch(ex, x, x_scales, handle, config):
    plan: HostPlan = handle.plan
    hops: Hops = plan.extra["hops"]
    if x.shape[0] != plan.num_tokens:
        raise InvalidArgument("x", f"{plan.num_tokens} rows (the token count of the dispatch that made `handle`)",
                              x.shape[0])
    exchange_meta(ex, ex.next_ht_parity(), None, "cached dispatch handshake")
    N = ex.topology.num_nodes
    specs = dispatch_specs(x, x_scales, None, None, 0)
    one, msg = pack_table([x] + ([x_scales] if x_scales is not None else []), x.shape[0])
    table = one.repeat(N, 1)  # row n*T + t, as the dispatch's hop-1 streams index it
    rdma, nvl = _specs(ex, config, msg, plan.rings, "cached dispatch")
    got1 = run_phase(ex, rdma, table, hops.hop1, "cached dispatch hop 1")
    got2 = run_phase(ex, nvl, got1, hops.hop2, "cached dispatch hop 2")
    return unpack_cached(got2[plan.order], specs, x_scales, plan)


def combine(ex, x, handle, topk_weights, biases, config):
    plan: HostPlan = handle.plan
    hops: Hops = plan.extra["hops"]
    if x.shape[0] != plan.num_rows:
        raise InvalidArgument("x", f"{plan.num_rows} rows (the rows of the dispatch output for `handle`)", x.shape[0])
    if topk_weights is not None and topk_weights.shape[0] != plan.num_rows:
        raise InvalidArgument("topk_weights", f"{plan.num_rows} rows", topk_weights.shape[0])
    exchange_meta(ex, ex.next_ht_parity(), None, "combine handshake")
    G, N, H = ex.topology.ranks_per_node, ex.topology.num_nodes, tuple(x.shape[1:])
    K = topk_weights.shape[1] if topk_weights is not None else 0
    cols = [x] + ([topk_weights] if topk_weights is not None else [])
    specs_a = [(c.dtype, tuple(c.shape[1:])) for c in cols]
    table_a, msg_a = pack_table(cols, x.shape[0])
    _, nvl = _specs(ex, config, msg_a, plan.rings, "combine")

    # hop A: rows back to the forwarder they came from, in arrival order.
    hop_a = Streams()
    offs2 = hops.hop2.recv_offsets()
    for f, ring, o, n in zip(hops.hop2.recv_src, hops.hop2.recv_ring, offs2, hops.hop2.recv_count):
        hop_a.send(f, ring, plan.position[int(o):int(o) + n])
    for g, ring, rows in zip(hops.hop2.send_dst, hops.hop2.send_ring, hops.hop2.send_rows):
        hop_a.recv(g, ring, rows.numel())
    got_a = run_phase(ex, nvl, table_a, hop_a, "combine hop A")
    parts = unpack_rows(got_a[:, :specs_width(specs_a)].contiguous(), specs_a, got_a.shape[0])

    # reduce per token at the forwarder: local ranks ascending, fp32.
    rows1 = int(sum(hops.hop1.recv_count))
    partial = torch.zeros(rows1, *H, dtype=torch.float32)
    partial_w = torch.zeros(rows1, K, dtype=torch.float32)
    at = 0
    for rows in hops.hop2.send_rows:  # grouped by local rank ascending, as hop_a.recv was called
        n = rows.numel()
        partial.index_add_(0, rows, parts[0][at:at + n].float())
        if K:
            partial_w.index_add_(0, rows, parts[1][at:at + n].float())
        at += n

    # hop B: one fp32 partial per token back to its source.
    table_b, msg_b = pack_table([partial] + ([partial_w] if K else []), rows1)
    rdma, _ = _specs(ex, config, msg_b, plan.rings, "combine")
    hop_b = Streams()
    offs1 = hops.hop1.recv_offsets()
    for s, ring, o, n in zip(hops.hop1.recv_src, hops.hop1.recv_ring, offs1, hops.hop1.recv_count):
        hop_b.send(s, ring, torch.arange(int(o), int(o) + n))
    tokens_from = [[] for _ in range(N)]
    for f, ring, rows in zip(hops.hop1.send_dst, hops.hop1.send_ring, hops.hop1.send_rows):
        hop_b.recv(f, ring, rows.numel())
        tokens_from[f // G].append(rows % plan.num_tokens)
    got_b = run_phase(ex, rdma, table_b, hop_b, "combine hop B")
    specs_b = [(torch.float32, H)] + ([(torch.float32, (K,))] if K else [])
    parts_b = unpack_rows(got_b[:, :specs_width(specs_b)].contiguous(), specs_b, got_b.shape[0])
    contributions, at = [], 0
    for n in range(N):  # hop_b.recv was called node by node (hop 1 sends are node-major)
        toks = torch.cat(tokens_from[n]) if tokens_from[n] else torch.zeros(0, dtype=torch.int64)
        k = toks.numel()
        contributions.append((toks, parts_b[0][at:at + k], parts_b[1][at:at + k] if K else None))
        at += k
    return reduce_combine(plan.num_tokens, H, x.dtype, topk_weights.dtype if K else None, K if K else None, biases,
                          contributions)
