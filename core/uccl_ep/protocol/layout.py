"""Counter indices and the region's areas of the proxy protocol: where the host executor keeps
things, and the layout the cuda executor's normal mode through the proxy shares with it
(cuda/ht_proxy_plan.py).

Counters (per source rank, see csrc/executor/ring_engine.h for the ring part):
    [0, 512)            ring TAIL(r): ordered writes of HT streams (sequence-applied)
    [512, 1024)         ring HEAD(r): credits returned by the receiver of ring r
    1024, 1025          META(parity): HT op handshake (parity = op count % 2)
    [1026, 1030)        LL_CTRL(set, phase): per-op LL control signal (num_max, "I mask you")
    1030                LL_SYNC: shrink mode's barrier (clean_low_latency_buffer, destroy)
    [1088, +4*1024)     LL(set, phase, local expert): fenced count signals

Region (per rank):
    [0, shared)                         shared by the LL slabs and the HT rings (one op at a time;
                                        DeepEP's rule: clean_low_latency_buffer after normal ops)
    [shared, shared + meta)             HT meta slots [parity][source], never touched by LL
"""

from __future__ import annotations

__all__ = ["align16", "RING_HEAD_BASE", "MAX_RINGS", "META_COUNTER", "LL_CTRL_BASE", "LL_COUNTER_BASE",
           "LL_MAX_LOCAL_EXPERTS", "LL_SYNC_COUNTER", "NUM_COUNTERS", "ll_counter", "ll_ctrl_counter", "meta_slot_bytes", "MetaLayout",
           "region_plan"]

MAX_RINGS = 512
RING_HEAD_BASE = 512
META_COUNTER = (1024, 1025)
LL_CTRL_BASE = 1026
LL_SYNC_COUNTER = 1030
LL_COUNTER_BASE = 1088
LL_MAX_LOCAL_EXPERTS = 1024
NUM_COUNTERS = LL_COUNTER_BASE + 4 * LL_MAX_LOCAL_EXPERTS
#: channels of a normal-mode op the meta slot has room for
META_MAX_CHANNELS = 256

_MIN_SHARED = 8 << 20
_MAX_SHARED = 1 << 30


def align16(n: int) -> int:
    return (n + 15) // 16 * 16


def ll_counter(set_idx: int, phase: int, local_expert: int) -> int:
    """Counter of LL buffer set `set_idx`, phase 0 (dispatch) / 1 (combine), local expert."""
    return LL_COUNTER_BASE + (set_idx * 2 + phase) * LL_MAX_LOCAL_EXPERTS + local_expert


def ll_ctrl_counter(set_idx: int, phase: int) -> int:
    return LL_CTRL_BASE + set_idx * 2 + phase


def meta_slot_bytes(num_ranks: int) -> int:
    """Bytes of one HT meta record: int64 counts (host/ht_common.py `exchange_meta`) for the largest op."""
    return align16(8 * (num_ranks + 3 * META_MAX_CHANNELS + LL_MAX_LOCAL_EXPERTS + 8))


class MetaLayout:
    """Meta slots at the top of the region: received records [parity][source], then the records
    this rank sends [parity][destination] (a parity's slots are reused two ops later, when every
    peer has long consumed them: an op starts only after every peer's record of that op)."""

    def __init__(self, base: int, num_ranks: int) -> None:
        self.base = base
        self.slot = meta_slot_bytes(num_ranks)
        self.num_ranks = num_ranks

    @property
    def bytes(self) -> int:
        return 4 * self.num_ranks * self.slot

    def recv(self, parity: int, src: int) -> int:
        return self.base + (parity * self.num_ranks + src) * self.slot

    def send(self, parity: int, dst: int) -> int:
        return self.base + ((2 + parity) * self.num_ranks + dst) * self.slot


def region_plan(num_ranks: int, num_nvl_bytes: int, num_rdma_bytes: int) -> tuple[int, MetaLayout]:
    """(shared bytes, meta layout) for a Buffer of these sizes.

    The shared area holds the whole LL layout (at most ``num_rdma_bytes``, which Buffer checks
    against DeepEP's hint) and as much of the HT rings as fits; HT ops size their rings to it.
    """
    shared = max(num_rdma_bytes, min(2 * (num_nvl_bytes + num_rdma_bytes), _MAX_SHARED), _MIN_SHARED)
    shared = align16(shared)
    return shared, MetaLayout(shared, num_ranks)
