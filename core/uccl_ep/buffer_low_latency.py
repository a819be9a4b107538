"""Low-latency mode of `uccl_ep.Buffer` (DeepEP V1 §1.8-1.10): per-expert dispatch into padded
slabs with in-kernel FP8, weighted combine, receive hooks, zero-copy combine buffers, and the
rank-mask (shrink) APIs."""

from __future__ import annotations

from typing import Any, Optional

import torch

from .config import NUM_MAX_LOCAL_EXPERTS, low_latency_rdma_size_hint
from .errors import InvalidArgument, LimitExceeded
from .events import EventHandle, EventOverlap
from .handles import LowLatencyHandle
from .proxy.limits import check_protocol_limits
from .validate import (CheckedCalls, check_bool, check_extra_kwargs, check_int, check_tensor, check_topk_ids_in_range,
                       enter_exclusive, exclusive, tensor_signature)

__all__ = ["LowLatencyMixin"]


class _RecvHook:
    """The recv hook of one op: completes its receive, inside the Buffer's one-call-at-a-time section.
    A second call would wait for signals that already came (counters only grow) until the timeout,
    so it is refused at once.
    NOTES: a class, not a decorated closure: a hook is made per eager op, and wrapping a closure
    (functools.wraps) cost microseconds of each op's host path."""

    __slots__ = ("_buffer", "_finish", "_called")

    def __init__(self, buffer, finish) -> None:
        self._buffer, self._finish, self._called = buffer, finish, False

    def __call__(self) -> None:
        lock = enter_exclusive(self._buffer, "hook")
        try:
            if self._called:
                raise InvalidArgument("hook", "one call per recv hook (each hook completes one receive)",
                                      "a second call")
            self._called = True
            return self._finish()
        finally:
            lock.release()


