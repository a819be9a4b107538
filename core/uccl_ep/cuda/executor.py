"""The `cuda` executor: JIT-compiled kernels over NVLink (CUDA IPC) between the GPUs of one host.

Set-up (collective, at Buffer construction): every rank allocates its NVL buffer
(``num_nvl_bytes``) and low-latency buffer (``num_rdma_bytes``) with the driver, exports CUDA IPC
handles, gathers everyone's through the Buffer's process group, and maps its peers' buffers. A
page of pinned host memory mapped for the device holds the error word that bounded device waits
fill on timeout; every call first checks it and raises `uccl_ep.errors.Timeout` naming the peer,
expert/channel and phase (sticky: a buffer that timed out stays failed).

Streams: kernels run on torch's current stream, so CUDA graphs capture them; see the
``async_finish`` notes in docs/benchmarks.md for what that means for overlap.
"""

from __future__ import annotations

import pickle
import re
import socket
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from ..executor_interface import BufferContext, Executor
from ..errors import InvalidArgument, LimitExceeded, PeerFailure, Timeout, UcclEpError, Unsupported
from ..group_store import GroupStore, heartbeat_interval_s
from . import ht_ce, ht_tuning, liveness, ll_hybrid, ll_proxy, proxy_session
from .runtime import DeviceMemory, MappedHostMemory, abi_enum, driver
from .engine_context import EngineContext
from .shrink import DeviceMask, masked_barrier

__all__ = ["CudaExecutor", "unavailable_reason", "plan_paths"]

def _snake(camel: str) -> str:
    """LLDispatchRecv -> ll_dispatch_recv (acronyms stay one word)."""
    return "_".join(re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z][a-z0-9]*|[A-Z]+", camel)).lower()


@lru_cache(maxsize=None)
def phase_names() -> dict[int, str]:
    """kernel_abi.h's Phase enumerators by value, as the errors name them (kPhaseLLDispatchRecv -> ll_dispatch_recv)."""
    return {v: _snake(k[len("kPhase"):]) for k, v in abi_enum("Phase").items()}


@lru_cache(maxsize=None)
def error_codes() -> SimpleNamespace:
    """kernel_abi.h's ErrorCode enumerators: .timeout, .protocol, .proxy, .topk_duplicate, .peer_gone."""
    return SimpleNamespace(**{_snake(k[len("kErr"):]): v for k, v in abi_enum("ErrorCode").items()})


_MAX_NVLINK_RANKS = 8


def unavailable_reason(ctx: BufferContext) -> str | None:
    """None when the cuda executor can serve ``ctx`` (cheap, no collective)."""
    from .runtime import driver_unavailable_reason
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    why = driver_unavailable_reason()
    if why:
        return why
    from . import gpu_transport, ll_proxy
    multi_host = gpu_transport.multi_host_guess(ctx)
    if ll_proxy.proxy_forced(ctx) or ((multi_host or ctx.topology.is_internode) and ctx.low_latency_mode):
        why = ll_proxy.unavailable_reason(ctx)  # LL through the proxy (forced, or peers on other nodes)
        if why:
            return why
    if ctx.topology.is_internode:
        from .ht_proxy import unavailable_reason as internode_reason
        why = internode_reason(ctx)  # normal mode goes through the proxy between nodes
        if why:
            return why
    if not multi_host and ctx.num_ranks > _MAX_NVLINK_RANKS:
        return f"{ctx.num_ranks} ranks on one host; NVLink kernels support at most {_MAX_NVLINK_RANKS}"
    try:
        from .jit import find_hipcc, find_nvcc
        from .runtime import torch_gpu_runtime
        find_hipcc() if torch_gpu_runtime() == "hip" else find_nvcc()
    except Exception as e:  # noqa: BLE001 - the reason is reported, auto falls back
        return str(e)
    return None


