"""Dispatch handles: DeepEP's positional layout plus the owner and a private routing plan.

Frameworks treat handles as opaque, except that DeepEP's tests read ``handle[0]`` (intranode
``rank_prefix_matrix``) and ``handle[-4]`` (internode ``recv_gbl_rank_prefix_sum``), and LL users
read ``handle[1]`` (``layout_range``). So a handle is a real tuple with DeepEP's positions; the
executor that made it keeps what it needs in ``plan``, and ``owner`` lets a Buffer refuse a
handle that another Buffer (or the other mode) produced.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["NormalHandle", "LowLatencyHandle"]


class _Handle(tuple):
    """DeepEP's positional items, plus the Buffer that made them and the executor's plan."""

    owner: Any
    plan: Any

    def __new__(cls, items: Iterable[Any], owner: Any, plan: Any):
        obj = super().__new__(cls, tuple(items))
        obj.owner = owner
        obj.plan = plan
        return obj


class NormalHandle(_Handle):
    """Intranode: (rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix,
    recv_src_idx, is_token_in_rank, send_head).

    Internode: (is_token_in_rank, rdma_channel_prefix_matrix, gbl_channel_prefix_matrix,
    recv_rdma_channel_prefix_matrix, recv_rdma_rank_prefix_sum, recv_gbl_channel_prefix_matrix,
    recv_gbl_rank_prefix_sum, recv_src_meta, send_rdma_head, send_nvl_head).
    """

    kind = "normal"

    def __repr__(self) -> str:
        return f"NormalHandle(len={len(self)}, owner={type(self.owner).__name__})"


class LowLatencyHandle(_Handle):
    """(src_info [E_loc, R*T] int32, layout_range [E_loc, R] int64, T, H, num_experts)."""

    kind = "low_latency"

    def __repr__(self) -> str:
        return f"LowLatencyHandle(T={self[2]}, H={self[3]}, E={self[4]})"
