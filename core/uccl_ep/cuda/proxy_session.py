"""The cuda executor's proxy session: one proxy per Buffer for every engine that goes through it
(low-latency mode, ll_proxy.ProxyLowLatencyEngine; normal mode, ht_proxy.ProxyNormalEngine).

The executor opens it in its constructor when any engine will need it (the bootstrap is
collective); the engines receive it and start nothing themselves. What it owns, once:
- the proxy (uccl_ep/proxy/session.py): bootstrap, transport endpoints, threads, shrink exclusions;
- its region: the buffer of the one engine that needs it, or, when both do, one allocation holding
  the NVL buffer at offset 0 (normal mode addresses the region from its base) and the low-latency
  buffer above it (shared_region; the low-latency engine adds `region_offset` to its Writes);
- the FIFOs and counters registered with the driver and mapped for the kernels (the FIFO table and
  its producer words: every kernel that pushes to FIFO f shares one head);
- with the ipc transport's "kernel" copies, the proxy threads' copy rings, registered once.

Counters (per source): normal mode [0, LL_COUNTER_BASE) -- ring TAIL(r) (ordered counters, which
the immediate carries below 1024), HEAD 512 + r, META 1024 + parity; low-latency mode
[LL_COUNTER_BASE, NUM_COUNTERS), one counter per (buffer set, phase). The low-latency clean zeroes
its range only: normal mode's counters keep growing across ops.

Copy rings: each ring has one consumer at a time, the copy work of the engine whose kernels run
(transport/copy_ring.cu, or the copy role of the normal-mode kernels, device/ht_dma.cuh). Each keeps its
ring position in device memory; its own byte count stays its own (only its senders add to it).
Before a consumer's launch, `claim_copy_rings` puts copy_ring_handover (transport/copy_ring.cu) on the
stream: where the other consumer's position is ahead, this one's jumps to it. Every earlier launch
on the stream has completed by then and drained the rings up to its position, so the one ahead is
the ring's. Hence the modes' ops must be ordered on the device (one stream, or events), as DeepEP's
modes sharing one RDMA buffer must be.
"""

from __future__ import annotations

import struct

from .. import env
from ..config import NUM_MAX_LOCAL_EXPERTS
from ..proxy.session import ProxySession
from .runtime import DeviceMemory, load_kernel, pack_params, raw_tensor

__all__ = ["GpuProxySession", "RegionView", "shared_region", "LL_COUNTER_BASE", "NUM_COUNTERS", "FIFOS_PER_THREAD",
           "open_for", "warn_lazy_module_loading"]

LL_COUNTER_BASE = 2048
NUM_COUNTERS = LL_COUNTER_BASE + 4 * NUM_MAX_LOCAL_EXPERTS
FIFOS_PER_THREAD = 2
_PAGE = 4096


_LOADING_WARNED = False


def warn_lazy_module_loading(rank: int) -> None:
    """Warn once per process when CUDA loads kernels lazily while a same-host proxy path is in use.

    NOTES: with the ipc transport the proxy thread itself calls CUDA (peer copies, events). Lazy
    module loading makes the host's first launch of any not-yet-loaded kernel (a torch op between
    our send and receive kernels, say) wait for the device, while holding the context: the proxy's
    next CUDA call then waits behind it, and the device waits for the proxy -- every op stalls
    until the bounded device wait gives up (docs/troubleshooting.md).
    """
    import os
    import warnings
    global _LOADING_WARNED
    if _LOADING_WARNED or os.environ.get("CUDA_MODULE_LOADING", "LAZY").upper() == "EAGER":
        return
    _LOADING_WARNED = True
    warnings.warn(f"uccl_ep rank {rank}: the proxy path between GPUs of one host (ipc transport) needs "
                  "CUDA_MODULE_LOADING=EAGER in the environment before CUDA starts; with lazy loading the first "
                  "launch of a new kernel while an op is in flight stalls it until the device timeout "
                  "(docs/troubleshooting.md)", RuntimeWarning, stacklevel=3)


class RegionView:
    """A part of the session's region standing for one engine's buffer (``ptr``, ``nbytes``,
    ``tensor()``, IPC handles, ``free()``); the region itself is freed once, by its owner."""

    def __init__(self, region: DeviceMemory, offset: int, nbytes: int) -> None:
        self.region, self.offset, self.nbytes = region, offset, nbytes
        self.device = region.device

    @property
    def ptr(self) -> int:
        return self.region.ptr + self.offset if self.region.ptr else 0

    def ipc_handle(self) -> bytes:
        """The region's handle and this part's offset in it (a peer's may differ from ours)."""
        return self.region.ipc_handle() + struct.pack("<Q", self.offset)

    def open_peer(self, handle: bytes) -> int:
        """A peer's part, mapped here (its region is closed with ours)."""
        return self.region.open_peer(handle[:-8]) + struct.unpack("<Q", handle[-8:])[0]

    def tensor(self):
        return raw_tensor(self.ptr, self.nbytes, self.device, self)

    def free(self) -> None:  # the region is the owner's to free
        pass