def plan_paths(ctx: BufferContext, devices: list[tuple[str, int]]) -> tuple[bool, bool, bool]:
    """(multi_host, normal mode through the proxy, LL through the proxy) for a group whose rank r
    runs on host devices[r][0], GPU devices[r][1]; `Unsupported` when no path fits.

    NOTES: ranks of different nodes (several hosts, or ranks_per_node below the group size) reach
    each other only through the proxy (normal mode and LL), over ipc+fabric with GPU memory registered
    for the NIC between hosts (gpu_transport.py); NVLink kernels and IPC maps stay within one host. LL
    between nodes is hybrid: the proxy kernels store to the peers of the rank's own node over NVLink
    (ll_hybrid.ll_peer_paths), unless the proxy is forced."""
    from .ht_proxy import serves as ht_through_proxy
    if len(set(devices)) != len(devices):
        raise Unsupported(f"the cuda executor needs one distinct GPU per rank on each host; got (host, device) "
                          f"{devices}")
    multi_host = len({h for h, _ in devices}) > 1
    ht_via_proxy = ht_through_proxy(ctx)
    if multi_host:
        hosts = [h for h, _ in devices]
        G = ctx.topology.ranks_per_node
        if not ht_via_proxy or any(len({hosts[r] for r in range(n, n + G)}) > 1 for n in range(0, len(hosts), G)):
            raise Unsupported(f"ranks on several hosts with nodes of {G} ranks spanning hosts {sorted(set(hosts))}: "
                              "a node's ranks must share a host (leave ranks_per_node / UCCL_EP_RANKS_PER_NODE "
                              "unset, or a divisor of the ranks per host)")
    return multi_host, ht_via_proxy, ll_proxy.proxy_forced(ctx) or multi_host or ctx.topology.is_internode


class DeviceRecord(NamedTuple):
    """What each rank publishes when its Buffer is built (gathered by every rank)."""
    host: str
    device: int
    nvl_handle: bytes | None          # IPC handle of the NVL buffer
    ll_handle: bytes | None           # IPC handle of the LL buffer
    ht_block_sizes: Any               # ht_tuning.warps_per_peer, or the error text it raised
    ll_proxy_settings: Any            # ll_proxy.shared_settings
    ht_ce_settings: Any               # ht_ce.shared_settings
    process: Any                      # liveness.process_record
    ht_proxy_settings: Any            # ht_proxy.shared_settings


