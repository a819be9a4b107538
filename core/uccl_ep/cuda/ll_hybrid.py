"""Hybrid low-latency paths of the CUDA executor: the peers of a rank's node over NVLink, the other
nodes through the CPU proxy (as DeepEP, UCCL-EP and pplx-garden do).

Which path a peer takes (``ll_peer_paths``), for a Buffer whose low-latency mode goes through the
proxy (cuda/executor.py, ``plan_paths``: forced, ranks on several hosts, or nodes of
``ranks_per_node`` < the group, e.g. 4 GPUs of one host as 2 nodes x 2):
- forced (``UCCL_EP_FORCE_PROXY``, ``allow_nvlink_for_low_latency_mode=False``): every peer through
  the proxy (DeepEP's meaning of the flag);
- otherwise the ranks of the rank's own node (``Topology.node_of``; a node never spans hosts, which
  plan_paths checks) over NVLink, every other rank through the proxy.

The proxy-path kernels (ll/proxy/dispatch.cu, ll/proxy/combine.cu) serve both: an NVLink peer's
packed region, the same format the proxy would carry, is stored by the send kernel straight into the
peer's recv area through its CUDA IPC mapping (opened by the executor for the node's peers only), and
signalled by a system-scope add to the peer's NVLink word for this rank instead of the proxy's signal
pair; the receive kernels wait for the same target on that word (device/proxy_ll.cuh). The words,
u64 [2 sets][2 phases][R], sit in every rank's LL buffer right after the two buffer sets
(``signal_off``), zeroed with the proxy's counters at every clean.

Tested on CPU (the plan: core/tests/cpu/test_ll_hybrid_paths.py) and on 4 GPUs as 2 nodes x 2
(core/tests/gpu/test_cuda_ll_hybrid.py, against uccl_ep.refs).
"""

from __future__ import annotations

import struct

from ..errors import LimitExceeded
from .runtime import DeviceMemory

__all__ = ["SELF", "NVLINK", "PROXY", "ll_peer_paths", "HybridPeers"]

SELF, NVLINK, PROXY = "self", "nvlink", "proxy"


def ll_peer_paths(rank: int, num_ranks: int, ranks_per_node: int, ll_proxy: bool, forced: bool) -> tuple[str, ...]:
    """The path of rank ``rank``'s low-latency traffic to each rank of the group: SELF, NVLINK or
    PROXY. ``ll_proxy``: the Buffer's LL goes through the proxy kernels (plan_paths); ``forced``: the
    proxy is forced for every peer."""
    node = rank // ranks_per_node

    def path(j: int) -> str:
        if j == rank:
            return SELF
        if not ll_proxy:
            return NVLINK
        return NVLINK if not forced and j // ranks_per_node == node else PROXY

    return tuple(path(j) for j in range(num_ranks))


class HybridPeers:
    """The NVLink side of the proxy-path LL engine: the NVLink peers' bit mask, a device table of their
    mapped LL buffers (u64 [R], 0 for the others) and the signal words' offsets."""

    def __init__(self, dev: int, drv, paths: tuple[str, ...], peer_base: list[int]) -> None:
        self.dev, self.drv, self.R = dev, drv, len(paths)
        self.peers = tuple(j for j, p in enumerate(paths) if p == NVLINK)
        self.mask = sum(1 << j for j in self.peers)
        self.table: DeviceMemory | None = None
        if self.peers:
            bases = [peer_base[j] if j in self.peers else 0 for j in range(self.R)]
            self.table = DeviceMemory(dev, 8 * self.R)
            drv.memcpy_htod(dev, self.table.ptr, struct.pack(f"<{self.R}Q", *bases))

    @property
    def signal_bytes(self) -> int:
        return 4 * 8 * self.R if self.peers else 0

    def signal_off(self, lay, s: int, phase: int) -> int:
        """Byte offset, in every rank's LL buffer, of the NVLink words of (set, phase): after both sets."""
        return 2 * lay.set_bytes + (2 * s + phase) * 8 * self.R

    def check_fits(self, lay, nbytes: int) -> None:
        if 2 * lay.set_bytes + self.signal_bytes > nbytes:
            raise LimitExceeded("num_rdma_bytes", f"bytes of the hybrid low-latency buffer ({lay.num_max} tokens, hidden "
                                f"{lay.hidden}, {lay.num_experts} experts, NVLink signal words of {self.R} ranks)",
                                2 * lay.set_bytes + self.signal_bytes, nbytes,
                                hint="build the Buffer with num_rdma_bytes = Buffer.get_low_latency_rdma_size_hint(...)")

    def clean(self, mem: DeviceMemory, lay) -> None:
        """Zero this rank's NVLink words (between the clean's barriers: no peer signals meanwhile)."""
        if self.peers:
            self.drv.memset_d8(self.dev, mem.ptr + self.signal_off(lay, 0, 0), 0, self.signal_bytes, 0)

    def send_fields(self, lay, s: int, phase: int) -> dict:
        """peer_ll, nvl_peers, nvl_signal_off of an LLProxy*Params send struct (kernel_abi.h)."""
        if not self.peers:
            return dict(peer_ll=0, nvl_peers=0, nvl_signal_off=0)
        return dict(peer_ll=self.table.ptr, nvl_peers=self.mask, nvl_signal_off=self.signal_off(lay, s, phase))

    def recv_fields(self, mem: DeviceMemory, lay, s: int, phase: int) -> dict:
        """nvl_peers, nvl_signal of an LLProxy*RecvParams struct."""
        if not self.peers:
            return dict(nvl_peers=0, nvl_signal=0)
        return dict(nvl_peers=self.mask, nvl_signal=mem.ptr + self.signal_off(lay, s, phase))

    def free(self) -> None:
        if self.table is not None:
            self.table.free()
            self.table = None
