"""The reference executor: DeepEP V1 semantics in pure torch over torch.distributed.

Slow by design (every op is a few collectives) and exact by design: it is what the CUDA kernels
and the host executor are tested against.
"""

from __future__ import annotations

import torch

from ..executor_interface import BufferContext, Executor
from ..errors import InvalidArgument
from . import low_latency, normal
from .comm import GroupComm

__all__ = ["ReferenceExecutor"]


class ReferenceExecutor(Executor):
    name = "reference"
    device_type = None

    def __init__(self, ctx: BufferContext, owner: object) -> None:
        super().__init__(ctx, owner)
        self.comm = GroupComm(ctx.group, ctx.timeout_s)
        self._raw_buffers: dict[bool, torch.Tensor] = {}
        # Two alternating LL combine send buffers (DeepEP's ping-pong sets), made on first use.
        self._ll_combine_buffers: dict[int, torch.Tensor] = {}
        self._ll_buffer_idx = 0

    # normal mode -------------------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts):
        return normal.dispatch_layout(topk_idx, num_experts, self.ctx.topology)

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        got = is_token_in_rank.sum(0, dtype=torch.int32)
        if not torch.equal(got.to(num_tokens_per_rank.device), num_tokens_per_rank):
            raise InvalidArgument("num_tokens_per_rank", "is_token_in_rank.sum(0) (from get_dispatch_layout)",
                                  f"{num_tokens_per_rank.tolist()} vs {got.tolist()}")
        return normal.dispatch(self.comm, self.ctx.topology, self.owner, x, x_scales, topk_idx, topk_weights,
                               num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, expert_alignment,
                               num_worst_tokens, config.num_channels)

    def cached_dispatch(self, x, x_scales, handle, config):
        return normal.cached_dispatch(self.comm, x, x_scales, handle)

    def combine(self, x, handle, topk_weights, biases, config):
        return normal.combine(self.comm, x, handle, topk_weights, biases)

    # low-latency mode --------------------------------------------------------------------------
    def low_latency_dispatch(self, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0,
                             masked, cumulative_stats, wait_stats, recv_follows=False):
        self._ll_buffer_idx ^= 1
        return low_latency.dispatch(self.comm, self.owner, x, topk_idx, num_max, num_experts, use_fp8, round_scale,
                                    use_ue8m0, masked, self.ctx.enable_shrink, cumulative_stats, wait_stats)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy=False,
                            recv_follows=False, use_logfmt=False):
        if zero_copy:
            x = self._combine_buffer(handle, self._ll_buffer_idx)
        self._ll_buffer_idx ^= 1
        return low_latency.combine(self.comm, x, topk_idx, topk_weights, handle, masked, self.ctx.enable_shrink, out,
                                   wait_stats, use_logfmt=use_logfmt)

    def _combine_buffer(self, handle, idx: int) -> torch.Tensor:
        _, _, num_max, hidden, num_experts = handle
        num_local = num_experts // self.ctx.num_ranks
        shape = (num_local, self.ctx.num_ranks * num_max, hidden)
        device = handle[0].device
        buf = self._ll_combine_buffers.get(idx)
        if buf is None or tuple(buf.shape) != shape or buf.device != device:
            buf = torch.zeros(shape, dtype=torch.bfloat16, device=device)
            self._ll_combine_buffers[idx] = buf
        return buf

    def get_next_low_latency_combine_buffer(self, handle):
        return self._combine_buffer(handle, self._ll_buffer_idx)

    def _masked(self) -> set[int]:
        return getattr(self.owner, "_masked_ranks", set())

    def clean_low_latency_buffer(self, num_max, hidden, num_experts):
        for buf in self._ll_combine_buffers.values():
            buf.zero_()
        # NOTES: in shrink mode this barrier leaves masked ranks out and masks a rank that misses it
        # (DeepEP's clean_low_latency_buffer with enable_shrink does the same).
        masked = self._masked()
        shrink = self.ctx.enable_shrink
        self.comm.publish_skips(masked)
        self.comm.barrier("clean_low_latency_buffer", skip=set(masked),
                          on_missing=low_latency.shrink_masker(shrink, masked, self.comm), learn_skips=shrink)
        masked.update(self.comm.skipped_by())

    # raw buffers, lifetime ---------------------------------------------------------------------
    def get_local_buffer_tensor(self, use_rdma_buffer):
        """The whole raw buffer as uint8 (allocated on first use)."""
        nbytes = self.ctx.num_rdma_bytes if use_rdma_buffer else self.ctx.num_nvl_bytes
        raw = self._raw_buffers.get(use_rdma_buffer)
        if raw is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and \
                self.comm.has_nccl else torch.device("cpu")
            raw = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            self._raw_buffers[use_rdma_buffer] = raw
        return raw

    def barrier(self):
        shrink = self.ctx.enable_shrink
        self.comm.barrier("barrier", skip=set(self._masked()) if shrink else (), learn_skips=shrink)

    def destroy(self):
        self.comm.close()
        self._raw_buffers.clear()
        self._ll_combine_buffers.clear()