class CudaExecutor(Executor):
    name = "cuda"
    device_type = "cuda"

    def __init__(self, ctx: BufferContext, owner: object) -> None:
        super().__init__(ctx, owner)
        self.drv = driver()
        self.device = torch.cuda.current_device()
        self.timeout_ns = int(ctx.gpu_timeout_s * 1e9)
        self._failure: Exception | None = None
        self.errors = MappedHostMemory(self.device, 16384)  # error word at 0, HT receive counts at 4 KiB
        self.error_dev_ptr = self.errors.dev_ptr
        # One proxy session serves every engine that goes through the proxy, over one registered
        # region: with both buffers and normal mode through the proxy (which puts LL through it too:
        # plan_paths), one allocation holds both, the NVL buffer first (proxy_session.shared_region).
        from . import ht_proxy
        from .ht_proxy import serves as ht_through_proxy
        self.region = None
        if ctx.num_nvl_bytes and ctx.num_rdma_bytes and ht_through_proxy(ctx):
            self.region, self.nvl_mem, self.ll_mem = proxy_session.shared_region(self.device, ctx.num_nvl_bytes,
                                                                                 ctx.num_rdma_bytes)
        else:
            self.nvl_mem = DeviceMemory(self.device, ctx.num_nvl_bytes) if ctx.num_nvl_bytes else None
            self.ll_mem = DeviceMemory(self.device, ctx.num_rdma_bytes) if ctx.num_rdma_bytes else None
        # The rank mask the LL kernels read (shrink.py), and the host's bounded exchanges and barriers.
        self.mask = DeviceMask(self.device, ctx.num_ranks)
        self.channel = GroupStore(ctx.group, ctx.timeout_s, "cuda")
        try:  # normal-mode block sizes: every rank must agree (checked below, on every rank alike)
            ht_sizes = ht_tuning.warps_per_peer(ctx.num_ranks, ctx.tuning)
        except UcclEpError as e:
            ht_sizes = str(e)
        mine = DeviceRecord(
            host=socket.gethostname(), device=self.device, nvl_handle=self.nvl_mem.ipc_handle() if self.nvl_mem else None,
            ll_handle=self.ll_mem.ipc_handle() if self.ll_mem else None, ht_block_sizes=ht_sizes,
            ll_proxy_settings=ll_proxy.shared_settings(ctx.tuning), ht_ce_settings=ht_ce.shared_settings(ctx.tuning),
            process=liveness.process_record(), ht_proxy_settings=ht_proxy.shared_settings(ctx.tuning))
        infos = [DeviceRecord(*pickle.loads(b)) for b in self.channel.all_gather(pickle.dumps(tuple(mine)),
                                                                                "Buffer() (device records)")]
        devices = [(i.host, i.device) for i in infos]
        self.multi_host, self.ht_through_proxy, self.ll_through_proxy = plan_paths(ctx, devices)
        # The path of each peer's LL traffic: NVLink (a node's peers, also on the proxy path), or the proxy.
        self.ll_paths = ll_hybrid.ll_peer_paths(ctx.rank, ctx.num_ranks, ctx.topology.ranks_per_node, self.ll_through_proxy,
                                                ll_proxy.proxy_forced(ctx))
        ll_nvlink = [r for r, p in enumerate(self.ll_paths) if p == ll_hybrid.NVLINK] if self.ll_mem is not None else []
        if self.nvl_mem is not None and not self.ht_through_proxy:
            ht_tuning.check_same_block_sizes([i.ht_block_sizes for i in infos])
            ht_ce.check_same_settings([i.ht_ce_settings for i in infos])
        if self.ll_mem is not None and self.ll_through_proxy:
            ll_proxy.check_same_shared_settings([i.ll_proxy_settings for i in infos])
        if self.nvl_mem is not None and self.ht_through_proxy:
            ht_proxy.check_same_shared_settings([i.ht_proxy_settings for i in infos])
        for r, (_, d) in enumerate(devices):
            if r != ctx.rank and (not (self.ht_through_proxy and self.ll_through_proxy) or r in ll_nvlink):
                if not self.drv.can_access_peer(self.device, d):
                    raise Unsupported(f"GPU {self.device} cannot access peer GPU {d} (rank {r}) directly; the cuda "
                                      "executor needs NVLink/PCIe peer access" + (
                                          " for the low-latency peers of a node (or pass allow_nvlink_for_low_latency_"
                                          "mode=False: every peer through the proxy)" if self.ll_through_proxy else ""))
        if self.region is not None and not (self.ht_through_proxy and self.ll_through_proxy):
            raise RuntimeError(f"rank {ctx.rank}: one proxy region was laid out for both modes, but plan_paths "
                               f"routes normal mode {'through' if self.ht_through_proxy else 'around'} the proxy and "
                               f"low-latency mode {'through' if self.ll_through_proxy else 'around'} it")
        self.session = None
        # Normal mode through the proxy: its transport reaches the peers' NVL buffers itself.
        self.nvl_peer_base = [] if self.ht_through_proxy else self._open_peers(self.nvl_mem, [i.nvl_handle for i in infos])
        # The LL proxy path's transport reaches the peers' LL buffers itself (ipc: once per process); its
        # kernels store to the NVLink peers of the rank's node (hybrid) through these maps (0: no map).
        self.ll_peer_base = [] if self.ll_through_proxy and not ll_nvlink else \
            self._open_peers(self.ll_mem, [i.ll_handle for i in infos], None if not self.ll_through_proxy else ll_nvlink)
        self._ll = None
        self._ht = None
        # A peer on this host whose process exits fails the buffer at once (PeerFailure), instead of
        # each NVLink wait on it timing out; shrink mode masks failed peers instead (liveness.py).
        self._watch = None if ctx.enable_shrink else liveness.PeerWatch(
            ctx.rank, [i.process for i in infos], self._peer_gone, heartbeat_interval_s(ctx.timeout_s))
        # What the engines and the proxy session get of this executor (engine_context.py).
        self.engine_ctx = EngineContext(
            ctx=ctx, device=self.device, drv=self.drv, timeout_ns=self.timeout_ns, errors=self.errors,
            error_dev_ptr=self.error_dev_ptr, owner=owner, mask_ptr=self.mask.ptr, multi_host=self.multi_host,
            nvl_mem=self.nvl_mem, nvl_peer_base=self.nvl_peer_base, ll_mem=self.ll_mem, ll_peer_base=self.ll_peer_base,
            ll_paths=tuple(self.ll_paths), region=self.region, check_error=self.check_error, host_barrier=self.host_barrier,
            all_gather=self.channel.all_gather)
        try:
            # NOTES: the proxy session's bootstrap is collective: opened here, while every rank
            # constructs its Buffer (as DeepEP sets everything up in the constructor), once for every
            # engine that goes through the proxy, not at a mode's first call, which a rank that fails
            # (shrink mode) never makes.
            from .ht_proxy import scope_reason
            need_ht = self.nvl_mem is not None and self.ht_through_proxy and scope_reason(ctx, self.multi_host) is None
            self.session = proxy_session.open_for(self.engine_ctx, need_ht, self.ll_mem is not None and self.ll_through_proxy)
            if self.nvl_mem is not None and (not self.ht_through_proxy or need_ht):
                # NOTES: the normal-mode kernels are loaded (compiled on a cold JIT cache) before the
                # barrier below, so the ranks leave the constructor together: loaded lazily at the first
                # call, one rank compiling while its peer already waits made the peer's GPU wait time out.
                self._ht_engine()
            # NOTES: both engines exist before any op when their copy work shares the session's copy
            # rings: a CUDA graph captured of one mode hands the rings over from the other
            # (proxy_session.claim_copy_rings) only if that one is known at capture.
            shared_rings = self.session is not None and self.session.copy_kernel and need_ht
            if self.ll_mem is not None and self.ll_through_proxy and (ctx.low_latency_mode or shared_rings):
                self._ll_engine()
            self.host_barrier("Buffer() (buffers mapped)")
        except BaseException:
            if self._watch is not None:
                self._watch.close()
            for close in [getattr(e, "close", None) for e in (self._ll, self._ht)] + [getattr(self.session, "close", None)]:
                try:
                    close and close()
                except Exception:  # noqa: BLE001 - the constructor's own error is the one raised
                    pass
            raise

    def _open_peers(self, mem: DeviceMemory | None, handles: list, only: list[int] | None = None) -> list[int]:
        """Each rank's buffer mapped here (this rank's own; with ``only``, 0 for the ranks not in it)."""
        if mem is None:
            return []
        return [mem.ptr if r == self.ctx.rank else (mem.open_peer(h) if only is None or r in only else 0)
                for r, h in enumerate(handles)]

    # -- errors, barrier -------------------------------------------------------------------------
    def _peer_gone(self, peer: int, why: str) -> None:
        """PeerWatch: `peer`'s process exited. Recorded in the error word the kernels' waits watch."""
        self._peer_gone_why = why
        self.drv.raise_host_error(self.errors.host_ptr, error_codes().peer_gone, abi_enum("Phase")["kPhaseLiveness"],
                                  self.ctx.rank, peer)

    def check_error(self) -> None:
        """Raise the error a kernel recorded (sticky)."""
        if self._failure is not None:
            raise self._failure
        if self.errors.int32(0) == 0:
            return
        code, phase, rank, peer, expert, waited_us = self.errors.int32_array(0, 6)
        if code == -1:  # a kernel is still filling it in
            torch.cuda.synchronize(self.device)
            code, phase, rank, peer, expert, waited_us = self.errors.int32_array(0, 6)
        what = phase_names().get(phase, f"phase {phase}")
        err = error_codes()
        if code == err.peer_gone:
            self._failure = PeerFailure(rank, peer, what, getattr(self, "_peer_gone_why", "its process exited") +
                                        "; the buffer is unusable now (destroy it and build a new one on the "
                                        "surviving ranks)")
        elif code == err.timeout and what in ("ll_proxy_copy", "ht_proxy_copy"):  # the copy kernel waited on its own proxy, not a peer
            self._failure = Timeout(rank, rank, what, waited_us / 1e6,
                                    outstanding=f"copy ring of proxy thread {expert}",
                                    hint="this rank's CPU proxy did not queue the copies of the Writes it was "
                                         "given (starved of CPU, or stopped); the buffer is unusable now "
                                         "(destroy it and build a new one)")
        elif code == err.timeout and self._peer_dead(peer):
            # NOTES: shrink mode excludes every peer in the proxy session, so a dead peer no longer
            # fails the proxy under normal mode's kernels; their bounded wait names it, and the proxy
            # knows it died.
            self._failure = PeerFailure(rank, peer, what, "the proxy marked it dead (it stopped responding); the "
                                        "buffer is unusable now (destroy it and build a new one on the surviving ranks)")
        elif code == err.timeout:
            self._failure = Timeout(rank, peer, what, waited_us / 1e6, outstanding=f"expert/channel {expert}",
                                    hint="the peer did not take part in this operation in time; the buffer is "
                                         "unusable now (destroy it and build a new one)")
        elif code == err.proxy and what.startswith("ht_") and hasattr(self._ht, "proxy_failure"):
            self._failure = self._ht.proxy_failure()
        elif code == err.proxy and self._ll is not None and hasattr(self._ll, "proxy_failure"):
            self._failure = self._ll.proxy_failure()
        elif code == err.topk_duplicate:
            self._failure = InvalidArgument("topk_idx", "distinct expert ids in each row (a token selects an expert at "
                                            "most once; -1 may repeat)", f"expert {expert} more than once in row {peer} "
                                            f"(found by {what} on rank {rank})",
                                            hint="the peers' part of that op is lost; destroy the buffer and build "
                                                 "a new one")
        elif code == err.protocol and what == "ht_notify" and expert >= 0:
            self._failure = LimitExceeded("num_worst_tokens", f"rows received by rank {rank}", expert,
                                          getattr(self, "_last_worst", 0) or 0)
        else:
            from ..errors import PeerProtocolError
            self._failure = PeerProtocolError(f"rank {rank}: device error {code} in {what} (peer {peer})")
        raise self._failure

    def _peer_dead(self, peer: int) -> bool:
        """Whether the proxy session marked `peer` dead (shrink mode's excluded peers)."""
        session = getattr(self, "session", None)
        return (session is not None and not session.closed and 0 <= peer < self.ctx.num_ranks
                and bool(session.proxy.peer_dead(peer)))

    def host_barrier(self, phase: str = "barrier", masks: bool = False) -> None:
        """Every rank here, within the timeout (a Timeout / PeerFailure names the missing one). With
        ``masks`` (the low-latency paths and destroy) in shrink mode, masked ranks are left out and a
        missing rank is masked (shrink.masked_barrier)."""
        masked_barrier(self.channel, self.mask if masks and self.ctx.enable_shrink else None, phase)

    # -- shrink mode: the device mask behind Buffer.low_latency_*_mask_buffer ------------------------
    def ll_mask_update(self, rank: int, mask: bool) -> None:
        self.mask.update(rank, mask)

    def ll_mask_query(self, out: torch.Tensor) -> None:
        self.mask.query(out)

    def ll_mask_clean(self) -> None:
        self.mask.clean()

    def barrier(self) -> None:
        torch.cuda.synchronize(self.device)
        self.check_error()
        self.host_barrier("barrier", masks=True)

    # -- low-latency -------------------------------------------------------------------------------
    def _ll_engine(self):
        if self._ll is None:
            if self.ll_mem is None:
                raise LimitExceeded("num_rdma_bytes", "bytes of the low-latency buffer", 1, 0,
                                    hint="build the Buffer with num_rdma_bytes = Buffer.get_low_latency_rdma_size_hint(...)")
            from .ll import LowLatencyEngine
            self._ll = ll_proxy.ProxyLowLatencyEngine(self.engine_ctx, self.session) if self.ll_through_proxy else \
                LowLatencyEngine(self.engine_ctx)
        return self._ll

    def low_latency_dispatch(self, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0, masked,
                             cumulative_stats, wait_stats, recv_follows=False):
        if self._failure is not None or self.errors.int32(0):  # check_error's question, on every eager op
            self.check_error()
        self._check_cuda("x", x)
        if topk_idx.shape[1] > 32:
            raise LimitExceeded("topk_idx", "top-k columns of the CUDA low-latency kernels", topk_idx.shape[1], 32)
        return (self._ll or self._ll_engine()).dispatch(self.owner, x, topk_idx, num_max, num_experts, use_fp8,
                                                        round_scale, use_ue8m0, masked, cumulative_stats, wait_stats,
                                                        recv_follows)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy=False,
                            recv_follows=False, use_logfmt=False):
        if self._failure is not None or self.errors.int32(0):
            self.check_error()
        self._check_cuda("x", x)
        if topk_idx.shape[1] > 32:
            raise LimitExceeded("topk_idx", "top-k columns of the CUDA low-latency kernels", topk_idx.shape[1], 32)
        return (self._ll or self._ll_engine()).combine(x, topk_idx, topk_weights, handle, masked, out, wait_stats,
                                                       zero_copy, recv_follows, use_logfmt=use_logfmt)

    def clean_low_latency_buffer(self, num_max, hidden, num_experts):
        self.check_error()
        eng = self._ll_engine()
        eng.ensure_layout(num_max, hidden, num_experts)
        eng.clean()

    def get_next_low_latency_combine_buffer(self, handle):
        self.check_error()
        return self._ll_engine().next_combine_buffer(handle)

    # -- normal mode --------------------------------------------------------------------------------
    def _ht_engine(self):
        if self._ht is None and self.ht_through_proxy:
            from .ht_proxy import ProxyNormalEngine
            self._ht = ProxyNormalEngine(self.engine_ctx, self.session)
        if self._ht is None:
            from .ht import NormalEngine
            self._ht = NormalEngine(self.engine_ctx)
        return self._ht

    def get_dispatch_layout(self, topk_idx, num_experts):
        self.check_error()
        self._check_cuda("topk_idx", topk_idx)
        return self._ht_engine().layout(topk_idx, num_experts)

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        self.check_error()
        self._check_cuda("x", x)
        self._last_worst = num_worst_tokens
        return self._ht_engine().dispatch(x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                                          num_tokens_per_expert, expert_alignment, num_worst_tokens, config)

    def cached_dispatch(self, x, x_scales, handle, config):
        self.check_error()
        self._check_cuda("x", x)
        return self._ht_engine().cached_dispatch(x, x_scales, handle, config)

    def combine(self, x, handle, topk_weights, biases, config):
        self.check_error()
        self._check_cuda("x", x)
        return self._ht_engine().combine(x, handle, topk_weights, biases, config)

    # -- raw buffers, lifetime ---------------------------------------------------------------------
    def _check_cuda(self, name: str, t: torch.Tensor) -> None:
        # NOTES: get_device() (-1 off the GPU) first: on every op's host path, and cheaper than
        # building a device object; the full check only for the error message
        if t.get_device() != self.device or t.device.type != "cuda":
            raise InvalidArgument(name, f"a tensor on cuda:{self.device} (the cuda backend's device)", str(t.device))

    def get_local_buffer_tensor(self, use_rdma_buffer):
        mem = self.ll_mem if use_rdma_buffer else self.nvl_mem
        if mem is None:
            return torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", self.device))
        return mem.tensor()

    def release_at_exit(self) -> None:
        """At interpreter exit (Buffer not destroyed): stop the peer watch and the proxy session only.
        NOTES: no device synchronize here: a kernel still waiting on a gone peer would hold the exit up
        to the device timeout, and the process's end releases the device memory anyway."""
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.close()
        if getattr(self, "session", None) is not None:
            self.session.close()

    def destroy(self):
        """Release everything, also with a peer gone or the GPU context failed: every step runs (each
        is bounded), and the first error is raised after the last."""
        watch = getattr(self, "_watch", None)
        steps = [lambda: watch and watch.close(),  # before the error word it writes is freed
                 lambda: torch.cuda.synchronize(self.device)]
        if self._ll is not None and hasattr(self._ll, "close"):
            steps.append(self._ll.close)  # the proxy stops before the LL buffer it copies into is freed
        if self._ht is not None and hasattr(self._ht, "close"):
            steps.append(self._ht.close)  # likewise for normal mode through the proxy (the NVL buffer)
        if getattr(self, "session", None) is not None:
            steps.append(self.session.close)  # the proxy stops before the region it copies into is freed
        steps += [m.free for m in (self.nvl_mem, self.ll_mem, getattr(self, "region", None)) if m is not None]
        steps += [self.mask.free, self.channel.close]
        if self._ll is not None:
            steps.append(lambda: self._ll.work is not None and self._ll.work.free())
        if self._ht is not None:
            steps.append(self._ht.free)
        steps.append(self.errors.free)
        first = None
        for step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the rest is released all the same
                first = first or e
        if first is not None:
            raise first
