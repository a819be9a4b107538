"""Normal (high-throughput) mode of the CUDA executor through the CPU proxy: the host executor's
protocol (uccl_ep/host/ht.py, ht_internode.py) carried out by GPU warps (ht/proxy/notify.cu,
ht/proxy/dispatch.cu, ht/proxy/combine.cu; device/internode_ring.cuh).

Used when the group spans several nodes (topology.is_internode) or ``UCCL_EP_FORCE_PROXY=1``.
On one host the transport is ``ipc``, so 2 GPUs with ``UCCL_EP_RANKS_PER_NODE=1`` act as 2 nodes:
the proxy posts each Write as a descriptor into its copy ring (dma_ring.h), as it would hand a work
request to a NIC, and the kernels' own copy role (device/ht_dma.cuh: extra blocks at the end of each
grid) copies it into the receiver's region; the proxy then delivers the immediate to the receiving
proxy, as an RDMA write with immediate. ``UCCL_EP_IPC_COPY=cuda`` makes the proxy copy through the
driver instead (and needs CUDA_MODULE_LOADING=EAGER, ll_proxy.warn_lazy_module_loading).

Per op:
  notify    a meta record (fresh dispatch) to every rank: counted Write + fenced Atomic on
            META(parity); the CPU waits for the receive counts only without num_worst_tokens.
            Cached dispatch and combine send a bare handshake instead, which the kernel skips
            where the op's ring areas keep the geometry they had since the last one (`start_op`)
  dispatch  per (peer, channel) ring streams of the host executor's packed rows: staged, one
            ordered Write per round (TAIL(ring)), credits back with Atomic HEAD(ring); the stream
            to the rank itself stays on the GPU (staged into its own receive ring, device counters)
  combine   the rows back along the same streams (BF16 row + weights), reduced at the source in
            rank order, fp32, biases first (bit-exact with uccl_ep.refs)

Region: this rank's NVL buffer, at the base of the Buffer's proxy session's region (the executor
does not open the peers' NVL buffers in this mode, the ipc transport does). The proxy, its FIFOs,
counters and copy rings and their device mappings: the session (proxy_session.py), shared with
low-latency mode through the proxy.

Topologies: one rank per node (ranks_per_node = 1, or a forced proxy on one host, where every
rank is treated as its own node and the handle is the intranode 6-tuple): the kernels above;
several ranks per node: ht/proxy/forward_*.cu (each token crosses to a node once, the rank of
its rail forwards it to the node's other ranks over the area-1 rings, and combine reduces inside
the node first, in fp32), driven by ht_proxy_forward.py. Between hosts the transport is
ipc+fabric (gpu_transport.py): node mates over ipc, other nodes over the NIC.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import time

import torch

from .. import env
from ..errors import InvalidArgument, LimitExceeded, Timeout, Unsupported
from ..handles import NormalHandle
from ..tuning import require_same_across_ranks
from ..validate import check_combine_rows
from . import gpu_transport
from . import ht_proxy_plan as plan
from .ht_proxy_plan import ProxyNormalPlan, check_scales
from .runtime import (DeviceMemory, MappedHostMemory, contiguous, current_stream, dispatch_outputs, free_after_device,
                      load_kernel, pack_params, warp_size)

__all__ = ["serves", "unavailable_reason", "scope_reason", "ProxyNormalEngine", "ProxyNormalPlan"]

_BLOCK = 512
_NOTIFY_BLOCK = 256
_PLAN_BLOCK = 256     # ht/proxy/plan.cu kPlanThreads
_MAX_LOCAL_EXPERTS = 1024
# The copy role (ipc "kernel" copies between GPUs of one host; device/ht_dma.cuh): blocks per proxy
# thread's copy ring in the dispatch and combine kernels (the notify kernel takes one per ring), and
# the largest unit of copy work one warp takes.
_COPY_BLOCKS_PER_RING = 2
_COPY_UNIT_BYTES = 32 << 10
# Mirrors of dma_ring.h (a CPU test compiles the header and compares).
DMA_RING_CAPACITY = 8192
DMA_UNIT_CAPACITY = 32768
DMA_RING_STATE_BYTES = 128
# HtDmaRing's diagnostic words (dma_ring.h): name -> index of the u64
_DMA_RING_DIAG_WORDS = {"descs": 6, "passes": 7, "read_cycles": 8, "take_cycles": 9, "scan_cycles": 10,
                        "publish_cycles": 11, "pass_ns": 12, "pass_cycles": 13}
DMA_CONTEXT_BYTES = 128
DMA_RUNNING = (1 << 64) - 1
# The ring fields of a params struct, and those that fix where an op's messages land (an area's
# geometry key, geometry_keys; the round size does not: each op's rounds and credits are its own,
# and a receiver returns every credit of an op at its end).
_RING_FIELDS = ("msg_bytes", "ring_slots", "chunk", "recv_base", "send_base", "first_ring", "peer_div", "peer_mod")
_GEOMETRY = ("msg_bytes", "ring_slots", "recv_base", "send_base", "first_ring", "peer_div", "peer_mod")


# Tuning fields every rank of a proxy-path Buffer must agree on (a forwarder and its sources read
# each other's partials); the executor gathers them when a Buffer is built.
SHARED_SETTINGS = ("ht_partials_bf16",)


def shared_settings(tuning) -> tuple:
    return tuple(getattr(tuning, n) for n in SHARED_SETTINGS)


def check_same_shared_settings(per_rank: list) -> None:
    """Raise on every rank alike when the ranks' shared_settings() answers differ."""
    require_same_across_ranks(SHARED_SETTINGS, per_rank, "a node's partials are read by the other nodes' ranks")


