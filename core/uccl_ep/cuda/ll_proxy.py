"""Low-latency mode of the CUDA executor through the CPU proxy: GPU -> queue -> proxy ->
transport -> proxy -> counter (ARCHITECTURE.md, "Data path, one LL dispatch").

Used instead of the NVLink-direct kernels when ``UCCL_EP_FORCE_PROXY=1`` or the Buffer is built
with ``allow_nvlink_for_low_latency_mode=False`` (DeepEP's meaning: LL traffic goes through the
network path even between GPUs of one host), or between nodes, the node's own peers then over NVLink
(hybrid, ll_hybrid.py). On one host the transport is ``ipc``: the sending
proxy copies into the receiver's LL buffer (CUDA IPC) and then hands the immediate to the
receiving proxy, exactly like an RDMA write with immediate, so two GPUs act as two nodes.

Set-up: the Buffer's proxy session (proxy_session.py, opened by the executor, shared with normal
mode through the proxy) registers this rank's LL buffer (device memory; above the NVL buffer in one
region when both modes use the proxy: the Writes' offsets add ``region_offset``) and maps the FIFOs
and receive counters for the device; this engine's counters are the session's low-latency range.
Kernels: ll/proxy/dispatch.cu, ll/proxy/combine.cu.

Layout of one buffer set (two alternate; see kernel_abi.h "through the CPU proxy"):
  send  [R] packed regions (dispatch: header, per-expert counts, slots naming token and row, one
        row per token; combine: rows), or in zero-copy combine the [E_loc][R*T][H] bf16 buffer of
        get_next_low_latency_combine_buffer
  recv  [R] packed regions, one per peer
The rank's own region is staged in the send area and read there by its receive kernel: it never
goes through the proxy (no NIC would carry it), except in zero-copy combine, which stages nothing.
Counters per source: one per (set, phase), counter_base(set, phase); each op adds signal_total
(ProxyLayout.signal_total) from every unmasked peer: a few counted Writes per (op, peer), then a
fenced Atomic and a padding Atomic.

Between GPUs of one host the ipc transport's copies are made by transport/copy_ring.cu from the proxy
threads' descriptor rings (UCCL_EP_IPC_COPY=kernel, dma_ring.h): launched after each send kernel,
it moves the bytes of every Write pushed so far (the send kernels count them per proxy thread, in
``dma_pushed``); the proxy threads make no CUDA call. With UCCL_EP_IPC_COPY=cuda the proxy threads
copy through the driver instead and CUDA_MODULE_LOADING=EAGER is needed (warn_lazy_module_loading).

Tested by core/tests/gpu/test_cuda_ll_proxy.py against uccl_ep.refs with either copy engine, the
transport and proxy logic also on CPU (core/tests/cpu/test_ipc_transport_proxy_path.py); timings
in docs/benchmarks.md. Between hosts the transport is ipc+fabric (gpu_transport.py), driver copies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import torch

from .. import env
from ..tuning import DEFAULT as DEFAULT_TUNING, Tuning, require_same_across_ranks
from ..tuning import shared_values as tuning_shared_values
from ..config import NUM_MAX_LOCAL_EXPERTS
from ..errors import LimitExceeded
from . import gpu_transport
from .ll import _DISPATCH_RECV_OUTPUTS, _LOGFMT, LowLatencyEngine
from .ll_hybrid import HybridPeers
from .proxy_session import LL_COUNTER_BASE, NUM_COUNTERS, warn_lazy_module_loading
from .runtime import (DeviceMemory, ParamTemplate, current_stream, device_arch, free_after_device, load_kernel,
                      pack_params, sm_number)

__all__ = ["proxy_forced", "warn_lazy_module_loading", "unavailable_reason", "ProxyLayout", "PackedRegion",
           "ProxyLowLatencyEngine", "NUM_COUNTERS", "CHUNK_BYTES", "counter_base"]

_ALIGN = 128
_SEND_BLOCK, _RECV_BLOCK, _COMBINE_RECV_BLOCK = 512, 256, 128
_MAX_RANKS, _MAX_TOPK = 64, 32
_MAX_SIGNAL = (1 << 15) - 1  # protocol.h kMaxAtomicValue
# The copy kernel (transport/copy_ring.cu): threads per block, and the size of its per-ring DmaConsumer
# state and of a descriptor (blocks per ring: Tuning.ipc_copy_blocks; rings without work cost a
# launch only, their blocks leave at once).
_DMA_BLOCK, _DMA_CONSUMER_BYTES, _DMA_DESC_BYTES = 512, 128, 32
# DmaConsumer's diagnostic words the host sums (dma_ring.h; word index = offsetof / 8, checked by
# tests/cpu/test_kernels_compile.py against the header)
_DMA_CONSUMER_DIAG_WORDS = {"wait_ns": 4, "copy_ns": 5, "descs": 6, "push_seen_ns": 10, "push_start_ns": 11,
                            "launches": 12}
# DmaConsumer's words that equal the ring position between launches (copy_ring_handover sets them)
_DMA_CONSUMER_POSITION_WORDS = {"base_idx": 0, "done": 2, "fetched": 7}


def counter_base(s: int, phase: int) -> int:
    """Receiver counter for buffer set ``s``, phase 0 (dispatch) / 1 (combine): in the session's
    low-latency range (proxy_session.py)."""
    return LL_COUNTER_BASE + (2 * s + phase) * NUM_MAX_LOCAL_EXPERTS


def proxy_forced(ctx) -> bool:
    """Whether the Buffer's low-latency traffic must go through the proxy."""
    return bool(env.get("UCCL_EP_FORCE_PROXY")) or (ctx.low_latency_mode and not ctx.allow_nvlink_for_low_latency_mode)