def shared_region(device: int, nvl_bytes: int, ll_bytes: int):
    """(region, NVL view at 0, low-latency view above it): one allocation for both buffers.
    NOTES: one region because the proxy registers one (one key per peer; a command carries offsets
    into it, protocol.h); normal mode's kernels address it from its base, so the NVL buffer comes first."""
    off = (nvl_bytes + _PAGE - 1) // _PAGE * _PAGE
    region = DeviceMemory(device, off + ll_bytes)
    return region, RegionView(region, 0, nvl_bytes), RegionView(region, off, ll_bytes)


def open_for(ec, need_ht: bool, need_ll: bool):
    """The Buffer's session over the region the engines that need it use (None when none does).
    Collective: every rank calls it in the executor's constructor with the same answers."""
    if not (need_ht or need_ll):
        return None
    from . import gpu_transport
    region = ec.region
    if region is None:
        region = ec.nvl_mem if need_ht else ec.ll_mem
    return GpuProxySession(ec, region, gpu_transport.choose(ec.multi_host))


class GpuProxySession(ProxySession):
    """The proxy of one Buffer and its device mappings (see the module doc)."""

    def __init__(self, ec, region, transport: str) -> None:
        from ..proxy import native
        ctx = ec.ctx
        self.dev, self.drv = ec.device, ec.drv
        self.region_ptr, self.region_bytes = region.ptr, region.nbytes
        self.transport = transport
        # ipc between GPUs of one host: Writes are copied by GPU copy work from the proxy threads'
        # descriptor rings (dma_ring.h) unless UCCL_EP_IPC_COPY=cuda (the proxy's driver copies).
        self.copy_kernel = transport == "ipc" and env.get("UCCL_EP_IPC_COPY") == "kernel"
        if transport == "ipc" and not self.copy_kernel:
            warn_lazy_module_loading(ctx.rank)
        threads = int(ctx.options.get("num_proxy_threads") or env.get("UCCL_EP_NUM_PROXY_THREADS"))
        self.C = native()
        self._registered: list[int] = []
        self._ring_bases: list[int] = []
        self.ring_dev: list[int] = []
        self.fifo_words = self.fifo_table = None
        self._consumers: dict[str, tuple[int, int, tuple[int, int, int]]] = {}
        self._handover_params: dict[str, list[bytes]] = {}  # per consumer, packed once (claim_copy_rings)
        self._handover = None
        super().__init__(ctx.group, rank=ctx.rank, num_ranks=ctx.num_ranks, num_counters=NUM_COUNTERS,
                         enable_shrink=bool(getattr(ctx, "enable_shrink", False)), region_bytes=region.nbytes,
                         transport=transport, num_threads=threads, fifos_per_thread=FIFOS_PER_THREAD,
                         timeout_s=ctx.timeout_s, ranks_per_node=ctx.topology.ranks_per_node,
                         external_region=region.ptr, ipc_copy="kernel" if self.copy_kernel else "")
        try:
            self.region_dev = self.C.proxy_region_address(self.proxy)
            self._map_fifos()
            if self.copy_kernel:
                self._map_copy_rings()
        except BaseException:
            self.close()
            raise

    # -- proxy memory as the kernels see it -----------------------------------------------------
    def _register(self, start: int, end: int) -> int:
        """Register the pages of [start, end) for the device; returns the device address of start."""
        base = start // _PAGE * _PAGE
        self.drv.host_register(self.dev, base, (end - base + _PAGE - 1) // _PAGE * _PAGE)
        self._registered.append(base)
        return self.drv.host_device_pointer(self.dev, start)

    def _map_fifos(self) -> None:
        C, drv, p = self.C, self.drv, self.proxy
        nf = p.num_fifos
        self.num_fifos = nf
        self.num_proxy_threads = nf // FIFOS_PER_THREAD
        # Producer words: head and cached tail of every FIFO, one cache line each.
        self.fifo_words = DeviceMemory(self.dev, 128 * nf)
        drv.memset_d8(self.dev, self.fifo_words.ptr, 0, 128 * nf, 0)
        table = []
        for f in range(nf):
            lay = C.proxy_fifo_layout(p, f)
            parts = [lay[k] for k in ("slots", "head", "tail", "tail_cache", "completed", "status")]
            self._register(min(parts), lay["slots_end"])
            dev = {k: drv.host_device_pointer(self.dev, lay[k]) for k in ("slots", "tail", "completed", "status")}
            table.append(C.pack_fifo_layout(dev["slots"], self.fifo_words.ptr + 128 * f, dev["tail"],
                                            self.fifo_words.ptr + 128 * f + 64, dev["completed"], dev["status"],
                                            lay["capacity"], lay["capacity_log2"]))
            if f == 0:
                self.status_dev = dev["status"]
        blob = b"".join(table)
        self.fifo_table = DeviceMemory(self.dev, len(blob))
        drv.memcpy_htod(self.dev, self.fifo_table.ptr, blob)
        addr, nbytes = C.proxy_counters_address(p)
        self.counters_dev = self._register(addr, addr + nbytes)

    def _map_copy_rings(self) -> None:
        rings = self.proxy.copy_rings()
        if len(rings) != self.num_proxy_threads or any(r is None for r in rings):
            raise RuntimeError(f"rank {self.rank}: the ipc transport did not create its copy rings "
                               f"({self.proxy.transport_name})")
        self.ring_capacity = rings[0]["capacity"]
        self.ring_dev = [self._register(r["memory"], r["memory"] + r["memory_bytes"]) for r in rings]
        self._ring_bases = self._registered[-len(rings):]

    def fifo_table_bytes(self) -> bytes:  # diagnostics: the packed FifoLayout table the kernels read
        return self.drv.memcpy_dtoh(self.dev, self.fifo_table.ptr, self.num_fifos * self.C.FIFO_LAYOUT_BYTES)

    # -- copy rings: one consumer at a time ------------------------------------------------------
    def add_ring_consumer(self, name: str, state: int, stride_words: int, words: tuple[int, ...]) -> None:
        """An engine's copy work over the rings: its ring position of ring 0 at ``state`` (device
        memory, u64; ring g's ``stride_words`` u64 further), and the words (u64 offsets from there)
        that take the ring position when it takes the rings over (copy_ring_handover)."""
        if not self.copy_kernel or not 1 <= len(words) <= 3:
            raise ValueError(f"{name}: copy-ring consumers need the ipc transport's kernel copies and 1-3 words")
        self._consumers[name] = (int(state), int(stride_words), tuple(words) + (-1,) * (3 - len(words)))
        self._handover_params.clear()
        if len(self._consumers) > 1 and self._handover is None:
            # loaded with the second consumer (in the executor's constructor), never during a capture
            self._handover = load_kernel(self.dev, "transport/copy_ring.cu", "copy_ring_handover")

    def claim_copy_rings(self, name: str, stream: int) -> None:
        """Before a launch whose copy work consumes the rings (see the module doc): with another
        consumer on the session, the hand-over kernel on `stream` first.
        NOTES: launched every time, not only when the host saw the other engine run last: a CUDA
        graph replays what it captured whatever ran eagerly in between, and the kernel is a no-op
        when this consumer is ahead."""
        packed = self._handover_params.get(name)
        if packed is None:
            own, packed = self._consumers.get(name), []
            for other, (o_state, o_stride, _) in self._consumers.items():
                if other == name or own is None:
                    continue
                state, stride, words = own
                packed.append(pack_params("CopyRingHandoverParams", own=state, other=o_state, own_stride=stride,
                                          other_stride=o_stride, word0=words[0], word1=words[1], word2=words[2],
                                          num_rings=len(self.ring_dev)))
            self._handover_params[name] = packed
        for params in packed:
            self._handover.launch(1, 64, params, stream)

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the proxy (before the region it copies from/into is freed) and release the mappings;
        once (later calls do nothing). The engines' own memory is theirs to free."""
        if self.closed:
            return
        import torch
        try:
            torch.cuda.synchronize(self.dev)
        except RuntimeError:  # a failed context: still stop the proxy and release what we can
            pass
        first = None
        # NOTES: the copy rings go with their transport endpoints when the proxy stops (the ipc
        # transport drops its copy engine at shutdown), so their pages are unregistered first; the
        # FIFOs and counters live as long as the proxy object.
        for base in self._ring_bases:
            try:
                self.drv.host_unregister(self.dev, base)
            except Exception as e:  # noqa: BLE001 - the rest is released all the same
                first = first or e
        try:
            super().close()
        except Exception as e:  # noqa: BLE001
            first = first or e
        for base in self._registered:
            if base not in self._ring_bases:
                try:
                    self.drv.host_unregister(self.dev, base)
                except Exception as e:  # noqa: BLE001
                    first = first or e
        self._registered.clear()
        self._ring_bases = []
        for m in (self.fifo_words, self.fifo_table):
            if m is not None:
                m.free()
        self.fifo_words = self.fifo_table = None
        if first is not None:
            raise first