def serves(ctx) -> bool:
    """Whether normal mode of this Buffer goes through the proxy (else NVLink kernels)."""
    return ctx.topology.is_internode or bool(env.get("UCCL_EP_FORCE_PROXY"))


def scope_reason(ctx, multi_host: bool) -> str | None:
    topo = ctx.topology
    if topo.is_internode and topo.ranks_per_node > plan.MAX_LOCAL:
        return (f"{topo.ranks_per_node} ranks per node; normal mode through the proxy forwards inside a node of at "
                f"most {plan.MAX_LOCAL} ranks")
    why = gpu_transport.unavailable_reason(multi_host)
    if why:
        return why
    if ctx.num_ranks > plan.MAX_RANKS:
        return f"{ctx.num_ranks} ranks; normal mode through the proxy supports at most {plan.MAX_RANKS}"
    return None


def unavailable_reason(ctx) -> str | None:
    """None when the proxy path can serve normal mode of ``ctx`` (cheap, no collective)."""
    return scope_reason(ctx, gpu_transport.multi_host_guess(ctx))


class ProxyNormalEngine:
    """Normal mode through the Buffer's proxy session (see the module doc and proxy_session.py)."""

    def __init__(self, ec, session) -> None:
        ctx = ec.ctx
        why = scope_reason(ctx, ec.multi_host)
        if why:
            raise Unsupported(f"normal mode of the cuda backend: {why}")
        if ec.nvl_mem is None:
            raise LimitExceeded("num_nvl_bytes", "bytes of the NVL buffer for normal mode", 1, 0,
                                hint="build the Buffer with num_nvl_bytes from Config.get_nvl_buffer_size_hint")
        # Between GPUs of one host the Writes' bytes are copied by the kernels' own copy role from the
        # proxy threads' descriptor rings (device/ht_dma.cuh): the proxy posts them as it would to a
        # NIC, with no CUDA call; UCCL_EP_IPC_COPY=cuda keeps the proxy's driver copies (which need
        # eager module loading).
        self.session = session
        self.dma_role = session.copy_kernel
        self.ec, self.dev, self.drv = ec, ec.device, ec.drv
        self.R, self.rank = ctx.num_ranks, ctx.rank
        self.internode = ctx.topology.is_internode
        self.G = ctx.topology.ranks_per_node if self.internode else 1
        self.forward = self.G > 1  # several ranks per node: dedup per node, forwarding inside it
        self.partials_bf16 = ctx.tuning.ht_partials_bf16  # forwarded combine: hop B in BF16
        self.mem: DeviceMemory = ec.nvl_mem
        if self.mem.ptr != session.region_ptr:
            raise RuntimeError(f"rank {self.rank}: the NVL buffer must start the proxy session's region (the "
                               "normal-mode kernels address the region from its base)")
        self.shared, self.meta = plan.region_layout(self.mem.nbytes, self.R)
        self.num_sms = self.drv.device_attribute(self.dev, self.drv.ATTR_SM_COUNT)
        self.kernels = {n: load_kernel(self.dev, src, n) for src, n in (
            ("layout.cu", "ht_layout"), ("ht/proxy/notify.cu", "ht_proxy_notify"),
            ("ht/proxy/dispatch.cu", "ht_proxy_dispatch"), ("ht/proxy/combine.cu", "ht_proxy_combine"),
            ("ht/proxy/forward_dispatch.cu", "ht_proxy_forward_dispatch"),
            ("ht/proxy/forward_combine.cu", "ht_proxy_forward_combine"),
            ("ht/proxy/plan.cu", "ht_proxy_plan_send"), ("ht/proxy/plan.cu", "ht_proxy_plan_recv"),
            ("ht/proxy/plan.cu", "ht_proxy_forward_handle"))
            if "forward" not in n or self.forward}
        # the session's proxy and mappings, under the names the kernels' parameters use; this
        # engine's counters are the session's normal-mode range, from 0 (ordered counters < 1024)
        self.C, self.proxy = session.C, session.proxy
        self.num_fifos, self.num_proxy_threads = session.num_fifos, session.num_proxy_threads
        self.fifo_words, self.fifo_table = session.fifo_words, session.fifo_table
        self.status_dev, self.counters_dev = session.status_dev, session.counters_dev
        self.num_counters = session.num_counters
        self.region_dev = session.region_dev
        self.state = self.host = self.dma_mem = self.mates = None
        self.dma_ctx = 0
        try:
            if self.dma_role:
                self._map_dma_role()
            self.state = DeviceMemory(self.dev, plan.STATE_BYTES)
            self.drv.memset_d8(self.dev, self.state.ptr, 0, plan.STATE_BYTES, 0)
            self.drv.synchronize(self.dev)
            self.host = MappedHostMemory(self.dev, 4 * (3 + self.R + _MAX_LOCAL_EXPERTS))
            if self.forward and ec.all_gather is not None:
                self._map_mates(ec.all_gather)
        except BaseException:
            self.close()
            raise
        self.host_tag = 0
        self.last_worst = 0

    @property
    def owner(self):
        """The Buffer this engine's handles belong to."""
        return self.ec.owner

    def _map_dma_role(self) -> None:
        """The copy role's memory over the session's copy rings (dma_ring.h, HtDmaContext): context |
        ring table u64[n] | pushed u64[n] | signals, exited | HtDmaRing[n] | left u32[n][cap] |
        finish u32[n][cap] | unit_end u64[n][cap] | units HtDmaUnit[n][units cap]."""
        n, cap = self.num_proxy_threads, self.session.ring_capacity
        if cap != DMA_RING_CAPACITY:
            raise RuntimeError(f"copy rings of {cap} descriptors; the kernels are built for {DMA_RING_CAPACITY}")
        table = self.session.ring_dev
        off = {"table": DMA_CONTEXT_BYTES}
        off["pushed"] = off["table"] + 8 * n
        off["signals"] = off["pushed"] + 8 * n
        off["exited"] = off["signals"] + 8
        off["state"] = (off["exited"] + 8 + 127) // 128 * 128
        off["left"] = off["state"] + DMA_RING_STATE_BYTES * n
        off["finish"] = off["left"] + 4 * n * cap
        off["unit_end"] = off["finish"] + 4 * n * cap
        off["units"] = off["unit_end"] + 8 * n * cap
        total = off["units"] + 32 * n * DMA_UNIT_CAPACITY
        self.dma_mem = DeviceMemory(self.dev, total)
        base = self.dma_mem.ptr
        self.drv.memset_d8(self.dev, base, 0, total, 0)
        states = b"".join(struct.pack("<16Q", 0, 0, 0, 0, DMA_RUNNING, *([0] * 11)) for _ in range(n))
        self.drv.memcpy_htod(self.dev, base + off["state"], states)
        self.drv.memcpy_htod(self.dev, base + off["table"], struct.pack(f"<{n}Q", *table))
        ctx = struct.pack("<10Q6q", base + off["table"], base + off["pushed"], base + off["state"], base + off["left"],
                          base + off["finish"], base + off["unit_end"], base + off["units"], base + off["signals"],
                          base + off["exited"], self.status_dev, n, _COPY_UNIT_BYTES, self.rank, self.ec.timeout_ns,
                          0, 0)
        self.drv.memcpy_htod(self.dev, base, ctx)
        self.drv.synchronize(self.dev)
        self.dma_ctx = base
        self.dma_offsets = off
        # HtDmaRing.base_idx: where the next launch starts (its byte count stays this engine's own)
        self.session.add_ring_consumer("ht", base + off["state"], DMA_RING_STATE_BYTES // 8, (0,))

    def _map_mates(self, all_gather) -> None:
        """The node mates' regions and HTProxyStates mapped here (``self.mates``: u64 [R][2], the forward
        kernels' ``mates``), so hop 2 and hop A go over NVLink instead of the proxy: for every node whose
        ranks all see each other's GPUs and none forces the proxy (UCCL_EP_FORCE_PROXY), else not at all
        on that node (both ends of a stream must take the same path). Collective (the constructor's)."""
        mine = (self.dev, self.mem.ipc_handle(), self.state.ipc_handle())
        got = [pickle.loads(b) for b in all_gather(pickle.dumps(mine), "normal mode (node mates' rings)")]
        node = range(self.rank // self.G * self.G, (self.rank // self.G + 1) * self.G)
        ok = not env.get("UCCL_EP_FORCE_PROXY") and all(
            r == self.rank or self.drv.can_access_peer(self.dev, got[r][0]) for r in node)
        oks = [pickle.loads(b) for b in all_gather(pickle.dumps(ok), "normal mode (node mates' paths)")]
        if not all(oks[r] for r in node):
            return
        table = [0] * (2 * self.R)
        for r in node:
            if r != self.rank:
                table[2 * r], table[2 * r + 1] = self.mem.open_peer(got[r][1]), self.state.open_peer(got[r][2])
        self.mates = DeviceMemory(self.dev, 16 * self.R)
        self.drv.memcpy_htod(self.dev, self.mates.ptr, struct.pack(f"<{2 * self.R}Q", *table))

    @property
    def mates_ptr(self) -> int:
        """The forward kernels' ``mates`` (0: hop 2 and hop A through the proxy)."""
        return self.mates.ptr if self.mates is not None else 0

    def role(self, main_blocks: int, block: int, per_ring: int = _COPY_BLOCKS_PER_RING,
              senders: int | None = None) -> tuple[int, dict]:
        """(grid, the dma_* fields) of a launch of ``main_blocks`` blocks: the copy role's blocks
        follow them when this engine has one; ``senders`` defaults to one signal per warp."""
        if not self.dma_role:
            return main_blocks, dict(dma_blocks=0, dma_senders=0)
        self.session.claim_copy_rings("ht", current_stream())  # the launch that follows consumes the rings
        extra = per_ring * self.num_proxy_threads
        if senders is None:
            senders = main_blocks * (block // warp_size())  # lane 0 of every warp (64-lane wavefronts on AMD)
        return main_blocks + extra, dict(dma_blocks=extra, dma_senders=senders)

    # -- shared pieces -----------------------------------------------------------------------------
    def ring(self, msg: int, channels: int, config, phase: str, area: int = 0) -> dict:
        """The params fields of this op's rings in ``area``: ``ring`` (area 0, with the counters'
        fields) or ``nvl_ring`` (area 1), an HTRingGeometry each (kernel_abi_internode.h)."""
        # NOTES: without forwarding (one rank per node) only area 0 carries rings: it gets the whole
        # region, so deep rings (config.num_max_rdma_chunked_recv_tokens) are not cut to half of it.
        g = plan.geometry(self.R, self.shared, self.ec.ctx.timeout_s, msg, channels, config, phase, area,
                          areas=2 if self.forward else 1, ranks_per_node=self.G)
        geometry = {k: getattr(g, k) for k in _RING_FIELDS}
        if area:
            return {"nvl_ring": geometry}
        return dict(ring=geometry, head_base=plan.HEAD_BASE, num_counters=self.num_counters,
                    num_fifos=self.num_fifos, timeout_ns=self.ec.timeout_ns)

    @staticmethod
    def geometry_keys(rings: dict, channels: int) -> tuple[int, int]:
        """The geometry key of ring areas 0 and 1 of an op's ring fields (``ring``, ``nvl_ring``): a
        nonzero hash of where its messages land in the area, equal on every rank; 0 for an area the
        op does not use (the notify kernel compares them with HTProxyState::area_geometry)."""
        keys = []
        for member in ("ring", "nvl_ring"):
            geometry = rings.get(member)
            if geometry is None:
                keys.append(0)
                continue
            raw = struct.pack(f"<{1 + len(_GEOMETRY)}q", channels, *(geometry[k] for k in _GEOMETRY))
            keys.append(int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") | 1)
        return keys[0], keys[1]

    def start_op(self, rings: dict, channels: int) -> None:
        """Before a cached dispatch or a combine: the notify kernel's bare handshake, which it skips
        where the op's areas keep their geometry (ht/proxy/notify.cu)."""
        self.notify(geometry=self.geometry_keys(rings, channels))

    def proxy_words(self) -> dict:
        return dict(region=self.region_dev, fifos=self.fifo_table.ptr, counters=self.counters_dev,
                    status=self.status_dev, state=self.state.ptr, error=self.ec.error_dev_ptr, dma=self.dma_ctx)

    def _check_channels(self, channels: int) -> None:
        per = 3 if self.forward else 2  # co-resident blocks per channel
        copy = _COPY_BLOCKS_PER_RING * self.num_proxy_threads if self.dma_role else 0  # the copy role's
        if channels > plan.MAX_CHANNELS or per * channels + copy > self.num_sms:
            raise LimitExceeded("config.num_sms", f"channels (num_sms / 2; {per} blocks each, at most "
                                f"{plan.MAX_CHANNELS} and, with the {copy} copy blocks, the device's {self.num_sms} "
                                "SMs) of the proxy normal-mode kernels", channels,
                                min(plan.MAX_CHANNELS, (self.num_sms - copy) // per))

    def notify(self, per_dst=None, meta_out=None, cols=None, E_loc=0, alignment=1, worst=0, channels=0,
               geometry=(0, 0)) -> int:
        """The start of an op: a fresh dispatch's record exchange, or the handshake (``per_dst`` None);
        ``geometry``: the op's area keys (geometry_keys)."""
        handshake = per_dst is None
        # a handshake pushes no bytes; a fresh record's Writes are copied by one block per ring
        grid, role = (1, dict(dma_blocks=0, dma_senders=0)) if handshake else self.role(1, _NOTIFY_BLOCK, 1, 1)
        if not handshake:
            self.host_tag = (self.host_tag + 1) & 0x3FFFFFFF
        params = pack_params(
            "HTProxyNotifyParams", per_dst=0 if handshake else per_dst.data_ptr(),
            meta_out=0 if handshake else meta_out.data_ptr(), host=self.host.dev_ptr,
            record_ints=0 if handshake else cols["ints"], num_ranks=self.R, rank=self.rank,
            num_counters=self.num_counters, num_fifos=self.num_fifos, meta_base=self.meta.base,
            meta_slot_bytes=self.meta.slot, expert_col=0 if handshake else cols["expert"], num_local_experts=E_loc,
            node_col=-1 if handshake else cols["node"], ranks_per_node=self.G, num_channels=channels,
            check_col=-1 if handshake else cols["check"], expert_alignment=alignment, num_worst_tokens=worst,
            host_tag=self.host_tag, handshake=int(handshake), area_geometry0=geometry[0], area_geometry1=geometry[1],
            timeout_ns=self.ec.timeout_ns, **self.proxy_words(),
            **role)
        self.kernels["ht_proxy_notify"].launch(grid, _NOTIFY_BLOCK, params, current_stream())
        return self.host_tag

    def wait_host(self, tag: int) -> list[int]:
        """The notify kernel's receive counts: [rows, per source (R), per expert (E_loc), RDMA rows]."""
        deadline = time.monotonic() + self.ec.ctx.timeout_s
        spins = 0
        while self.host.int32(0) != tag:
            spins += 1
            if spins % 1024 == 0:
                self.ec.check_error()
                if time.monotonic() > deadline:
                    raise Timeout(self.rank, None, "ht_notify (CPU wait for receive counts)", self.ec.ctx.timeout_s,
                                  hint="a peer did not join this dispatch (or its proxy is stuck)")
                if spins > 100_000:
                    time.sleep(0)
        self.ec.check_error()
        return self.host.int32_array(1, 2 + self.R + _MAX_LOCAL_EXPERTS)

    # -- layout ------------------------------------------------------------------------------------
    def layout(self, topk_idx, num_experts):
        from .ht import launch_layout
        ntpr, _, ntpe, in_rank = launch_layout(self.kernels["ht_layout"], self.R, topk_idx, num_experts)
        if not self.internode:
            return ntpr, None, ntpe, in_rank
        ntprr = ntpr.clone() if self.G == 1 else plan.node_mask(in_rank, self.G).sum(0, dtype=torch.int32)
        return ntpr, ntprr, ntpe, in_rank

    # -- dispatch ----------------------------------------------------------------------------------
    def check_dispatch(self, x, x_scales, topk_idx, num_tokens_per_expert, config):
        """Checks shared by both dispatch kernels; (T, C, E, E_loc, K, num_scales)."""
        check_scales(x_scales)
        E = num_tokens_per_expert.numel()
        E_loc = E // self.R
        if E_loc > _MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_tokens_per_expert", "local experts of the CUDA normal kernels", E_loc,
                                _MAX_LOCAL_EXPERTS)
        self._check_channels(config.num_channels)
        return (x.shape[0], config.num_channels, E, E_loc, topk_idx.shape[1] if topk_idx is not None else 0,
                x_scales.shape[1] if x_scales is not None else 0)

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        if self.forward:
            from . import ht_proxy_forward as fwd
            return fwd.dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                                num_tokens_per_expert, expert_alignment, num_worst_tokens, config)
        R = self.R
        T, C, E, E_loc, K, ns = self.check_dispatch(x, x_scales, topk_idx, num_tokens_per_expert, config)
        msg = plan.dispatch_msg_bytes(x.shape[1] * x.element_size(), ns, K)
        ring = self.ring(msg, C, config, "dispatch")
        in_rank = is_token_in_rank.contiguous()
        cols = plan.record_columns(R, C, E_loc)
        per_dst, send_prefix, head, _, _ = self.plan_send(in_rank, num_tokens_per_rank, num_tokens_per_expert, C,
                                                          E_loc, msg, cols)
        meta_out = torch.zeros_like(per_dst)  # defined even where no notify kernel runs (CPU emulation)
        self.last_worst = num_worst_tokens
        tag = self.notify(per_dst, meta_out, cols, E_loc, expert_alignment, num_worst_tokens, C,
                          geometry=self.geometry_keys(ring, C))
        if num_worst_tokens > 0:
            rows, num_recv, per_src, per_expert = num_worst_tokens, None, None, []
        else:
            vals = self.wait_host(tag)
            num_recv, per_src, per_expert = vals[0], vals[1:1 + R], vals[1 + R:1 + R + E_loc]
            rows = num_recv
        lay = self.plan_recv(meta_out, send_prefix, C, cols, rows)
        items = self.plan_handle(lay, send_prefix, in_rank, head, rows)
        recv_x, recv_scales, recv_idx, recv_w, recv_src = dispatch_outputs(rows, x, x_scales, topk_idx)
        x, topk_idx, topk_weights = contiguous(x, topk_idx, topk_weights)
        self._launch_dispatch(x, x_scales, topk_idx, topk_weights, in_rank, send_prefix, lay["recv_prefix"],
                              lay["recv_end"], (recv_x, recv_scales, recv_idx, recv_w, recv_src), C, rows, ring, E)
        if not self.internode:  # DeepEP's intranode 6-tuple: the source index of every row, from the kernel
            items = items[:3] + (recv_src,) + items[3:]
        state = ProxyNormalPlan(num_tokens=T, num_rows=rows, num_recv=num_recv, num_channels=C, num_experts=E,
                                send_prefix=send_prefix, recv_prefix=lay["recv_prefix"], recv_end=lay["recv_end"],
                                in_rank=in_rank, send_head=head, recv_counts=per_src)
        return recv_x, recv_scales, recv_idx, recv_w, per_expert, NormalHandle(items, self.owner, state)

    def plan_send(self, in_rank, num_tokens_per_rank, num_tokens_per_expert, C: int, E_loc: int, msg: int,
                  cols: dict):
        """A fresh dispatch's send side on the device (ht/proxy/plan.cu): the notify records [R, L],
        send_prefix [R, C] and send_head [T, R] (ht_proxy_plan.channel_counts / records / send_head),
        and with forwarding node_send_prefix [N, C] and send_rdma_head [T, N] (else None)."""
        T, R, G, dev = in_rank.shape[0], self.R, self.G, in_rank.device
        i32 = dict(dtype=torch.int32, device=dev)
        records = torch.empty(R, cols["ints"], dtype=torch.int64, device=dev)
        send_prefix, head = torch.empty(R, C, **i32), torch.empty(T, R, **i32)
        node_prefix, node_head = (torch.empty(R // G, C, **i32), torch.empty(T, R // G, **i32)) if self.forward \
            else (None, None)
        params = pack_params("HTProxyPlanSendParams", is_token_in_rank=in_rank.data_ptr(),
                             num_tokens_per_rank=num_tokens_per_rank.data_ptr(),
                             num_tokens_per_expert=num_tokens_per_expert.data_ptr(), records=records.data_ptr(),
                             send_prefix=send_prefix.data_ptr(), send_head=head.data_ptr(),
                             send_rdma_head=node_head.data_ptr() if self.forward else 0,
                             node_send_prefix=node_prefix.data_ptr() if self.forward else 0, num_tokens=T,
                             num_ranks=R, ranks_per_node=G, num_channels=C, num_local_experts=E_loc, msg_bytes=msg,
                             node_col=cols["node"], record_ints=cols["ints"])
        blocks = R + (R // G if self.forward else 0)
        self.kernels["ht_proxy_plan_send"].launch(blocks, _PLAN_BLOCK, params, current_stream())
        return records, send_prefix, head, node_prefix, node_head

    def plan_recv(self, meta_out, send_prefix, C: int, cols: dict, rows: int) -> dict:
        """A fresh dispatch's receive side on the device (ht/proxy/plan.cu), from the records the
        notify kernel received: the layout (recv_prefix, recv_end; with forwarding recv_count and the
        forwarder's rdma_count / rdma_end / rdma_prefix; its handle is built after the dispatch) or
        DeepEP's handle items of one rank per node (ht_proxy_plan.internode_handle) or one node through the proxy
        (intranode_handle, less the source indices the dispatch kernel writes)."""
        R, G, dev = self.R, self.G, meta_out.device
        i32 = dict(dtype=torch.int32, device=dev)
        out = dict(recv_prefix=torch.empty(R, C, **i32), recv_end=torch.empty(R, **i32), recv_end_copy=None,
                   channel_prefix=None, rank_prefix=None, send_prefix_copy=None, recv_src_meta=None, nvl_head=None,
                   recv_count=None, rdma_count=None, rdma_end=None, rdma_prefix=None)
        if self.forward:
            out.update(recv_count=torch.empty(R, C, **i32), rdma_count=torch.empty(R // G, C, **i32),
                       rdma_end=torch.empty(R // G, **i32), rdma_prefix=torch.empty(R // G, C, **i32))
        elif self.internode:
            out.update(recv_end_copy=torch.empty(R, **i32), channel_prefix=torch.empty(R, C, **i32),
                       send_prefix_copy=torch.empty(R, C, **i32), recv_src_meta=torch.empty(rows, 2, **i32),
                       nvl_head=torch.empty(rows, 1, **i32))
        else:
            out["rank_prefix"] = torch.empty(R, R, **i32)
        ptrs = {k: (v.data_ptr() if v is not None else 0) for k, v in out.items()}
        params = pack_params("HTProxyPlanRecvParams", meta_out=meta_out.data_ptr(), send_prefix=send_prefix.data_ptr(),
                             num_ranks=R, rank=self.rank, ranks_per_node=G, num_channels=C, node_col=cols["node"],
                             record_ints=cols["ints"], num_rows=rows if out["nvl_head"] is not None else 0, **ptrs)
        grid = max(1, min(1024, (rows + _PLAN_BLOCK - 1) // _PLAN_BLOCK)) if out["nvl_head"] is not None else 1
        self.kernels["ht_proxy_plan_recv"].launch(grid, _PLAN_BLOCK, params, current_stream())
        return out

    @staticmethod
    def plan_handle(out: dict, send_prefix, in_rank, head, rows: int) -> tuple:
        """DeepEP's handle items from plan_recv: the internode 10-tuple (one rank per node) or the
        intranode 6-tuple less its source indices (one node through the proxy)."""
        if out["nvl_head"] is not None:
            return (in_rank, out["send_prefix_copy"], send_prefix, out["channel_prefix"], out["recv_end_copy"],
                    out["recv_prefix"], out["recv_end"], out["recv_src_meta"].view(torch.uint8).view(rows, 8), head,
                    out["nvl_head"])
        return out["rank_prefix"], send_prefix, out["recv_prefix"], in_rank, head

    def _launch_dispatch(self, x, scales, topk_idx, topk_weights, in_rank, send_prefix, recv_prefix, recv_end, outs,
                         channels, rows, ring, num_experts):
        recv_x, recv_scales, recv_idx, recv_w, recv_src = outs
        grid, role = self.role(2 * channels, _BLOCK)
        ptr = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731
        params = pack_params(
            "HTProxyDispatchParams", x=x.data_ptr(), x_scales=ptr(scales), topk_idx=ptr(topk_idx),
            topk_weights=ptr(topk_weights), is_token_in_rank=in_rank.data_ptr(), send_prefix=send_prefix.data_ptr(),
            recv_prefix=recv_prefix.data_ptr(), recv_end=recv_end.data_ptr(), recv_x=recv_x.data_ptr(),
            recv_scales=ptr(recv_scales), recv_topk_idx=ptr(recv_idx), recv_topk_weights=ptr(recv_w),
            recv_src_idx=ptr(recv_src), num_tokens=x.shape[0], hidden_bytes=x.shape[1] * x.element_size(),
            num_scales=scales.shape[1] if scales is not None else 0,
            scale_stride_token=scales.stride(0) if scales is not None else 0,
            scale_stride_col=scales.stride(1) if scales is not None else 0,
            num_topk=topk_idx.shape[1] if topk_idx is not None else 0, num_experts=num_experts, num_ranks=self.R,
            rank=self.rank, num_channels=channels, num_rows=rows, **self.proxy_words(), **ring, **role)
        self.kernels["ht_proxy_dispatch"].launch(grid, _BLOCK, params, current_stream())

    def cached_dispatch(self, x, x_scales, handle, config):
        if self.forward:
            from . import ht_proxy_forward as fwd
            return fwd.cached_dispatch(self, x, x_scales, handle, config)
        check_scales(x_scales)
        st: ProxyNormalPlan = handle.plan
        if x.shape[0] != st.num_tokens:
            raise InvalidArgument("x", f"{st.num_tokens} rows (the token count of the dispatch that made `handle`)",
                                  x.shape[0])
        ns = x_scales.shape[1] if x_scales is not None else 0
        ring = self.ring(plan.dispatch_msg_bytes(x.shape[1] * x.element_size(), ns, 0), st.num_channels, config,
                          "cached dispatch")
        recv_x = torch.empty(st.num_rows, x.shape[1], dtype=x.dtype, device=x.device)
        recv_scales = torch.empty(st.num_rows, ns, dtype=x_scales.dtype, device=x.device) if x_scales is not None else None
        self.start_op(ring, st.num_channels)
        self._launch_dispatch(x.contiguous(), x_scales, None, None, st.in_rank, st.send_prefix, st.recv_prefix,
                              st.recv_end, (recv_x, recv_scales, None, None, None), st.num_channels, st.num_rows, ring,
                              st.num_experts)
        return recv_x, recv_scales

    # -- combine -----------------------------------------------------------------------------------
    def combine(self, x, handle, topk_weights, biases, config):
        if self.forward:
            from . import ht_proxy_forward as fwd
            return fwd.combine(self, x, handle, topk_weights, biases, config)
        st: ProxyNormalPlan = handle.plan
        check_combine_rows(x, st.num_rows, topk_weights, "cuda")
        T, H = st.num_tokens, x.shape[1]
        K = topk_weights.shape[1] if topk_weights is not None else 0
        ring = self.ring(plan.combine_msg_bytes(H, K), st.num_channels, config, "combine")
        self.start_op(ring, st.num_channels)
        out = torch.empty(T, H, dtype=torch.bfloat16, device=x.device)
        out_w = torch.empty(T, K, dtype=torch.float32, device=x.device) if topk_weights is not None else None
        b0, b1 = (b.contiguous() if b is not None else None for b in biases)
        x = x.contiguous()
        topk_weights = topk_weights.contiguous() if topk_weights is not None else None
        ptr = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731
        grid, role = self.role(2 * st.num_channels, _BLOCK)
        params = pack_params(
            "HTProxyCombineParams", x=x.data_ptr(), topk_weights=ptr(topk_weights), bias0=ptr(b0), bias1=ptr(b1),
            out=out.data_ptr(), out_weights=ptr(out_w), is_token_in_rank=st.in_rank.data_ptr(),
            send_head=st.send_head.data_ptr(), send_prefix=st.send_prefix.data_ptr(),
            recv_prefix=st.recv_prefix.data_ptr(), recv_end=st.recv_end.data_ptr(), num_tokens=T, hidden=H,
            num_topk=K, num_ranks=self.R, rank=self.rank, num_channels=st.num_channels, **self.proxy_words(),
            **ring, **role)
        self.kernels["ht_proxy_combine"].launch(grid, _BLOCK, params, current_stream())
        return out, out_w

    # -- failures, lifetime ------------------------------------------------------------------------
    def proxy_failure(self):
        """The proxy's own error (it stopped or failed under a kernel), as an exception."""
        return self.session.failure("normal mode")

    def transport_counters(self) -> dict:
        """The proxy transport's counters (bytes copied, commands): the bench's transport split; with
        the copy role, its fetcher's summed diagnostics (HtDmaRing, dma_ring.h: ``copy_role_passes``
        and the SM cycles of its stages, ``copy_role_pass_ns`` / ``_pass_cycles`` to convert). Reads
        device memory: call between ops (the bench does)."""
        if getattr(self, "proxy", None) is None:
            return {}
        out = dict(self.proxy.transport_counters())
        if self.dma_ctx:
            n = self.num_proxy_threads
            raw = self.drv.memcpy_dtoh(self.dev, self.dma_mem.ptr + self.dma_offsets["state"], DMA_RING_STATE_BYTES * n)
            words = struct.unpack(f"<{DMA_RING_STATE_BYTES // 8 * n}Q", raw)
            per = DMA_RING_STATE_BYTES // 8
            for key, i in _DMA_RING_DIAG_WORDS.items():
                out[f"copy_role_{key}"] = sum(words[r * per + i] for r in range(n))
        return out

    def close(self) -> None:
        """Release this engine's memory (the session stops the proxy before the NVL buffer is freed)."""
        if getattr(self, "proxy", None) is None:
            return
        free_after_device(self.dev, self.mates, self.state, self.dma_mem, self.host)
        self.dma_mem = self.mates = None
        self.dma_ctx = 0
        self.state = self.host = None
        self.proxy = None

    def free(self) -> None:
        self.close()