def unavailable_reason(ctx) -> str | None:
    """None when the proxy path can serve ``ctx`` (cheap, no collective)."""
    if ctx.num_ranks > _MAX_RANKS:
        return f"{ctx.num_ranks} ranks; the proxy-path LL kernels support at most {_MAX_RANKS}"
    return gpu_transport.unavailable_reason(gpu_transport.multi_host_guess(ctx))


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


# The largest Write the 16-byte command carries (24-bit length), a multiple of 16.
CHUNK_BYTES = (1 << 24) - 16


# Settings that fix the proxy path's counter growth per op (ProxyLayout.signal_total): a rank whose
# receive counters expect another growth than its peers send would wait until its timeout.
SHARED_SETTINGS = ("ll_proxy_parts", "proxy_write_kb")


def shared_settings(tuning: Tuning = DEFAULT_TUNING) -> tuple:
    """This Buffer's SHARED_SETTINGS (Tuning fields), compared across ranks at Buffer build."""
    return tuning_shared_values(tuning, SHARED_SETTINGS)


def check_same_shared_settings(per_rank: list) -> None:
    """Raise on every rank alike when the ranks' shared_settings() answers differ."""
    require_same_across_ranks(SHARED_SETTINGS, per_rank, "they set the receive counters' growth per op")


def write_chunk_bytes(tuning: Tuning = DEFAULT_TUNING) -> int:
    """Largest Write of the LL proxy path (Tuning.proxy_write_kb), a multiple of 16."""
    return min(tuning.proxy_write_kb * 1024, CHUNK_BYTES) // 16 * 16  # Tuning checks 1..16383


@dataclass(frozen=True)
class PackedRegion:
    """Per-peer packed region of one op (kernel_abi.h): its stride and, for dispatch, its parts."""
    region_bytes: int
    counts_bytes: int = 0
    idx_bytes: int = 0
    payload_bytes: int = 0
    max_slots: int = 0
    signal_total: int = 0


