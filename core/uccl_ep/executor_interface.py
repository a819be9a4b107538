"""What an executor is: the context it serves (`BufferContext`) and the interface `uccl_ep.Buffer`
calls (`Executor`). Executors import this module only; the registry and the choice of
`backend="auto"` live in `uccl_ep.backends`, which imports the executors.

An executor runs already-validated requests. `Buffer` owns validation, streams/events, hooks
and handle ownership; executors own data movement. Every executor is tested against the
reference executor (`uccl_ep.refs`), which defines the semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .events import OpScope
from .topology import Topology
from .tuning import DEFAULT as DEFAULT_TUNING, Tuning

__all__ = ["BufferContext", "Executor"]


@dataclass
class BufferContext:
    """Everything an executor needs to know about the Buffer it serves."""

    group: dist.ProcessGroup
    rank: int
    num_ranks: int
    topology: Topology
    num_nvl_bytes: int
    num_rdma_bytes: int
    low_latency_mode: bool
    allow_nvlink_for_low_latency_mode: bool
    enable_shrink: bool
    num_qps_per_rank: int
    timeout_s: float
    gpu_timeout_s: float
    tuning: Tuning = DEFAULT_TUNING
    options: dict[str, Any] = field(default_factory=dict)


class Executor:
    """Interface of an executor. Methods receive validated arguments (see `Buffer`)."""

    name = "abstract"
    #: device type of the tensors it runs ("cpu", "cuda") or None for any
    device_type: str | None = None

    def __init__(self, ctx: BufferContext, owner: object) -> None:
        self.ctx = ctx
        self.owner = owner

    # streams ------------------------------------------------------------------------------------
    def op_scope(self, previous_event, async_finish: bool, allocate_on_comm_stream: bool) -> OpScope:
        """Context in which one normal-mode op runs; its ``finish(outputs)`` makes the returned
        event. Override to run on a comm stream (CUDA)."""
        return OpScope(previous_event, async_finish, allocate_on_comm_stream)

    # normal mode -------------------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int):
        raise NotImplementedError

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        raise NotImplementedError

    def cached_dispatch(self, x, x_scales, handle, config):
        raise NotImplementedError

    def combine(self, x, handle, topk_weights, biases, config):
        raise NotImplementedError

    # low-latency mode --------------------------------------------------------------------------
    def low_latency_dispatch(self, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0,
                             masked, cumulative_stats, wait_stats, recv_follows=False):
        """Returns (recv_x, recv_count, handle, finish); ``finish()`` is the receive phase
        (``finish(follows_send=True)`` when it runs right after the send phase on the same stream:
        a launch hint the NVLink path uses, others ignore it). ``recv_follows``: the caller will call
        ``finish(follows_send=True)`` at once (no recv hook), so an executor may issue the receive phase
        with the send phase (the NVLink path's torch op does; ``finish`` then has nothing left to do).

        ``masked`` is the Buffer's live set of masked ranks (shrink mode): skip them, and add the
        peers found to have masked this rank (DeepEP: a timeout masks the silent peer)."""
        raise NotImplementedError

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy=False,
                            recv_follows=False, use_logfmt=False):
        """Returns (combined_x, finish); ``recv_follows`` as for dispatch. ``use_logfmt``: rows travel in LogFMT-10 (refs.logfmt);
        never with ``zero_copy`` (Buffer refuses the pair)."""
        raise NotImplementedError

    def clean_low_latency_buffer(self, num_max: int, hidden: int, num_experts: int) -> None:
        raise NotImplementedError

    def get_next_low_latency_combine_buffer(self, handle) -> torch.Tensor:
        raise NotImplementedError

    # raw buffers, lifetime ---------------------------------------------------------------------
    def get_local_buffer_tensor(self, use_rdma_buffer: bool) -> torch.Tensor:
        """The whole NVL (or RDMA) buffer as a 1-D uint8 tensor."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        pass

    def release_at_exit(self) -> None:
        """What the interpreter's exit needs of a Buffer nobody destroyed: stop whatever threads or
        processes would outlive it (the proxy, which first sends what was pushed and says goodbye to
        its peers) without waiting for the device; the process's end frees the rest."""
        self.destroy()
