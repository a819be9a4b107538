"""Planning of normal (HT) mode through the CPU proxy, in torch on whatever device the tensors
live (so CPU tests check it against the reference): the layout twins of
core/kernels/include/uccl_ep/kernel_abi_internode.h, the per-op ring geometry
(`uccl_ep.protocol.rings`, as the host executor's), the meta records, and DeepEP's handles from the exchanged records.

Nothing here synchronizes with the device: shapes come from the host (rows known after the
notify wait, or num_worst_tokens), values stay on the device.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..errors import InvalidArgument, LimitExceeded
from ..protocol.layout import META_COUNTER, RING_HEAD_BASE, MetaLayout, align16, meta_slot_bytes
from ..protocol.rings import RingSpec, ring_spec

__all__ = ["MAX_RANKS", "MAX_LOCAL", "MAX_CHANNELS", "MAX_RINGS", "NUM_COUNTERS", "HEAD_BASE", "META_COUNTER0", "STATE_BYTES",
           "state_offsets", "dispatch_msg_bytes", "forward_msg_bytes", "combine_msg_bytes", "partial_msg_bytes",
           "region_layout", "geometry", "channel_counts", "node_mask", "records", "RecvLayout", "recv_layout",
           "send_head", "intranode_handle", "internode_handle", "forward_handle", "check_scales", "ProxyNormalPlan"]

# Mirrors of kernel_abi_internode.h (a CPU test compiles the header and compares).
MAX_RANKS = 16
MAX_LOCAL = 8                       # ranks per node the forward kernels handle
MAX_CHANNELS = 64
MAX_RINGS = 2 * MAX_CHANNELS        # ring id c (area 0) and C + c (area 1)
HEAD_BASE = RING_HEAD_BASE          # HEAD(r) = 512 + r, as the host executor's rings
META_COUNTER0 = META_COUNTER[0]     # META(parity) = 1024 + parity
NUM_COUNTERS = META_COUNTER[1] + 1


def state_offsets() -> dict[str, int]:
    """Byte offsets of HTProxyState's fields."""
    seen = 8
    send = seen + 2 * MAX_RANKS * 8
    recv = send + MAX_RANKS * MAX_RINGS * 8
    self_tail = recv + MAX_RANKS * MAX_RINGS * 8
    self_head = self_tail + MAX_RINGS * 8
    area_geometry = self_head + MAX_RINGS * 8
    mate_tail = area_geometry + 2 * 8
    mate_head = mate_tail + MAX_RANKS * MAX_RINGS * 8
    return dict(op=0, seen=seen, send_pos=send, recv_pos=recv, self_tail=self_tail, self_head=self_head,
                area_geometry=area_geometry, mate_tail=mate_tail, mate_head=mate_head,
                bytes=mate_head + MAX_RANKS * MAX_RINGS * 8)


STATE_BYTES = state_offsets()["bytes"]


def dispatch_msg_bytes(hidden_bytes: int, num_scales: int, num_topk: int) -> int:
    """x bytes | scales | top-k ids | top-k weights | source index, padded to 16 (ht_dispatch_msg)."""
    return align16(hidden_bytes + 4 * num_scales + 12 * num_topk + 4)


def forward_msg_bytes(hidden_bytes: int, num_scales: int, num_topk: int) -> int:
    """The dispatch message plus source rank and NVL mask (ht_forward_msg_bytes): the host executor's hop-1 row."""
    return align16(hidden_bytes + 4 * num_scales + 12 * num_topk + 12)


def combine_msg_bytes(hidden: int, num_topk: int) -> int:
    """BF16 row | top-k weights, padded to 16 (ht_combine_msg_bytes)."""
    return align16(2 * hidden + 4 * num_topk)


def partial_msg_bytes(hidden: int, num_topk: int, bf16: bool = False) -> int:
    """fp32 partial row | fp32 weights, padded to 16 (ht_partial_msg_bytes): the host executor's hop-B row;
    ``bf16``: the row in BF16 (Tuning.ht_partials_bf16)."""
    return align16((2 if bf16 else 4) * hidden + 4 * num_topk)


