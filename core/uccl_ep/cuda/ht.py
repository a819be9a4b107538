"""Normal (high-throughput) mode of the CUDA executor.

Interim: the routing and data movement run on the reference implementation (torch collectives
over the Buffer's group, CUDA tensors), until the intranode kernels land.
"""

from __future__ import annotations

from ..refs import normal
from ..refs.comm import GroupComm

__all__ = ["NormalEngine"]


class NormalEngine:
    def __init__(self, ex) -> None:
        self.ex = ex
        self.comm = GroupComm(ex.ctx.group)

    def layout(self, topk_idx, num_experts):
        return normal.dispatch_layout(topk_idx, num_experts, self.ex.ctx.topology)

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        return normal.dispatch(self.comm, self.ex.ctx.topology, self.ex.owner, x, x_scales, topk_idx, topk_weights,
                               num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, expert_alignment,
                               num_worst_tokens, config.num_channels)

    def cached_dispatch(self, x, x_scales, handle, config):
        return normal.cached_dispatch(self.comm, x, x_scales, handle)

    def combine(self, x, handle, topk_weights, biases, config):
        return normal.combine(self.comm, x, handle, topk_weights, biases)

    def free(self) -> None:
        pass
