"""Autograd dispatch/combine for Megatron's flex dispatcher, on `uccl_ep.Buffer`.

Same contract as Megatron-Core's DeepEP path (megatron/core/transformer/moe/fused_a2a.py), so the
flex dispatcher's pre/post-processing is reused unchanged:

- dispatch forward: layout + fresh dispatch -> (recv_x, recv_topk_idx (local ids, -1 masked),
  recv_topk_weights fp32, tokens_per_local_expert (CPU int64 tensor), handle);
- dispatch backward: weighted combine of the grads with the grads of the received weights;
- combine forward: unweighted combine (sum of each token's expert rows);
- combine backward: cached dispatch of the grads with the forward handle.

One Buffer per process, rebuilt when the group changes or a call needs more buffer memory
(DeepEP's sizing rule: the max over the dispatch and combine configs' size hints). Backward
passes use the Buffer that made the forward's handle (a uccl_ep handle belongs to its Buffer),
so a rebuild between forward and backward cannot orphan a handle.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

import uccl_ep
from uccl_ep import EventHandle, EventOverlap

from . import settings

__all__ = ["get_buffer", "reset_buffer", "hidden_bytes_of", "UcclDispatch", "UcclCombine",
           "uccl_dispatch", "uccl_combine"]

_buffer: Optional[uccl_ep.Buffer] = None


def hidden_bytes_of(x: torch.Tensor) -> int:
    # NOTES: sized for 2-byte elements at least, so one buffer serves bf16 activations and
    # their (possibly fp32) grads alike; fp32 rows are checked again by the Buffer itself.
    return x.size(1) * max(x.element_size(), 2)


def _needed_bytes(num_ranks: int, hidden_bytes: int) -> tuple[int, int]:
    nvl = rdma = 0
    for cfg in (uccl_ep.Buffer.get_dispatch_config(num_ranks), uccl_ep.Buffer.get_combine_config(num_ranks)):
        nvl = max(nvl, cfg.get_nvl_buffer_size_hint(hidden_bytes, num_ranks))
        rdma = max(rdma, cfg.get_rdma_buffer_size_hint(hidden_bytes, num_ranks))
    return nvl, rdma


def get_buffer(group: dist.ProcessGroup, hidden_bytes: int) -> uccl_ep.Buffer:
    """The process's Buffer for ``group``, (re)built when missing, for another group or too small."""
    global _buffer
    nvl, rdma = _needed_bytes(group.size(), hidden_bytes)
    buf = _buffer
    if buf is None or buf.group is not group or buf.num_nvl_bytes < nvl or buf.num_rdma_bytes < rdma:
        if buf is not None:
            nvl, rdma = max(nvl, buf.num_nvl_bytes), max(rdma, buf.num_rdma_bytes)
        _buffer = uccl_ep.Buffer(group, nvl, rdma, **settings.current().buffer_kwargs())
    return _buffer


def reset_buffer() -> None:
    """Forget the cached Buffer (tests; a new process group)."""
    global _buffer
    _buffer = None


def _start_event(async_finish: bool) -> Optional[EventOverlap]:
    # NOTES: like DeepEP, the comm stream waits for everything queued so far on the compute
    # stream; on CPU tensors the event is empty and the wait a no-op.
    return EventOverlap(EventHandle()) if async_finish else None


class UcclDispatch(torch.autograd.Function):
    """Fresh dispatch of ``x`` to the ranks owning each token's top-k experts."""

    @staticmethod
    def forward(ctx, x, topk_idx, topk_weights, num_experts, group, async_finish=False,
                allocate_on_comm_stream=False):
        buffer = get_buffer(group, hidden_bytes_of(x))
        start = _start_event(async_finish)
        per_rank, per_rdma_rank, per_expert, in_rank, layout_event = buffer.get_dispatch_layout(
            topk_idx, num_experts, previous_event=start, async_finish=async_finish,
            allocate_on_comm_stream=allocate_on_comm_stream)
        recv_x, recv_idx, recv_weights, recv_counts, handle, done = buffer.dispatch(
            x, topk_idx=topk_idx, topk_weights=topk_weights, num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            previous_event=layout_event, async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream)
        if async_finish:
            done.current_stream_wait()
        ctx.buffer, ctx.handle = buffer, handle
        ctx.async_finish, ctx.allocate_on_comm_stream = async_finish, allocate_on_comm_stream
        # NOTES: Megatron expects the per-local-expert counts as a host tensor (it calls .sum().item()).
        return recv_x, recv_idx, recv_weights, torch.tensor(recv_counts, dtype=torch.int64), handle

    @staticmethod
    def backward(ctx, grad_recv_x, grad_recv_idx, grad_recv_weights, grad_counts, grad_handle):
        buffer = ctx.buffer
        weights = None if grad_recv_weights is None else grad_recv_weights.float().contiguous()
        grad_x, grad_weights, done = buffer.combine(
            grad_recv_x.contiguous(), ctx.handle, topk_weights=weights, previous_event=_start_event(ctx.async_finish),
            async_finish=ctx.async_finish, allocate_on_comm_stream=ctx.allocate_on_comm_stream)
        if ctx.async_finish:
            done.current_stream_wait()
        return grad_x, None, grad_weights, None, None, None, None


class UcclCombine(torch.autograd.Function):
    """Sum each token's expert outputs back on the rank the token came from."""

    @staticmethod
    def forward(ctx, x, group, handle, async_finish=False, allocate_on_comm_stream=False):
        buffer = get_buffer(group, hidden_bytes_of(x))
        combined, _, done = buffer.combine(x, handle=handle, previous_event=_start_event(async_finish),
                                           async_finish=async_finish,
                                           allocate_on_comm_stream=allocate_on_comm_stream)
        if async_finish:
            done.current_stream_wait()
        ctx.buffer, ctx.handle = buffer, handle
        ctx.async_finish, ctx.allocate_on_comm_stream = async_finish, allocate_on_comm_stream
        return combined, None

    @staticmethod
    def backward(ctx, grad_combined, grad_none=None):
        buffer = ctx.buffer
        grad_x, _, _, _, _, done = buffer.dispatch(
            grad_combined.contiguous(), handle=ctx.handle, previous_event=_start_event(ctx.async_finish),
            async_finish=ctx.async_finish, allocate_on_comm_stream=ctx.allocate_on_comm_stream)
        if ctx.async_finish:
            done.current_stream_wait()
        return grad_x, None, None, None, None


def uccl_dispatch(x, topk_idx, topk_weights, num_experts, group, async_finish=False, allocate_on_comm_stream=False):
    return UcclDispatch.apply(x.contiguous(), topk_idx, topk_weights, num_experts, group, async_finish,
                              allocate_on_comm_stream)


def uccl_combine(x, group, handle, async_finish=False, allocate_on_comm_stream=False):
    return UcclCombine.apply(x.contiguous(), group, handle, async_finish, allocate_on_comm_stream)