def region_layout(region_bytes: int, num_ranks: int) -> tuple[int, MetaLayout]:
    """(bytes of the ring areas, meta records at the top) of a proxy region."""
    probe = MetaLayout(0, num_ranks)
    shared = (region_bytes - probe.bytes) // 16 * 16
    if shared <= 0:
        raise LimitExceeded("num_nvl_bytes", "bytes of the NVL buffer (the proxy region of normal mode)",
                            probe.bytes + 16, region_bytes)
    return shared, MetaLayout(shared, num_ranks)


def geometry(num_ranks: int, shared_bytes: int, timeout_s: float, msg_bytes: int, num_channels: int, config,
             phase: str, area: int = 0, areas: int = 2, ranks_per_node: int = 1) -> RingSpec:
    """Rings of this op: one per channel, in area 0 (hop 1 / hop B: the config's RDMA sizes) or
    area 1 (hop 2 / hop A: its NVL sizes) of the host layout's two; ``areas=1`` (one rank per node:
    no second hop) gives area 0 the whole shared part, so its rings are as deep as the config asks
    where half the region would cut them. With forwarding (``ranks_per_node`` > 1) an area's rings
    take rows only for the ranks its streams reach: area 0 one per node (the rank's rail peers, row =
    node), area 1 one per node mate (row = local rank)."""
    ex = SimpleNamespace(num_ranks=num_ranks, shared_bytes=shared_bytes, threads=1, timeout_s=timeout_s)
    if area == 0:
        slots, chunk = config.num_max_rdma_chunked_recv_tokens, config.num_max_rdma_chunked_send_tokens
    else:
        slots, chunk = config.num_max_nvl_chunked_recv_tokens, config.num_max_nvl_chunked_send_tokens
    G = ranks_per_node if areas == 2 else 1
    peers, peer_div = (num_ranks // G, G) if area == 0 else (G, 1)
    return ring_spec(ex, msg_bytes, num_channels, slots, chunk, phase, area=area, areas=areas, peers=peers,
                     peer_div=peer_div)


def channel_counts(in_rank: torch.Tensor, num_channels: int) -> torch.Tensor:
    """Tokens per (destination, channel) as int64 [R, C] (DeepEP's contiguous channel ranges)."""
    T, R = in_rank.shape
    per = (T + num_channels - 1) // num_channels
    if per == 0:
        return torch.zeros(R, num_channels, dtype=torch.int64, device=in_rank.device)
    padded = torch.zeros(num_channels * per, R, dtype=torch.int64, device=in_rank.device)
    padded[:T] = in_rank.to(torch.int64)
    return padded.view(num_channels, per, R).sum(1).t().contiguous()


def node_mask(in_rank: torch.Tensor, ranks_per_node: int) -> torch.Tensor:
    """Whether each token goes to each node, bool [T, N]."""
    T, R = in_rank.shape
    return in_rank.view(T, R // ranks_per_node, ranks_per_node).any(-1)


def records(num_tokens_per_rank: torch.Tensor, counts: torch.Tensor, num_tokens_per_expert: torch.Tensor,
            msg_bytes: int, node_counts: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, int]]:
    """The meta record for every destination d, int64 [R, L]:
    [my tokens per rank (R) | my tokens to d per channel (C) | my counts of d's experts (E_loc) |
     (several ranks per node) my tokens to d's node per channel (C) | message bytes]."""
    R, C = counts.shape
    E_loc = num_tokens_per_expert.numel() // R
    dev = counts.device
    parts = [num_tokens_per_rank.to(torch.int64).view(1, R).expand(R, R), counts,
             num_tokens_per_expert.to(torch.int64).view(R, E_loc)]
    cols = record_columns(R, C, E_loc, node_counts is not None)
    if node_counts is not None:
        parts.append(node_counts.repeat_interleave(R // node_counts.shape[0], dim=0))
    parts.append(torch.full((R, 1), msg_bytes, dtype=torch.int64, device=dev))
    return torch.cat(parts, dim=1).contiguous(), cols


def record_columns(R: int, C: int, E_loc: int, node_counts: bool = False) -> dict[str, int]:
    """Where the fields of a meta record start (records), and its length ``ints``; a record that does
    not fit its meta slot is refused."""
    cols = dict(channel=R, expert=R + C, node=R + C + E_loc if node_counts else -1)
    check = R + C + E_loc + (C if node_counts else 0)
    cols.update(check=check, ints=check + 1)
    if 8 * cols["ints"] > meta_slot_bytes(R):
        raise LimitExceeded("num_tokens_per_expert", "ints of the per-op meta record", cols["ints"],
                            meta_slot_bytes(R) // 8)
    return cols


class RecvLayout(SimpleNamespace):
    """Where the rows of each (source, channel) land, from the exchanged records."""


def recv_layout(meta_out: torch.Tensor, rank: int, num_channels: int, node_col: int = -1,
                ranks_per_node: int = 1) -> RecvLayout:
    """Rows by (source, channel); with ``node_col`` also the RDMA level: what this rank receives
    as its node's forwarder from each node's rail source (rank m * G + my local index)."""
    R = meta_out.shape[0]
    counts = meta_out[:, :R]                               # counts[i][j]: tokens i sends j
    recv_channel = meta_out[:, R:R + num_channels]         # from each source, per channel, to me
    recv_counts = counts[:, rank]
    recv_end = recv_counts.cumsum(0)
    starts = recv_channel.cumsum(1) - recv_channel + (recv_end - recv_counts).view(R, 1)
    lay = RecvLayout(counts=counts, recv_channel=recv_channel, recv_end=recv_end.to(torch.int32),
                     recv_prefix=starts.to(torch.int32), recv_count=recv_channel.to(torch.int32))
    if node_col >= 0:
        rails = torch.arange(rank % ranks_per_node, R, ranks_per_node, device=meta_out.device)
        rdma = meta_out[rails, node_col:node_col + num_channels]   # [N, C]
        rdma_end = rdma.sum(1).cumsum(0)
        lay.rdma_count = rdma.to(torch.int32)
        lay.rdma_end = rdma_end.to(torch.int32)
        lay.rdma_prefix = (rdma.cumsum(1) - rdma + (rdma_end - rdma.sum(1)).view(-1, 1)).to(torch.int32)
    return lay


def send_head(in_rank: torch.Tensor) -> torch.Tensor:
    """head[t][j] = index of token t among the tokens sent to j, or -1 (int32 [T, R])."""
    idx = in_rank.to(torch.int32).cumsum(0, dtype=torch.int32) - 1
    return torch.where(in_rank, idx, torch.full_like(idx, -1))


def intranode_handle(lay: RecvLayout, send_prefix: torch.Tensor, recv_src_idx: torch.Tensor, in_rank: torch.Tensor,
                     head: torch.Tensor) -> tuple:
    """DeepEP's 6-tuple (one node, every rank reached through the proxy): the host reference of
    ht/proxy/plan.cu (the engine computes it there; the CPU emulator runs this)."""
    return (lay.counts.cumsum(0).to(torch.int32), send_prefix, lay.recv_prefix, recv_src_idx, in_rank, head)


def internode_handle(lay: RecvLayout, send_prefix: torch.Tensor, in_rank: torch.Tensor, head: torch.Tensor,
                     num_rows: int) -> tuple:
    """DeepEP's 10-tuple for one rank per node (node n = rank n): the RDMA-level matrices equal the
    rank-level ones, a token's only local rank is 0 (mask 1), and send_nvl_head is the row index.
    The host reference of ht/proxy/plan.cu (the engine computes it there; the CPU emulator runs this).

    recv_src_meta rows = (source node: int32, NVL mask: int32), zero past the real rows; with
    num_worst_tokens send_nvl_head has that many rows (DeepEP's shape), -1 past the real ones."""
    dev = in_rank.device
    total = lay.recv_end[-1] if lay.recv_end.numel() else torch.zeros((), dtype=torch.int32, device=dev)
    rows = torch.arange(num_rows, dtype=torch.int32, device=dev)
    valid = rows < total
    src = torch.searchsorted(lay.recv_end, rows, right=True).to(torch.int32)
    meta = torch.zeros(num_rows, 2, dtype=torch.int32, device=dev)
    meta[:, 0] = torch.where(valid, src, torch.zeros_like(src))
    meta[:, 1] = valid.to(torch.int32)
    recv_src_meta = meta.view(torch.uint8).view(num_rows, 8)
    nvl_head = torch.where(valid, rows, torch.full_like(rows, -1)).view(num_rows, 1)
    recv_rdma_prefix = lay.recv_channel.cumsum(1).to(torch.int32)
    return (in_rank, send_prefix.clone(), send_prefix, recv_rdma_prefix, lay.recv_end.clone(), lay.recv_prefix,
            lay.recv_end, recv_src_meta, head, nvl_head)


def forward_handle(lay: RecvLayout, send_prefix: torch.Tensor, node_send_prefix: torch.Tensor, in_rank: torch.Tensor,
                   send_rdma_head: torch.Tensor, recv_mask: torch.Tensor, rdma_mask: torch.Tensor, rank: int,
                   ranks_per_node: int, num_rows: int, rdma_rows: int) -> tuple:
    """DeepEP's 10-tuple with several ranks per node, from the exchanged records and the masks the
    kernels recorded (recv_mask per received row, rdma_mask per token received as forwarder, in
    (source node, token) order); num_worst_tokens pads recv_src_meta and send_nvl_head (-1).
    The host reference of ht/proxy/plan.cu ht_proxy_forward_handle (the engine computes it there; the
    CPU emulator runs this)."""
    dev, G = in_rank.device, ranks_per_node
    rows = torch.arange(num_rows, dtype=torch.int32, device=dev)
    valid = rows < lay.recv_end[-1]
    src = torch.searchsorted(lay.recv_end, rows, right=True).to(torch.int32)
    meta = torch.zeros(num_rows, 2, dtype=torch.int32, device=dev)
    meta[:, 0] = torch.where(valid, src // G, torch.zeros_like(src))
    meta[:, 1] = torch.where(valid, recv_mask[:num_rows], torch.zeros_like(src))
    recv_src_meta = meta.view(torch.uint8).view(num_rows, 8)
    # send_nvl_head[k][g]: row at local rank g of the k-th token received as forwarder, or -1:
    # (tokens of earlier sources at g) + (this token's index among its source's tokens with bit g).
    k = torch.arange(rdma_rows, dtype=torch.int32, device=dev)
    ok = (k < lay.rdma_end[-1]).view(-1, 1)
    seg = torch.searchsorted(lay.rdma_end, k, right=True).clamp(max=lay.rdma_end.numel() - 1)  # source node
    bits = ((rdma_mask[:rdma_rows].view(-1, 1) >> torch.arange(G, device=dev).view(1, -1)) & 1).to(torch.int64)
    bits = torch.where(ok, bits, torch.zeros_like(bits))
    cum = torch.cat([torch.zeros(1, G, dtype=torch.int64, device=dev), bits.cumsum(0)])  # cum[i]: rows < i
    seg_start = (lay.rdma_end - lay.rdma_count.sum(1)).to(torch.int64)
    within = cum[1:] - cum[seg_start[seg]]                 # inclusive count within the source's rows
    col_prefix = lay.counts.cumsum(0) - lay.counts          # [R, R]: tokens of earlier sources
    dsts = (rank // G) * G + torch.arange(G, device=dev)
    base = col_prefix[seg * G + rank % G][:, dsts]          # rows of earlier sources at each local rank
    nvl_head = torch.where((bits == 1) & ok, within - 1 + base, torch.full_like(within, -1)).to(torch.int32)
    recv_rdma_prefix = lay.rdma_count.to(torch.int64).cumsum(1).to(torch.int32)
    rdma_rank_prefix = lay.rdma_end.clone()
    return (in_rank, node_send_prefix, send_prefix, recv_rdma_prefix, rdma_rank_prefix, lay.recv_prefix, lay.recv_end,
            recv_src_meta, send_rdma_head, nvl_head)


def check_scales(x_scales) -> None:
    if x_scales is not None and x_scales.element_size() != 4:
        raise InvalidArgument("x[1]", "4-byte scales (float32 or packed int32)", str(x_scales.dtype))


class ProxyNormalPlan:
    """What a dispatch fixed, for cached dispatch and combine (``recv_counts`` only when known)."""

    def __init__(self, **kw) -> None:
        counts = kw.pop("recv_counts", None)
        self.__dict__.update(kw)
        if counts is not None:
            self.recv_counts = counts
