"""Pieces shared by the intranode and internode high-throughput protocols on host threads:
the per-op meta handshake, stream tables, and message packing (ring sizing: uccl_ep.protocol.rings)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import InvalidArgument, LimitExceeded
from ..protocol.layout import META_COUNTER, META_MAX_CHANNELS, align16
from ..protocol.packing import pack_rows, row_bytes
from ..protocol.rings import RingSpec
from ..routing import channel_ranges

__all__ = ["exchange_meta", "host_rings", "token_rings", "Streams", "pack_table", "specs_width",
           "run_phase", "plain"]

_MAX_HOST_RINGS = 8


def exchange_meta(ex, parity: int, per_dst: np.ndarray | None, phase: str) -> np.ndarray | None:
    """Every rank sends every rank (itself included) a row of int64 (``per_dst[d]``) and gets
    theirs: [R, L] by source. With ``per_dst=None`` it is only a handshake (a count signal with no
    write): every peer has started this op, hence finished reading its rings of the previous one."""
    R, me, C = ex.num_ranks, ex.rank, ex.C
    counter = META_COUNTER[parity]
    dsts = np.arange(R, dtype=np.int32)
    if per_dst is not None:
        per_dst = np.ascontiguousarray(per_dst, dtype=np.int64)
        nbytes = per_dst.shape[1] * 8
        if nbytes > ex.meta.slot:
            raise LimitExceeded("num_channels", "bytes of the per-op meta record", nbytes, ex.meta.slot)
        send_offs = np.array([ex.meta.send(parity, d) for d in range(R)], dtype=np.int64)
        for d in range(R):
            ex.region[send_offs[d]:send_offs[d] + nbytes] = torch.from_numpy(per_dst[d].view(np.uint8))
        C.push_counted(ex.proxy, dsts, send_offs, np.full(R, ex.meta.recv(parity, me), dtype=np.int64),
                       np.full(R, counter, dtype=np.int32), nbytes, dsts, np.full(R, counter, dtype=np.int32),
                       np.full(R, 2, dtype=np.int32), np.ones(R, dtype=np.uint8), 1, ex.timeout_s)
        step = 2  # one write, then its fence: count 1 -> signal 2
    else:
        empty = np.zeros(0, dtype=np.int64)
        C.push_counted(ex.proxy, empty.astype(np.int32), empty, empty, empty.astype(np.int32), 0, dsts,
                       np.full(R, counter, dtype=np.int32), np.ones(R, dtype=np.int32), np.ones(R, dtype=np.uint8), 1,
                       ex.timeout_s)
        step = 1  # a fence over no writes
    target = ex.seen[:, counter] + step
    C.wait_counters(ex.proxy, dsts, np.full(R, counter, dtype=np.int32), target, ex.timeout_s, phase)
    ex.seen[:, counter] = target
    if per_dst is None:
        return None
    out = np.empty((R, per_dst.shape[1]), dtype=np.int64)
    for s in range(R):
        off = ex.meta.recv(parity, s)
        out[s] = ex.region[off:off + nbytes].numpy().view(np.int64)
    return out


def host_rings(ex, num_channels: int) -> int:
    if num_channels > META_MAX_CHANNELS:
        raise LimitExceeded("config.num_sms", "channels of the host executor (num_sms / 2)", num_channels,
                            META_MAX_CHANNELS)
    return max(1, min(num_channels, _MAX_HOST_RINGS, 2 * ex.threads))


def token_rings(num_tokens: int, num_channels: int, rings: int) -> torch.Tensor:
    """Ring of every token: its DeepEP channel (contiguous ranges) modulo the host rings."""
    ring = torch.zeros(num_tokens, dtype=torch.int64)
    for c, (s, e) in enumerate(channel_ranges(num_tokens, num_channels)):
        ring[s:e] = c % rings
    return ring


@dataclass
class Streams:
    """Send and receive streams of one ring phase, as the arrays RingEngine.run_phase takes."""

    send_dst: list = field(default_factory=list)
    send_ring: list = field(default_factory=list)
    send_rows: list = field(default_factory=list)
    recv_src: list = field(default_factory=list)
    recv_ring: list = field(default_factory=list)
    recv_count: list = field(default_factory=list)

    def send(self, dst: int, ring: int, rows: torch.Tensor) -> None:
        if rows.numel():
            self.send_dst.append(dst)
            self.send_ring.append(ring)
            self.send_rows.append(rows.to(torch.int64))

    def recv(self, src: int, ring: int, count: int) -> None:
        if count:
            self.recv_src.append(src)
            self.recv_ring.append(ring)
            self.recv_count.append(int(count))

    @property
    def recv_rows(self) -> int:
        return int(sum(self.recv_count))

    def recv_offsets(self) -> np.ndarray:
        counts = np.asarray(self.recv_count, dtype=np.int64)
        return np.cumsum(counts) - counts

    def arrays(self):
        counts = np.array([r.numel() for r in self.send_rows], dtype=np.int64)
        starts = np.cumsum(counts) - counts
        rows = torch.cat(self.send_rows).numpy() if self.send_rows else np.zeros(0, np.int64)
        return (np.asarray(self.send_dst, np.int32), np.asarray(self.send_ring, np.int32), starts, counts,
                np.ascontiguousarray(rows, dtype=np.int64), np.asarray(self.recv_src, np.int32),
                np.asarray(self.recv_ring, np.int32), self.recv_offsets(), np.asarray(self.recv_count, np.int64))


def specs_width(specs) -> int:
    return sum(row_bytes(d, s) for d, s in specs)


def plain(t: torch.Tensor) -> torch.Tensor:
    """`t` with row-major strides. NOTES: a column-major [T, 1] (or empty) tensor counts as
    contiguous yet can have stride(-1) != 1, which byte views refuse."""
    return t if t.stride(-1) == 1 and t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype).copy_(t)


def pack_table(cols: list[torch.Tensor], num_rows: int) -> tuple[torch.Tensor, int]:
    """Rows of `cols` packed into uint8 [num_rows, msg] with msg a multiple of 16."""
    if cols:
        packed = pack_rows([plain(c) for c in cols])
    else:
        packed = torch.zeros(num_rows, 0, dtype=torch.uint8)
    width = packed.shape[1]
    msg = max(16, align16(width))
    table = torch.zeros(num_rows, msg, dtype=torch.uint8)
    table[:, :width] = packed
    return table, msg


def run_phase(ex, spec: RingSpec, table: torch.Tensor, streams: Streams, phase: str) -> torch.Tensor:
    """Moves the streams; returns the received rows [recv_rows, msg] in stream order."""
    if table.shape[1] != spec.msg_bytes:
        raise InvalidArgument("table", f"rows of {spec.msg_bytes} bytes", table.shape[1])
    out = torch.empty(streams.recv_rows, spec.msg_bytes, dtype=torch.uint8)
    ex.engine.run_phase(spec.as_dict(phase), table.numpy(), out.numpy(), *streams.arrays())
    return out
