"""Argument checks of the normal-mode `Buffer` calls (dispatch, cached dispatch, combine) that do not
read tensor values, and the signature under which a repeated fresh dispatch skips them
(`validate.CheckedCalls`).

NOTES: a fresh dispatch's checks (a `check_tensor` for each of its six tensor arguments) are most of
the `Buffer` layer's host time in that call; they depend only on the signature and on the Buffer's
fixed state (group size, topology), so a signature that passed once passes again. What the signature
does not cover runs every call, in `Buffer`: the `Config` (its fields may change), the buffer's
capacity for the row size and top-k ids on the host.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import InvalidArgument
from .validate import check_int, check_tensor, split_fp8_tuple, tensor_signature

__all__ = ["dispatch_signature", "check_dispatch_args", "check_combine_args", "COMBINE_DTYPES", "TOPK_IDX_DTYPE"]

COMBINE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TOPK_IDX_DTYPE = torch.int64  # DeepEP's default 64-bit build


def _x_signature(x: Any) -> tuple:
    if isinstance(x, (tuple, list)):
        return (len(x), tensor_signature(x[0]), tensor_signature(x[1]) if len(x) > 1 else None)
    return (tensor_signature(x),)


def dispatch_signature(x, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                       num_tokens_per_expert, topk_idx, topk_weights, expert_alignment, num_worst_tokens,
                       previous_event, async_finish, allocate_on_comm_stream) -> tuple:
    """What `check_dispatch_args` (and `Buffer._check_events`) depend on in a fresh dispatch (no
    handle); raises for arguments that are not tensor-like or not hashable (the caller then checks
    the call in full)."""
    return (_x_signature(x), tensor_signature(num_tokens_per_rank),
            tensor_signature(num_tokens_per_rdma_rank), tensor_signature(is_token_in_rank),
            tensor_signature(num_tokens_per_expert), tensor_signature(topk_idx), tensor_signature(topk_weights),
            type(expert_alignment), expert_alignment, type(num_worst_tokens), num_worst_tokens,
            type(previous_event), type(async_finish), async_finish, type(allocate_on_comm_stream),
            allocate_on_comm_stream)


def check_dispatch_args(buffer, x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                        num_tokens_per_expert, topk_idx, topk_weights, expert_alignment,
                        num_worst_tokens) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every check of a dispatch's arguments that does not read tensor values -> (data, scales)."""
    data, scales = split_fp8_tuple("x", x)
    if data.shape[1] == 0:
        raise InvalidArgument("x", "a hidden size (x.shape[1]) >= 1", "hidden 0")
    if (data.shape[1] * data.element_size()) % 16 != 0:
        raise InvalidArgument("x", "rows of a multiple of 16 bytes (hidden x element size)",
                              f"hidden {data.shape[1]} x {data.element_size()} B")
    check_int("expert_alignment", expert_alignment, minimum=1)
    check_int("num_worst_tokens", num_worst_tokens, minimum=0)
    device = data.device
    if handle is not None:
        if topk_idx is not None or topk_weights is not None:
            raise InvalidArgument("topk_idx", "None with a cached `handle` (routing comes from the handle)", "a tensor")
        if num_worst_tokens:
            raise InvalidArgument("num_worst_tokens", "0 with a cached `handle` (the handle fixes the row count)",
                                  num_worst_tokens)
        return data, scales
    num_tokens = data.shape[0]
    R = buffer.group_size
    for name, t in (("num_tokens_per_rank", num_tokens_per_rank), ("is_token_in_rank", is_token_in_rank),
                    ("num_tokens_per_expert", num_tokens_per_expert)):
        if t is None:
            raise InvalidArgument(name, "a tensor from get_dispatch_layout (required without `handle`)", None)
    check_tensor("num_tokens_per_rank", num_tokens_per_rank, dtypes=(torch.int32,), shape=(R,), device=device)
    check_tensor("is_token_in_rank", is_token_in_rank, dtypes=(torch.bool,), shape=(num_tokens, R), device=device)
    check_tensor("num_tokens_per_expert", num_tokens_per_expert, dtypes=(torch.int32,), ndim=1, device=device)
    buffer._check_num_experts(num_tokens_per_expert.numel())
    if num_tokens_per_rdma_rank is not None:
        check_tensor("num_tokens_per_rdma_rank", num_tokens_per_rdma_rank, dtypes=(torch.int32,),
                     shape=(buffer.topology.num_nodes,), device=device)
    if (topk_idx is None) != (topk_weights is None):
        raise InvalidArgument("topk_weights" if topk_weights is None else "topk_idx",
                              "topk_idx and topk_weights given together or both None", "only one of them")
    if topk_idx is not None:
        check_tensor("topk_idx", topk_idx, dtypes=(TOPK_IDX_DTYPE,), ndim=2, device=device)
        if topk_idx.shape[0] != num_tokens:
            raise InvalidArgument("topk_idx", f"{num_tokens} rows (one per token of x)", topk_idx.shape[0])
        check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), shape=tuple(topk_idx.shape),
                     device=device)
    elif num_worst_tokens:
        raise InvalidArgument("topk_idx", "a tensor when num_worst_tokens > 0", None)
    return data, scales


def check_combine_args(x, topk_weights) -> None:
    """Every check of a combine's arguments past its handle that does not read tensor values or
    depend on the handle."""
    check_tensor("x", x, dtypes=COMBINE_DTYPES, ndim=2)
    if x.shape[1] == 0:
        raise InvalidArgument("x", "a hidden size (x.shape[1]) >= 1", "hidden 0")
    if topk_weights is not None:
        check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2, device=x.device)