@dataclass(frozen=True)
class ProxyLayout:
    num_max: int
    hidden: int
    num_experts: int
    num_ranks: int
    send_off: int
    recv_off: int
    set_bytes: int
    chunk_bytes: int = CHUNK_BYTES
    parts: int = 1  # most parts an op's region towards a peer is spread over (Tuning.ll_proxy_parts)

    @staticmethod
    def make(num_max: int, hidden: int, num_experts: int, num_ranks: int,
             chunk_bytes: int = CHUNK_BYTES, parts: int = 1, budget: int = 0) -> "ProxyLayout":
        # an area (send or recv) holds the zero-copy combine input (every local expert's rows) and the largest
        # packed regions (every token selects every local expert; BF16, or LogFMT where `budget` has room)
        rows = num_experts * num_max * 2 * hidden
        e_loc = max(1, num_experts // num_ranks)
        packed = num_ranks * ProxyLayout._region(num_max, hidden, e_loc, e_loc, False).region_bytes
        area = _align(max(rows, packed))
        logfmt = _align(num_ranks * _align16(num_max * e_loc * (2 * hidden + hidden // 32)))
        area = logfmt if logfmt > area and 4 * logfmt <= budget else area
        return ProxyLayout(num_max, hidden, num_experts, num_ranks, 0, area, 2 * area, chunk_bytes, parts)

    @staticmethod
    def payload_bytes(hidden: int, use_fp8: bool) -> int:
        return _align16(hidden + hidden // 128 * 4) if use_fp8 else 2 * hidden

    @staticmethod
    def _region(num_max: int, hidden: int, num_topk: int, e_loc: int, use_fp8: bool) -> PackedRegion:
        # slots: (expert, token) selections, each naming its token and row in 16 bits each; rows: one
        # per token (kernel_abi.h), so a token selecting several experts of a rank crosses the link once
        slots = num_max * max(1, min(num_topk, e_loc))
        counts, idx = _align16(4 * e_loc), _align16(4 * slots)
        payload = ProxyLayout.payload_bytes(hidden, use_fp8)
        region = _align16(16 + counts + idx + num_max * payload)
        return PackedRegion(region, counts, idx, payload, slots)

    @property
    def signal_total(self) -> int:
        """Counter growth per op and peer: above the most Writes one op sends a peer (a region cut
        in CHUNK_BYTES pieces, or E_loc zero-copy segments) plus its fenced Atomic (with `parts`:
        up to parts - 1 more Writes and a fenced Atomic per part). A function of the layout only, so
        ops of any top-k, dtype or copy mode may follow each other on a counter (a new layout resets
        the counters)."""
        e_loc = self.num_experts // self.num_ranks
        return max(e_loc, -(-(self.set_bytes // 2) // self.chunk_bytes)) + 2 * self.parts

    def dispatch_region(self, num_topk: int, use_fp8: bool) -> PackedRegion:
        """Stride and parts of the dispatch regions for top-k `num_topk` (same on every rank)."""
        e_loc = self.num_experts // self.num_ranks
        return replace(self._region(self.num_max, self.hidden, num_topk, e_loc, use_fp8),
                       signal_total=self.signal_total)

    def combine_region(self, num_topk: int, logfmt: bool = False) -> PackedRegion:
        """Stride of the combine regions: rows of 2H bytes (64H / 32), LogFMT's 2H + H/32 (meta words)."""
        e_loc = self.num_experts // self.num_ranks
        region = _align16(self.num_max * max(1, min(num_topk, e_loc)) * (64 + int(logfmt)) * self.hidden // 32)
        if self.num_ranks * region > self.set_bytes // 2:  # LogFMT in a buffer below DeepEP's size hint
            raise LimitExceeded("num_rdma_bytes", "bytes of a combine area", self.num_ranks * region, self.set_bytes // 2)
        return PackedRegion(region, signal_total=self.signal_total)

    def send(self, s: int) -> int:
        return s * self.set_bytes + self.send_off

    def recv(self, s: int) -> int:
        return s * self.set_bytes + self.recv_off


class ProxyLowLatencyEngine(LowLatencyEngine):
    """LowLatencyEngine whose send phases push commands to the Buffer's proxy session (see the
    module doc and proxy_session.py)."""

    _TORCH_OPS = False  # the copy-ring hand-overs around each send (_before_send / _after_send)

    def __init__(self, ec, session) -> None:  # noqa: D107 - replaces the NVLink engine's set-up
        self.ec = ec
        self.dev = ec.device
        self.R, self.rank = ec.ctx.num_ranks, ec.ctx.rank
        self.session = session
        self.transport = session.transport
        self.copy_kernel = session.copy_kernel  # Writes copied by transport/copy_ring.cu from the copy rings
        self.tuning = tuning = ec.ctx.tuning
        self.copy_blocks = tuning.ipc_copy_blocks  # the copy kernel's blocks per ring
        self.mem: DeviceMemory = ec.ll_mem
        # where this engine's buffer sits in the session's region (the Writes' offsets are the region's)
        self.region_offset = self.mem.ptr - session.region_ptr
        self.idx = 0
        self.layout: ProxyLayout | None = None
        self._template_cache: dict = {}  # LowLatencyEngine._templates
        self.work: DeviceMemory | None = None
        drv = ec.drv
        self.drv = drv
        self.num_sms = drv.device_attribute(self.dev, drv.ATTR_SM_COUNT)
        # An experiment: an op's region towards a peer spread over this many proxy threads (every
        # rank must use the same value: it sets the counters' growth per op).
        self.parts = tuning.ll_proxy_parts
        self.own_rows_in_y = tuning.ll_own_rows_in_y  # combine(): see there
        self.row_split = tuning.ll_stage_split  # warps per staged combine row (at most)
        send_defines = (f"UCCL_EP_LL_PARTS={self.parts}",) if self.parts > 1 else ()
        self._k = {n: load_kernel(self.dev, src, n, d) for src, n, d in (
            ("ll/proxy/dispatch.cu", "ll_dispatch_proxy_send", send_defines), ("ll/proxy/dispatch.cu", "ll_dispatch_proxy_recv", ()),
            ("ll/proxy/combine.cu", "ll_combine_proxy_send", send_defines), ("ll/proxy/combine.cu", "ll_combine_proxy_recv", ()))}
        self._k_logfmt = {n: load_kernel(self.dev, "ll/proxy/combine.cu", n, d + _LOGFMT) for n, d in (
            ("ll_combine_proxy_send", send_defines), ("ll_combine_proxy_recv", ()))}
        if self.copy_kernel:
            self._k["ll_proxy_dma"] = load_kernel(self.dev, "transport/copy_ring.cu", "ll_proxy_dma")
        # A receive kernel that follows its copy kernel directly starts while the copies run
        # (programmatic dependent launch, Tuning.ll_pdl as on NVLink): its set-up and launch leave
        # the path after the peer's signal; it waits for the copy kernel before it completes.
        self.recv_pdl = (self.copy_kernel and tuning.ll_pdl
                         and sm_number(device_arch(self.dev)) >= 90)
        # the session's proxy and mappings, under the names the kernels' parameters use
        self.C, self.proxy = session.C, session.proxy
        self.num_fifos, self.num_proxy_threads = session.num_fifos, session.num_proxy_threads
        self.fifo_words, self.fifo_table = session.fifo_words, session.fifo_table
        self.status_dev, self.counters_dev = session.status_dev, session.counters_dev
        self.dma_mem: DeviceMemory | None = None
        self.hybrid = HybridPeers(self.dev, drv, ec.ll_paths, ec.ll_peer_base)
        try:
            if self.copy_kernel:
                self._map_copy_rings()
        except BaseException:
            self.close()
            raise
        # The send kernels' copy-ring fields (LLProxy*Params): where they count pushed bytes (0: none).
        # push_fence: a system fence before the pushes unless only the copy kernel, which follows the
        # send kernel on the stream, reads the staged bytes (OpRoute, device/proxy_ll.cuh).
        self._dma_fields = dict(dma_pushed=self.dma_pushed if self.copy_kernel else 0,
                                num_proxy_threads=self.num_proxy_threads,
                                push_fence=int(not self.copy_kernel))

    def _map_copy_rings(self) -> None:
        """Lay out the copy kernel's state over the session's copy rings: ring table u64[n] | pushed
        bytes u64[n] | DmaConsumer [n] (128 B) | finish u32[n][capacity] | descriptor mirror
        DmaDesc[n][capacity]."""
        n, cap = self.num_proxy_threads, self.session.ring_capacity
        table = struct.pack(f"<{n}Q", *self.session.ring_dev)
        finish = 16 * n + _DMA_CONSUMER_BYTES * n
        self.dma_mem = DeviceMemory(self.dev, finish + 4 * n * cap + _DMA_DESC_BYTES * n * cap)
        self.drv.memset_d8(self.dev, self.dma_mem.ptr, 0, self.dma_mem.nbytes, 0)
        self.drv.memcpy_htod(self.dev, self.dma_mem.ptr, table)
        base = self.dma_mem.ptr
        self.dma_pushed = base + 8 * n
        self._dma_params = pack_params(
            "LLProxyDmaParams", rings=base, pushed=self.dma_pushed, state=base + 16 * n,
            finish=base + finish, mirror=base + finish + 4 * n * cap, status=self.status_dev, error=self.ec.error_dev_ptr,
            num_rings=n, blocks_per_ring=self.copy_blocks, rank=self.rank, timeout_ns=self.ec.timeout_ns)
        # DmaConsumer: base_idx (where the next launch starts), done and fetched all equal the ring
        # position between launches
        self.session.add_ring_consumer("ll", base + 16 * n, _DMA_CONSUMER_BYTES // 8,
                                       tuple(_DMA_CONSUMER_POSITION_WORDS.values()))

    def transport_counters(self) -> dict:
        """The proxy's transport counters and, with the copy kernel, its summed diagnostics
        (``copy_kernel_wait_ns``: waiting for the proxy's descriptors; ``copy_kernel_copy_ns``:
        descriptor seen to completion published; ``copy_kernel_descs``; per launch, GPU clock:
        ``copy_kernel_push_start_ns`` / ``_push_seen_ns``, the send kernel's push to the launch's
        start / first descriptor seen, over ``copy_kernel_launches``). Reads device memory:
        call between ops (the bench does)."""
        out = dict(self.proxy.transport_counters())
        if self.copy_kernel:
            n = self.num_proxy_threads
            raw = self.drv.memcpy_dtoh(self.dev, self.dma_mem.ptr + 16 * n, _DMA_CONSUMER_BYTES * n)
            words = struct.unpack(f"<{_DMA_CONSUMER_BYTES // 8 * n}Q", raw)
            per = _DMA_CONSUMER_BYTES // 8
            for key, i in _DMA_CONSUMER_DIAG_WORDS.items():
                out[f"copy_kernel_{key}"] = sum(words[r * per + i] for r in range(n))
        return out

    def _claim_copy_rings(self) -> None:
        """Before a send kernel: the session's copy rings handed over to this engine's copy kernel
        (proxy_session.claim_copy_rings; a no-op kernel when its position is the rings'). Before the
        send kernel rather than between it and the copy kernel, which may overlap it."""
        if self.copy_kernel:
            self.session.claim_copy_rings("ll", current_stream(self.dev))

    def _launch_copies(self) -> None:
        """The copy kernel for every Write pushed so far (transport/copy_ring.cu), after a send kernel, in
        plain stream order.
        NOTES: a copy kernel overlapping its send kernel (programmatic dependent launch) saw its
        descriptors sooner yet made the op slower (docs/benchmarks.md), so the path was removed."""
        if self.copy_kernel:
            self._k["ll_proxy_dma"].launch(self.num_proxy_threads * self.copy_blocks, _DMA_BLOCK,
                                           self._dma_params, current_stream(self.dev))

    def proxy_failure(self):
        """The proxy's own error (it stopped or failed under a kernel), as an exception."""
        return self.session.failure()

    def close(self) -> None:
        """Release this engine's device memory (the session stops the proxy and frees the rest)."""
        if getattr(self, "proxy", None) is None:
            return
        free_after_device(self.dev, self.work, getattr(self, "dma_mem", None), self.hybrid.table)
        self.work = None
        self.dma_mem = None
        self.proxy = None

    # -- layout ----------------------------------------------------------------------------------
    def _rounds(self, s: int, phase: int) -> int:
        return self.work.ptr + 64 + (2 * s + phase) * 8 * self.R

    def _done(self, s: int, phase: int = 0) -> int:
        return self.work.ptr + 4 * (2 * s + phase)

    def _finish(self, combine: bool) -> int:
        base = self.work.ptr + 64 + 4 * 8 * self.R
        return base + 4 * self.layout.num_experts if combine else base

    def _counter_words(self, s: int, phase: int) -> dict:
        """The receive kernels' device copy of the host counters of (set, phase) and its reader lock
        (laid out once per layout: ensure_layout)."""
        return self._counter_word_fields[2 * s + phase]

    def ensure_layout(self, num_max: int, hidden: int, num_experts: int) -> ProxyLayout:
        lay = self.layout
        if lay is not None and (lay.num_max, lay.hidden, lay.num_experts) == (num_max, hidden, num_experts):
            return lay
        if num_experts // self.R > NUM_MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_experts", "experts per rank of the proxy path", num_experts // self.R,
                                NUM_MAX_LOCAL_EXPERTS)
        lay = ProxyLayout.make(num_max, hidden, num_experts, self.R, write_chunk_bytes(self.tuning), self.parts, self.mem.nbytes)
        if 2 * lay.set_bytes > self.mem.nbytes:
            raise LimitExceeded("num_rdma_bytes", f"bytes of the proxy-path low-latency buffer ({num_max} tokens, "
                                f"hidden {hidden}, {num_experts} experts)", 2 * lay.set_bytes, self.mem.nbytes)
        self.hybrid.check_fits(lay, self.mem.nbytes)
        if lay.signal_total > _MAX_SIGNAL:  # an Atomic carries 15 bits of value
            raise LimitExceeded("tuning.proxy_write_kb", f"Writes per (op, peer) of the proxy path (regions of up to "
                                f"{lay.set_bytes // 2} bytes in {lay.chunk_bytes}-byte Writes)",
                                lay.signal_total - 2 * lay.parts, _MAX_SIGNAL - 2 * lay.parts)
        # a zero-copy combine segment is one Write; this also keeps num_max < 2^16 (hidden >= 128), which
        # a dispatch slot's token | row << 16 needs (kernel_abi.h)
        if num_max * 2 * hidden > CHUNK_BYTES:
            raise LimitExceeded("num_max_dispatch_tokens_per_rank", "bytes of one proxy write (24-bit length)",
                                num_max * 2 * hidden, CHUNK_BYTES)
        torch.cuda.synchronize(self.dev)
        if self.work is not None:
            self.work.free()
        # done[2][2] u32 | rounds[2][2][R] i64 | finish: dispatch [E] u32, combine [E] u32 (R of each used) |
        # counter cache [2][2][R] u64 | counter lock [2][2][R] i32
        self.work = DeviceMemory(self.dev, 64 + 4 * 8 * self.R + 8 * num_experts + 4 * 12 * self.R)
        cache = self.work.ptr + 64 + 4 * 8 * self.R + 8 * num_experts
        self._counter_word_fields = [dict(counter_cache=cache + i * 8 * self.R,
                                          counter_lock=cache + 4 * 8 * self.R + i * 4 * self.R) for i in range(4)]
        self.layout = lay
        self.clean()
        return lay

    def clean(self) -> None:
        """Zero rounds, finish counters and the proxy's receive counters on every rank (collective;
        in shrink mode masked ranks are left out, and a rank that does not come is masked)."""
        torch.cuda.synchronize(self.dev)
        # every rank idle: nothing in flight through the proxies
        self.ec.host_barrier("low_latency buffer clean (before)", masks=True)
        self.drv.memset_d8(self.dev, self.work.ptr, 0, self.work.nbytes, 0)
        self.hybrid.clean(self.mem, self.layout)
        self.drv.synchronize(self.dev)
        self.session.reset_counters(LL_COUNTER_BASE, NUM_COUNTERS - LL_COUNTER_BASE)
        self.idx = 0
        self.ec.host_barrier("low_latency buffer clean (after)", masks=True)

    # -- dispatch (LowLatencyEngine.dispatch, with these kernels, templates and hooks) ------------
    _DISPATCH_KERNELS = ("ll_dispatch_proxy_send", "ll_dispatch_proxy_recv")
    _DISPATCH_SMEM_PER_EXPERT = 12

    def _before_send(self) -> None:
        self._claim_copy_rings()

    def _after_send(self) -> None:
        self._launch_copies()

    def _dispatch_templates(self, lay, s, K, num_experts, use_fp8, round_scale, use_ue8m0):
        R, E_loc, num_max, H = self.R, num_experts // self.R, lay.num_max, lay.hidden
        reg = lay.dispatch_region(K, use_fp8)
        shrink = self._shrink_fields()
        shape = dict(num_max=num_max, hidden=H, num_ranks=R, rank=self.rank, use_fp8=use_fp8,
                     region_bytes=reg.region_bytes, counts_bytes=reg.counts_bytes, idx_bytes=reg.idx_bytes,
                     payload_bytes=reg.payload_bytes, max_slots=reg.max_slots, signal_total=reg.signal_total,
                     mask=shrink["mask"], timeout_ns=self.ec.timeout_ns, counter=counter_base(s, 0))
        send = ParamTemplate("LLProxyDispatchParams", ("x", "topk_idx", "num_tokens"),
                             fifos=self.fifo_table.ptr, finish=self._finish(False), send_area=self.mem.ptr + lay.send(s),
                             error=self.ec.error_dev_ptr, send_off=self.region_offset + lay.send(s),
                             recv_off=self.region_offset + lay.recv(s),
                             num_topk=K, num_experts=num_experts, round_scale=round_scale, num_fifos=self.num_fifos,
                             chunk_bytes=lay.chunk_bytes,
                             self_counter=self._counter_words(s, 0)["counter_cache"] + 8 * self.rank,
                             **self._dma_fields, **self.hybrid.send_fields(lay, s, 0), **shape)
        recv = ParamTemplate(
            "LLProxyDispatchRecvParams", _DISPATCH_RECV_OUTPUTS,
            recv_area=self.mem.ptr + lay.recv(s), send_area=self.mem.ptr + lay.send(s), counters=self.counters_dev,
            rounds=self._rounds(s, 0), done=self._done(s, 0), **self._counter_words(s, 0), status=self.status_dev,
            error=self.ec.error_dev_ptr, num_counters=NUM_COUNTERS, num_local_experts=E_loc, use_ue8m0=use_ue8m0,
            shrink=shrink["shrink"], **shape, **self.hybrid.recv_fields(self.mem, lay, s, 0))
        return send, recv

    # -- combine ---------------------------------------------------------------------------------
    def _proxy_combine_templates(self, lay, reg, s, K, num_experts, zero_copy, own_in_y):
        R, E_loc = self.R, num_experts // self.R
        shrink = self._shrink_fields()
        send_area = self.mem.ptr + lay.send(s)
        shape = dict(num_max=lay.num_max, hidden=lay.hidden, num_ranks=R, rank=self.rank, mask=shrink["mask"],
                     region_bytes=reg.region_bytes, signal_total=reg.signal_total, timeout_ns=self.ec.timeout_ns,
                     counter=counter_base(s, 1))
        send = ParamTemplate("LLProxyCombineParams", ("y", "src_info", "layout_range"), fifos=self.fifo_table.ptr,
                             finish=self._finish(True), send_area=send_area, error=self.ec.error_dev_ptr,
                             send_off=self.region_offset + lay.send(s), recv_off=self.region_offset + lay.recv(s),
                             num_local_experts=E_loc,
                             chunk_bytes=lay.chunk_bytes, zero_copy=int(zero_copy), num_fifos=self.num_fifos,
                             self_counter=self._counter_words(s, 1)["counter_cache"] + 8 * self.rank,
                             own_in_y=int(own_in_y), row_split=self.row_split, **self._dma_fields, **shape,
                             **self.hybrid.send_fields(lay, s, 1))
        recv = ParamTemplate(
            "LLProxyCombineRecvParams",
            ("send_area", "layout_range", "topk_idx", "topk_weights", "out", "wait_stats", "num_tokens"),
            recv_area=self.mem.ptr + lay.recv(s), zero_copy=int(zero_copy or own_in_y), counters=self.counters_dev,
            rounds=self._rounds(s, 1), done=self._done(s, 1), **self._counter_words(s, 1), status=self.status_dev,
            error=self.ec.error_dev_ptr, num_counters=NUM_COUNTERS, num_topk=K, num_experts=num_experts,
            shrink=shrink["shrink"], **shape, **self.hybrid.recv_fields(self.mem, lay, s, 1))
        return send, recv

    def combine(self, y, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy, recv_follows=False,
                use_logfmt=False):
        src_info, layout_range, num_max, H, num_experts = handle
        lay = self.ensure_layout(num_max, H, num_experts)
        T, K = topk_idx.shape
        kernels = self._k_logfmt if use_logfmt else self._k
        reg = lay.combine_region(K, use_logfmt)  # refuses a region over the buffer before the set flips
        s = self._flip()
        send_area = self.mem.ptr + lay.send(s)
        zero_copy = bool(zero_copy)
        if zero_copy:
            y_ptr = send_area
        else:
            y = y.contiguous()
            y_ptr = y.data_ptr()
        # Tuning.ll_own_rows_in_y (default on): the rank's own rows stay in y when the receive
        # kernel follows directly on the stream (y cannot change in between), so the send kernel
        # skips staging them (~6 us at 128 tokens, ~16 at 512); behind a receive hook they are
        # staged, as y may be reused before the hook runs.
        own_in_y = self.own_rows_in_y and bool(recv_follows) and not zero_copy and not use_logfmt
        result = out if out is not None else torch.empty(T, H, dtype=torch.bfloat16, device=topk_idx.device)
        topk_idx = topk_idx.contiguous()
        topk_weights = topk_weights.contiguous()
        send, recv = self._templates(lay, ("combine", s, K, num_experts, use_logfmt, zero_copy, own_in_y),
                                     lambda: self._proxy_combine_templates(lay, reg, s, K, num_experts, zero_copy,
                                                                           own_in_y))
        self._claim_copy_rings()
        kernels["ll_combine_proxy_send"].launch(2 * self.num_sms, _RECV_BLOCK,
                                                send.pack(y_ptr, src_info.data_ptr(), layout_range.data_ptr()),
                                                current_stream(self.dev),
                                                smem=4 * (num_experts // self.R + 1 + 2 * _RECV_BLOCK + num_experts))
        self._launch_copies()
        recv_params = recv.pack(y_ptr if own_in_y else send_area, layout_range.data_ptr(), topk_idx.data_ptr(),
                                topk_weights.data_ptr(), result.data_ptr(),
                                wait_stats.data_ptr() if wait_stats is not None else 0, T)
        keep = (y, topk_idx, topk_weights, result, wait_stats, handle)
        return result, self._receive_phase(kernels["ll_combine_proxy_recv"], max(T, 1), _COMBINE_RECV_BLOCK,
                                           recv_params, keep, self.recv_pdl)

    def fifo_table_bytes(self) -> bytes:  # diagnostics: the packed FifoLayout table the kernels read
        return self.session.fifo_table_bytes()


def fifo_table_entry(blob: bytes, index: int, entry_bytes: int) -> dict:
    """Decode one packed FifoLayout (six addresses, capacity, capacity_log2) for diagnostics/tests."""
    vals = struct.unpack_from("<6Q2I", blob, index * entry_bytes)
    keys = ("slots", "head", "tail", "tail_cache", "completed", "status", "capacity", "capacity_log2")
    return dict(zip(keys, vals))
