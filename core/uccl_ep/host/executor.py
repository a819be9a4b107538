"""`backend="host"`: the LL and HT protocols run by host threads over CPU tensors, through the
real queue -> proxy -> transport -> counter path (the same TransferCmds the kernels push).

Planning (who sends which token where, output order, handles) is vectorized torch on the host;
moving bytes is native: `push_counted` (LL per-token writes + fenced count signals) and the
`RingEngine` (HT chunked ordered writes through credit-controlled rings). See ll.py, ht.py and
ht_internode.py for each protocol, layout.py for counters and region areas.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .. import env
from ..executor_interface import BufferContext, Executor
from ..errors import InvalidArgument
from ..protocol.layout import NUM_COUNTERS, region_plan
from ..proxy import check_protocol_limits, native
from ..proxy.session import ProxySession
from . import ht, ll

__all__ = ["HostExecutor", "unavailable_reason", "machine_unavailable_reason"]


def machine_unavailable_reason() -> str | None:
    """None when this machine can run the host executor (native module with its engine, and the
    transport UCCL_EP_TRANSPORT names, if any, usable), else why not."""
    try:
        C = native()
    except Exception as e:  # noqa: BLE001 - MissingDependency and friends
        return f"native module unavailable: {e}"
    if not hasattr(C, "RingEngine"):
        return "native module built without the host executor"
    name = env.get("UCCL_EP_TRANSPORT")
    if name != "auto":
        reason = C.transport_unavailable_reason(name)
        if reason:
            return f"transport '{name}' unavailable: {reason}"
    return None


def _require_cpu(op: str, name: str, tensor: torch.Tensor) -> None:
    # NOTES: the host executor reads and writes tensor memory from host threads; a CUDA tensor's
    # pointer is not host memory, so it must never get here (backend="auto" does not route GPU
    # tensors to this executor; an explicit backend="host" with GPU tensors is the caller's error).
    if tensor.device.type != "cpu":
        raise InvalidArgument(f"{op}: {name}", "a CPU tensor (the host executor serves CPU tensors; GPU tensors "
                              "need backend='cuda' or 'reference')", f"a tensor on {tensor.device}")


def unavailable_reason(ctx: BufferContext) -> str | None:
    """None when the host executor can serve ``ctx``, else why not."""
    why = machine_unavailable_reason()
    if why:
        return why
    if torch.cuda.is_available() and "nccl" in str(torch.distributed.get_backend(ctx.group)).lower():
        return "the group is NCCL (GPU tensors); the host executor serves CPU tensors"
    return None


def _proxy_threads(ctx: BufferContext) -> int:
    if ctx.options and ctx.options.get("num_proxy_threads"):  # Buffer(num_proxy_threads=...)
        return int(ctx.options["num_proxy_threads"])
    if env.is_set("UCCL_EP_NUM_PROXY_THREADS"):
        return int(env.get("UCCL_EP_NUM_PROXY_THREADS"))
    # NOTES: every local rank runs its own proxy; more threads than cores only adds contention.
    local = ctx.topology.ranks_per_node if not ctx.topology.is_internode else ctx.topology.ranks_per_node
    return max(1, min(int(env.get("UCCL_EP_NUM_PROXY_THREADS")), (os.cpu_count() or 2) // max(local, 1)))


class HostExecutor(Executor):
    name = "host"
    device_type = "cpu"

    def __init__(self, ctx: BufferContext, owner: object) -> None:
        super().__init__(ctx, owner)
        check_protocol_limits(ctx.num_ranks, num_rdma_bytes=ctx.num_rdma_bytes, num_nvl_bytes=ctx.num_nvl_bytes)
        self.rank, self.num_ranks = ctx.rank, ctx.num_ranks
        self.topology = ctx.topology
        self.timeout_s = ctx.timeout_s
        self.shared_bytes, self.meta = region_plan(ctx.num_ranks, ctx.num_nvl_bytes, ctx.num_rdma_bytes)
        options = dict(ctx.options.get("host", {})) if ctx.options else {}
        # NOTES: one proxy session per Buffer, opened here (the bootstrap is collective) and shared by
        # normal and low-latency mode, which use one counter plan and one region (protocol/layout.py).
        self.session = ProxySession(ctx.group, rank=ctx.rank, num_ranks=ctx.num_ranks, num_counters=NUM_COUNTERS,
                                    region_bytes=self.shared_bytes + self.meta.bytes,
                                    num_threads=options.get("proxy_threads", _proxy_threads(ctx)),
                                    fifos_per_thread=2, timeout_s=ctx.timeout_s,
                                    ranks_per_node=ctx.topology.ranks_per_node, transport=options.get("transport"),
                                    fault=options.get("fault"))
        self.proxy = self.session.proxy
        C = native()
        self.C = C
        self.engine = C.RingEngine(self.proxy)
        self.threads = max(1, min(4, os.cpu_count() or 1))
        self.region = torch.from_numpy(self.proxy.region())
        self.counters = torch.from_numpy(self.proxy.counters())
        # Counter values already accounted for, per (source, counter): counters only grow.
        self.seen = np.zeros((self.num_ranks, NUM_COUNTERS), dtype=np.int64)
        self.excluded = [False] * self.num_ranks  # mirrors Proxy.set_excluded (LL shrink masks)
        self.lost: set[int] = set()  # peers masked because they missed a signal (shrink mode)
        if ctx.enable_shrink:  # from the start: a peer that dies before the first op is masked, not fatal
            ll._sync_exclusions(self, set())
        self.ht_ops = 0
        self._ll_buffer_idx = 0
        self._raw_buffers: dict[bool, torch.Tensor] = {}

    # ---- helpers shared by the protocol modules --------------------------------------------------
    def next_ht_parity(self) -> int:
        parity = self.ht_ops % 2
        self.ht_ops += 1
        return parity

    def barrier(self) -> None:
        if self.ctx.enable_shrink:  # masked peers left out, missing ones masked (ll.masked_barrier)
            ll.masked_barrier(self, self._masked(), "barrier")
            return
        idx = self.proxy.push(0, *self.C.encode_barrier(False), self.timeout_s)
        self.proxy.wait_completion(0, idx, self.timeout_s, "barrier")

    def _masked(self) -> set:
        return getattr(self.owner, "_masked_ranks", set())

    # ---- normal mode -------------------------------------------------------------------------------
    def _ht(self):
        if self.topology.is_internode:
            from . import ht_internode
            return ht_internode
        return ht

    def get_dispatch_layout(self, topk_idx, num_experts):
        _require_cpu("get_dispatch_layout", "topk_idx", topk_idx)
        from ..refs.normal import dispatch_layout
        return dispatch_layout(topk_idx, num_experts, self.topology)

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        _require_cpu("dispatch", "x", x)
        return self._ht().dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                            num_tokens_per_expert, expert_alignment, num_worst_tokens, config)

    def cached_dispatch(self, x, x_scales, handle, config):
        _require_cpu("dispatch", "x", x)
        return self._ht().cached_dispatch(self, x, x_scales, handle, config)

    def combine(self, x, handle, topk_weights, biases, config):
        _require_cpu("combine", "x", x)
        return self._ht().combine(self, x, handle, topk_weights, biases, config)

    # ---- low-latency mode --------------------------------------------------------------------------
    def low_latency_dispatch(self, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0,
                             masked, cumulative_stats, wait_stats, recv_follows=False):
        _require_cpu("low_latency_dispatch", "x", x)
        set_idx = self._ll_buffer_idx
        self._ll_buffer_idx ^= 1
        return ll.dispatch(self, set_idx, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0,
                           masked, cumulative_stats, wait_stats)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy=False,
                            recv_follows=False, use_logfmt=False):
        _require_cpu("low_latency_combine", "x", x)
        set_idx = self._ll_buffer_idx
        self._ll_buffer_idx ^= 1
        return ll.combine(self, set_idx, x, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy,
                          use_logfmt)

    def get_next_low_latency_combine_buffer(self, handle):
        return ll.combine_send_view(self, self._ll_buffer_idx, handle)

    def clean_low_latency_buffer(self, num_max, hidden, num_experts):
        lay = ll.LowLatencyLayout(num_max, hidden, self.num_ranks, num_experts, self.shared_bytes)
        self.barrier()
        self.region[:lay.total_bytes].zero_()
        self.barrier()

    # ---- raw buffers, lifetime ---------------------------------------------------------------------
    def get_local_buffer_tensor(self, use_rdma_buffer):
        nbytes = self.ctx.num_rdma_bytes if use_rdma_buffer else self.ctx.num_nvl_bytes
        raw = self._raw_buffers.get(use_rdma_buffer)
        if raw is None:
            raw = torch.zeros(nbytes, dtype=torch.uint8)
            self._raw_buffers[use_rdma_buffer] = raw
        return raw

    def destroy(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()
            self.proxy = None
        self._raw_buffers.clear()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter teardown
        try:
            self.destroy()
        except Exception:  # noqa: BLE001
            pass