class LowLatencyMixin:
    """Mixed into `Buffer`; relies on its ``_executor``, ``group_size``, ``rank`` and checks."""

    def _init_low_latency_state(self) -> None:
        self._masked_ranks: set[int] = set()
        # (num_max, hidden, num_experts) shapes known to fit the buffer (_check_ll_capacity)
        self._ll_shapes_fitted: set[tuple[int, int, int]] = set()
        # signatures of dispatch / combine calls whose checks passed (validate.CheckedCalls)
        self._ll_dispatch_checked = CheckedCalls()
        self._ll_combine_checked = CheckedCalls()

    def _check_ll_mode(self, op: str) -> None:
        self._check_alive()
        if not self.low_latency_mode:
            raise InvalidArgument("low_latency_mode", f"True on the Buffer to call {op}", False,
                                  hint="build the Buffer with low_latency_mode=True")

    def _check_ll_capacity(self, num_max: int, hidden: int, num_experts: int) -> None:
        # NOTES: on every eager call's host path: a shape that fitted once fits again (the buffer and
        # the group do not change), so each shape is checked once.
        shape = (num_max, hidden, num_experts)
        if shape in self._ll_shapes_fitted:
            return
        check_protocol_limits(self.group_size, num_experts=num_experts, num_max_tokens=num_max, hidden=hidden)
        need = low_latency_rdma_size_hint(num_max, hidden, self.group_size, num_experts)
        if need > self.num_rdma_bytes:
            raise LimitExceeded("num_rdma_bytes", f"bytes of the low-latency buffer ({num_max} tokens, hidden "
                                f"{hidden}, {num_experts} experts)", need, self.num_rdma_bytes,
                                hint=f"build the Buffer with num_rdma_bytes >= {need} "
                                     "(Buffer.get_low_latency_rdma_size_hint)")
        self._ll_shapes_fitted.add(shape)

    def _ll_events(self, async_finish: bool, return_recv_hook: bool, finish, tensors):
        if not (async_finish or return_recv_hook):  # the common eager call: the receive follows at once
            finish(follows_send=True)
            return EventOverlap(None), None
        if async_finish and return_recv_hook:
            raise InvalidArgument("async_finish", "False when return_recv_hook=True (the hook is the receive phase)",
                                  True)
        if return_recv_hook:
            return EventOverlap(None, extra_tensors=tensors), _RecvHook(self, finish)
        finish(follows_send=True)  # right after the send phase, on the same stream
        if async_finish:
            return EventOverlap(EventHandle(), extra_tensors=tensors), None
        return EventOverlap(None), None

    def _check_ll_dispatch(self, x, topk_idx, num_max, num_experts, cumulative_stats, wait_stats, use_fp8, round_scale,
                           use_ue8m0, async_finish, return_recv_hook) -> tuple[int, bool, bool, bool]:
        """Every check of a low-latency dispatch's arguments that does not read tensor values;
        -> (num_max as an int, use_fp8, round_scale, use_ue8m0 as bools)."""
        R = self.group_size
        check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
        num_tokens, hidden = x.shape
        device = x.device
        num_max = check_int("num_max_dispatch_tokens_per_rank", num_max, minimum=1)
        if num_tokens > num_max:
            raise LimitExceeded("x", "tokens per rank (num_max_dispatch_tokens_per_rank)", num_tokens, num_max)
        if hidden == 0 or hidden % 128 != 0:
            raise InvalidArgument("x", "hidden (x.shape[1]) a positive multiple of 128", hidden)
        self._check_num_experts(num_experts)
        if num_experts // R > NUM_MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_experts", "experts per rank", num_experts // R, NUM_MAX_LOCAL_EXPERTS)
        check_tensor("topk_idx", topk_idx, dtypes=(torch.int64,), ndim=2, device=device)
        if topk_idx.shape[0] != num_tokens:
            raise InvalidArgument("topk_idx", f"{num_tokens} rows (one per token of x)", topk_idx.shape[0])
        use_fp8 = check_bool("use_fp8", use_fp8)
        round_scale = check_bool("round_scale", round_scale)
        use_ue8m0 = check_bool("use_ue8m0", use_ue8m0)
        if use_ue8m0 and not (use_fp8 and round_scale):
            raise InvalidArgument("use_ue8m0", "False unless use_fp8=True and round_scale=True", True)
        if use_ue8m0 and hidden % 512 != 0:
            raise InvalidArgument("x", "hidden a multiple of 512 with use_ue8m0 (4 scales per int32)", hidden)
        if cumulative_stats is not None:
            check_tensor("cumulative_local_expert_recv_stats", cumulative_stats, dtypes=(torch.int32,),
                         shape=(num_experts // R,), device=device)
        if wait_stats is not None:
            check_tensor("dispatch_wait_recv_cost_stats", wait_stats, dtypes=(torch.int64,), shape=(R,), device=device)
        self._check_ll_capacity(num_max, hidden, num_experts)
        if async_finish and return_recv_hook:
            raise InvalidArgument("async_finish", "False when return_recv_hook=True", True)
        return num_max, use_fp8, round_scale, use_ue8m0

    @exclusive
    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                             dispatch_wait_recv_cost_stats: Optional[torch.Tensor] = None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False, async_finish: bool = False,
                             return_recv_hook: bool = False, **extra_kwargs: Any):
        """-> (recv_x, recv_count [E_loc] i32, handle, EventOverlap, hook).

        ``recv_x`` is BF16 [E_loc, R*T, H], or with ``use_fp8`` a pair (e4m3 [E_loc, R*T, H],
        scales) whose scales are fp32 [E_loc, R*T, H/128] (or with ``use_ue8m0`` int32
        [E_loc, R*T, H/512]), column-major in the last two dims.
        """
        if self._destroyed or not self.low_latency_mode:
            self._check_ll_mode("low_latency_dispatch")
        if extra_kwargs:
            check_extra_kwargs("low_latency_dispatch()", extra_kwargs)
        num_max = num_max_dispatch_tokens_per_rank
        cum, wait = cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats
        try:
            signature = (tensor_signature(x), tensor_signature(topk_idx), type(num_max), num_max, type(num_experts),
                         num_experts, cum if cum is None else tensor_signature(cum),
                         wait if wait is None else tensor_signature(wait), type(use_fp8), use_fp8, type(round_scale),
                         round_scale, type(use_ue8m0), use_ue8m0, bool(async_finish), bool(return_recv_hook))
            checked = signature in self._ll_dispatch_checked
        except Exception:  # noqa: BLE001 - not tensor-like, or unhashable: the checks below say what is wrong
            signature, checked = None, False
        if checked:
            num_max, use_fp8, round_scale, use_ue8m0 = int(num_max), bool(use_fp8), bool(round_scale), bool(use_ue8m0)
        else:
            num_max, use_fp8, round_scale, use_ue8m0 = self._check_ll_dispatch(
                x, topk_idx, num_max, num_experts, cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats,
                use_fp8, round_scale, use_ue8m0, async_finish, return_recv_hook)
            self._ll_dispatch_checked.add(signature)
        if x.is_cpu:
            check_topk_ids_in_range("topk_idx", topk_idx, num_experts)
        recv_x, recv_count, handle, finish = self._executor.low_latency_dispatch(
            x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0, self._masked_ranks,
            cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats, recv_follows=not return_recv_hook)
        tensors = (x, topk_idx, *(recv_x if isinstance(recv_x, tuple) else (recv_x,)), recv_count)
        event, hook = self._ll_events(async_finish, return_recv_hook, finish, tensors)
        return recv_x, recv_count, self._issue_handle(handle), event, hook

    def _check_ll_combine(self, x, topk_idx, topk_weights, handle, use_logfmt, zero_copy, async_finish,
                          return_recv_hook, out, wait_stats) -> tuple[bool, bool]:
        """Every check of a low-latency combine's arguments past its handle's that does not read
        tensor values; -> (use_logfmt, zero_copy) as bools."""
        use_logfmt = check_bool("use_logfmt", use_logfmt)
        zero_copy = bool(zero_copy)
        if use_logfmt and zero_copy:  # DeepEP refuses it too: the sender encodes into its own staging
            raise InvalidArgument("zero_copy", "False with use_logfmt=True (LogFMT rows are encoded by the "
                                  "send kernel, not written by the caller)", True)
        _, _, num_max, hidden, num_experts = handle
        R = self.group_size
        num_local = num_experts // R
        check_tensor("x", x, dtypes=(torch.bfloat16,), shape=(num_local, R * num_max, hidden))
        device = x.device
        check_tensor("topk_idx", topk_idx, dtypes=(torch.int64,), ndim=2, device=device)
        num_tokens = topk_idx.shape[0]
        if num_tokens != handle.plan.num_tokens:
            raise InvalidArgument("topk_idx", f"{handle.plan.num_tokens} rows (the tokens of the dispatch that made "
                                  "`handle`)", num_tokens)
        check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), shape=tuple(topk_idx.shape), device=device)
        if out is not None:
            check_tensor("out", out, dtypes=(torch.bfloat16,), shape=(num_tokens, hidden), device=device)
        if wait_stats is not None:
            check_tensor("combine_wait_recv_cost_stats", wait_stats, dtypes=(torch.int64,), shape=(R,), device=device)
        if async_finish and return_recv_hook:
            raise InvalidArgument("async_finish", "False when return_recv_hook=True", True)
        return use_logfmt, zero_copy

    @exclusive
    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                            handle: tuple, use_logfmt: bool = False, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False,
                            out: Optional[torch.Tensor] = None,
                            combine_wait_recv_cost_stats: Optional[torch.Tensor] = None, **extra_kwargs: Any):
        """-> (combined_x [T, H] bf16, EventOverlap, hook): sum_k w[t,k] * y[expert][slot of t].

        With ``use_logfmt`` every row travels in LogFMT-10 (``uccl_ep.refs.logfmt``) and is summed
        as decoded (docs/api.md, "LogFMT combine")."""
        if self._destroyed or not self.low_latency_mode:
            self._check_ll_mode("low_latency_combine")
        if extra_kwargs:
            check_extra_kwargs("low_latency_combine()", extra_kwargs)
        self._check_handle(handle, LowLatencyHandle, "low_latency_combine")
        _, _, num_max, hidden, num_experts = handle
        wait = combine_wait_recv_cost_stats
        try:
            signature = (tensor_signature(x), tensor_signature(topk_idx), tensor_signature(topk_weights),
                         out if out is None else tensor_signature(out),
                         wait if wait is None else tensor_signature(wait), num_max, hidden,
                         num_experts, handle.plan.num_tokens, type(use_logfmt), use_logfmt, bool(zero_copy),
                         bool(async_finish), bool(return_recv_hook))
            checked = signature in self._ll_combine_checked
        except Exception:  # noqa: BLE001 - not tensor-like, or unhashable: the checks below say what is wrong
            signature, checked = None, False
        if checked:
            use_logfmt, zero_copy = bool(use_logfmt), bool(zero_copy)
        else:
            use_logfmt, zero_copy = self._check_ll_combine(x, topk_idx, topk_weights, handle, use_logfmt, zero_copy,
                                                           async_finish, return_recv_hook, out,
                                                           combine_wait_recv_cost_stats)
            self._ll_combine_checked.add(signature)
        if x.is_cpu:
            check_topk_ids_in_range("topk_idx", topk_idx, num_experts)
        combined, finish = self._executor.low_latency_combine(
            x, topk_idx, topk_weights, handle, self._masked_ranks, out, combine_wait_recv_cost_stats,
            zero_copy=zero_copy, recv_follows=not return_recv_hook, use_logfmt=use_logfmt)
        event, hook = self._ll_events(async_finish, return_recv_hook, finish, (x, topk_idx, topk_weights, combined))
        return combined, event, hook

    @exclusive
    def get_next_low_latency_combine_buffer(self, handle: tuple) -> torch.Tensor:
        """BF16 view [E_loc, R*T, H] of the buffer the next combine sends from (for zero_copy)."""
        self._check_ll_mode("get_next_low_latency_combine_buffer")
        self._check_handle(handle, LowLatencyHandle, "get_next_low_latency_combine_buffer")
        return self._executor.get_next_low_latency_combine_buffer(handle)

    @exclusive
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Reset both low-latency buffer sets (required after normal-mode use of the same buffer)."""
        self._check_ll_mode("clean_low_latency_buffer")
        check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, minimum=1)
        check_int("hidden", hidden, minimum=128, multiple_of=128)
        self._check_num_experts(num_experts)
        self._check_ll_capacity(num_max_dispatch_tokens_per_rank, hidden, num_experts)
        self._executor.clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)

    # -- shrink / rank masking (enable_shrink=True) ----------------------------------------------
    def _check_shrink(self, op: str) -> None:
        self._check_alive()
        if not self.enable_shrink:
            raise InvalidArgument("enable_shrink", f"True on the Buffer to call {op}", False)

    @exclusive
    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Mask (``mask=True``) or unmask a rank: this rank then neither sends to it nor waits for it.

        On the cuda backend the mask lives in device memory and the call is ordered on the current
        stream (graph-capturable), as DeepEP's; the kernels also mask a rank whose wait expires."""
        self._check_shrink("low_latency_update_mask_buffer")
        check_int("rank_to_mask", rank_to_mask, minimum=0)
        if rank_to_mask >= self.group_size:
            raise InvalidArgument("rank_to_mask", f"a rank in [0, {self.group_size})", rank_to_mask)
        check_bool("mask", mask)
        if mask:
            self._masked_ranks.add(rank_to_mask)
        else:
            self._masked_ranks.discard(rank_to_mask)
        update = getattr(self._executor, "ll_mask_update", None)
        if update is not None:
            update(rank_to_mask, bool(mask))

    @exclusive
    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor) -> None:
        """Write 1 for masked ranks and 0 otherwise into ``mask_status`` [R] int32: those masked by
        this rank's calls and those found silent or dead (shrink mode)."""
        self._check_shrink("low_latency_query_mask_buffer")
        check_tensor("mask_status", mask_status, dtypes=(torch.int32,), shape=(self.group_size,))
        query = getattr(self._executor, "ll_mask_query", None)
        if query is not None:
            query(mask_status)
            return
        status = torch.zeros(self.group_size, dtype=torch.int32)
        for r in self._masked_ranks:
            status[r] = 1
        mask_status.copy_(status)

    @exclusive
    def low_latency_clean_mask_buffer(self) -> None:
        """Unmask every rank. A rank masked because it failed is waited for again by the next op;
        one that only stalled must be back in step (see docs/api.md, "Shrink and recovery")."""
        self._check_shrink("low_latency_clean_mask_buffer")
        self._masked_ranks.clear()
        clean = getattr(self._executor, "ll_mask_clean", None)
        if clean is not None:
            clean()
