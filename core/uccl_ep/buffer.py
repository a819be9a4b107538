"""`uccl_ep.Buffer`: DeepEP V1's `deep_ep.Buffer` API, on any GPU, NIC or CPU.

Construction, statics, raw buffers and normal (high-throughput) mode live here; low-latency
mode is in `buffer_low_latency.py`. Signatures, return tuples, shapes, dtypes, ordering and
events follow DeepEP V1's `deep_ep.Buffer`; docs/api.md states the contract.
"""

from __future__ import annotations

import atexit
import math
import weakref
from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from . import env
from .backends import create_executor
from .executor_interface import BufferContext
from .buffer_low_latency import LowLatencyMixin
from .buffer_normal_checks import TOPK_IDX_DTYPE, check_combine_args, check_dispatch_args, dispatch_signature
from .config import (NUM_BUFFER_ALIGNMENT_BYTES, NUM_MAX_LOCAL_EXPERTS, Config, combine_config_table,
                     dispatch_config_table, low_latency_rdma_size_hint)
from .errors import InvalidArgument, LimitExceeded, Unsupported
from .events import EventHandle, EventOverlap
from .group_store import exchange_hostnames
from .handles import NormalHandle
from .log import get_logger
from .proxy.limits import check_protocol_limits
from .topology import detect_topology
from .tuning import Tuning, resolve as resolve_tuning
from .validate import (CheckedCalls, check_bool, check_extra_kwargs, check_int, check_tensor, check_topk_ids_in_range,
                       exclusive)

__all__ = ["Buffer", "topk_idx_t"]

logger = get_logger(__name__)

#: dtype of top-k expert ids (DeepEP's default 64-bit build).
topk_idx_t = TOPK_IDX_DTYPE

# Buffers not yet destroyed, released at interpreter exit (_release_at_exit).
_LIVE_BUFFERS: "weakref.WeakSet[Buffer]" = weakref.WeakSet()


def _release_at_exit() -> None:
    """Every Buffer still alive when the interpreter exits gets its executor's `release_at_exit`.
    NOTES: without it a Buffer held by a module, a daemon thread or a reference cycle outlives the
    interpreter's teardown: its proxy threads run until the process ends (peers see no goodbye and
    wait for the heartbeat timeout) and nanobind reports the native objects as leaked."""
    for buf in list(_LIVE_BUFFERS):
        buf._release("interpreter exit", at_exit=True)


atexit.register(_release_at_exit)


class Buffer(LowLatencyMixin):
    """Expert-parallel communication buffer with DeepEP V1's interface.

    Positional and keyword arguments are DeepEP V1's; the keyword-only arguments after them are
    uccl_ep's own (each also settable by an env var, see docs/env.md):

    - ``backend``: "auto" (default), "reference", "host" or "cuda" (see `uccl_ep.backends`);
    - ``timeout_s`` / ``gpu_timeout_s``: bound of every host / device wait;
    - ``ranks_per_node``: NVLink-domain size (0 = detect from host names);
    - ``num_proxy_threads``: CPU proxy threads per rank (host and proxy paths);
    - ``tuning``: a `uccl_ep.Tuning` (kernel tuning of the cuda executor; None = the defaults).

    Extra keyword arguments that other DeepEP forks accept are tolerated when they ask for
    nothing (None/False/0) and refused with `Unsupported` otherwise.

    A Buffer is not thread-safe: one call at a time (a call while another thread is inside one is
    refused with `InvalidArgument`); use one Buffer per thread. Handles are accepted only by the
    Buffer that returned them, unmodified.
    """

    #: SMs used by normal-mode kernels; global to all buffers (DeepEP semantics).
    num_sms: int = 20

    def __init__(self, group: Optional[dist.ProcessGroup], num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 use_fabric: bool = False, explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm: Any = None, *, backend: str = "auto", timeout_s: Optional[float] = None,
                 gpu_timeout_s: Optional[float] = None, ranks_per_node: Optional[int] = None,
                 num_proxy_threads: Optional[int] = None, tuning: Optional[Tuning] = None,
                 **extra_kwargs: Any) -> None:
        self._destroyed = True  # until construction completes
        check_extra_kwargs("Buffer()", extra_kwargs)
        if group is None:
            if comm is not None:
                raise Unsupported("Buffer(group=None, comm=<mpi4py comm>) is not supported; pass a "
                                  "torch.distributed ProcessGroup (gloo or NCCL)")
            raise InvalidArgument("group", "a torch.distributed ProcessGroup", None)
        if not dist.is_initialized():
            raise InvalidArgument("group", "a ProcessGroup of an initialized torch.distributed",
                                  "torch.distributed is not initialized", hint="call dist.init_process_group first")
        if not isinstance(group, dist.ProcessGroup):
            raise InvalidArgument("group", "a torch.distributed ProcessGroup", type(group).__name__)
        self.num_nvl_bytes = check_int("num_nvl_bytes", num_nvl_bytes, minimum=0, multiple_of=NUM_BUFFER_ALIGNMENT_BYTES)
        self.num_rdma_bytes = check_int("num_rdma_bytes", num_rdma_bytes, minimum=0,
                                        multiple_of=NUM_BUFFER_ALIGNMENT_BYTES)
        self.low_latency_mode = check_bool("low_latency_mode", low_latency_mode)
        self.num_qps_per_rank = check_int("num_qps_per_rank", num_qps_per_rank, minimum=1)
        self.allow_nvlink_for_low_latency_mode = check_bool("allow_nvlink_for_low_latency_mode",
                                                            allow_nvlink_for_low_latency_mode)
        self.allow_mnnvl = check_bool("allow_mnnvl", allow_mnnvl)
        # NOTES: `use_fabric` chooses how the NVL buffer is shared (cuMem fabric vs cudaIpc handles),
        # not what the API does; executors pick the sharing mechanism the machine supports.
        self.use_fabric = bool(use_fabric)
        self.explicitly_destroy = check_bool("explicitly_destroy", explicitly_destroy)
        self.enable_shrink = check_bool("enable_shrink", enable_shrink)

        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        if timeout_s is None:
            timeout_s = env.get("UCCL_EP_TIMEOUT_S")
        if gpu_timeout_s is None:
            gpu_timeout_s = env.get("UCCL_EP_GPU_TIMEOUT_S")
        if ranks_per_node is None:
            ranks_per_node = env.get("UCCL_EP_RANKS_PER_NODE")
        for name, value in (("timeout_s", timeout_s), ("gpu_timeout_s", gpu_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise InvalidArgument(name, "a finite positive number of seconds", repr(value))
        check_int("ranks_per_node", ranks_per_node, minimum=0)
        explicit_threads = num_proxy_threads is not None
        if num_proxy_threads is None:
            num_proxy_threads = env.get("UCCL_EP_NUM_PROXY_THREADS")
        check_int("num_proxy_threads", num_proxy_threads, minimum=1, maximum=64, what="proxy threads per rank")
        self.tuning = resolve_tuning(tuning)
        # The TransferCmd / immediate field widths bound ranks and region sizes.
        check_protocol_limits(self.group_size, num_rdma_bytes=self.num_rdma_bytes, num_nvl_bytes=self.num_nvl_bytes)
        hostnames = exchange_hostnames(group, float(timeout_s))
        self.topology = detect_topology(hostnames, ranks_per_node)
        if backend == "auto":
            backend = env.get("UCCL_EP_BACKEND")
        ctx = BufferContext(group=group, rank=self.rank, num_ranks=self.group_size, topology=self.topology,
                            num_nvl_bytes=self.num_nvl_bytes, num_rdma_bytes=self.num_rdma_bytes,
                            low_latency_mode=self.low_latency_mode,
                            allow_nvlink_for_low_latency_mode=self.allow_nvlink_for_low_latency_mode,
                            enable_shrink=self.enable_shrink, num_qps_per_rank=self.num_qps_per_rank,
                            timeout_s=float(timeout_s), gpu_timeout_s=float(gpu_timeout_s), tuning=self.tuning,
                            options={"num_proxy_threads": int(num_proxy_threads) if explicit_threads else None})
        self._executor = create_executor(backend, ctx, self)
        self.backend = self._executor.name
        self._comm_stream = None
        self._init_low_latency_state()
        self._nvl_fitted: set[tuple] = set()  # (config, row bytes) known to fit (_check_nvl_capacity)
        self._default_configs: dict[tuple, Config] = {}  # (op, Buffer.num_sms) -> the Config of config=None
        # signatures of fresh dispatches whose checks passed (buffer_normal_checks)
        self._dispatch_checked = CheckedCalls()
        self._destroyed = False
        _LIVE_BUFFERS.add(self)
        logger.info("Buffer rank %d/%d: backend=%s topology=%s nvl=%d rdma=%d low_latency=%s", self.rank,
                    self.group_size, self.backend, self.topology, self.num_nvl_bytes, self.num_rdma_bytes,
                    self.low_latency_mode)

    # ----------------------------------------------------------------------------------------------
    # statics and sizing
    # ----------------------------------------------------------------------------------------------
    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Set the SMs normal-mode kernels use (global, even: one channel = 2 SMs)."""
        check_int("new_num_sms", new_num_sms, minimum=2, multiple_of=2)
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return dispatch_config_table(num_ranks, Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return combine_config_table(num_ranks, Buffer.num_sms)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        return low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @staticmethod
    def capture() -> EventOverlap:
        """An `EventOverlap` recorded on the current stream."""
        return EventOverlap(EventHandle())

    @staticmethod
    def is_sm90_compiled() -> bool:
        # NOTES: kernels are JIT-compiled for the device at hand, so FP8/TMA paths exist wherever
        # the device has them; there is no build without them.
        return True

    def is_available(self) -> bool:
        return not self._destroyed

    def get_comm_stream(self):
        """The stream communication runs on (CUDA), or None for CPU buffers."""
        if self._comm_stream is None and torch.cuda.is_available() and torch.cuda.is_initialized():
            self._comm_stream = torch.cuda.Stream(priority=-1)
        return self._comm_stream

    @exclusive
    def get_local_buffer_tensor(self, dtype: torch.dtype, size: Optional[torch.Size] = None, offset: int = 0,
                                use_rdma_buffer: bool = False) -> torch.Tensor:
        """A raw view of this rank's NVL (or RDMA) buffer, starting at byte ``offset``."""
        self._check_alive()
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgument("dtype", "a torch.dtype", repr(dtype))
        nbytes = self.num_rdma_bytes if use_rdma_buffer else self.num_nvl_bytes
        check_int("offset", offset, minimum=0)
        if offset > nbytes or offset % torch.empty((), dtype=dtype).element_size() != 0:
            raise InvalidArgument("offset", f"an element-aligned byte offset <= {nbytes}", offset)
        raw = self._executor.get_local_buffer_tensor(bool(use_rdma_buffer))
        elem = torch.empty((), dtype=dtype).element_size()
        view = raw[offset:offset + (nbytes - offset) // elem * elem].view(dtype)
        if size is None:
            return view
        numel = int(torch.Size(size).numel())
        if numel > view.numel():
            raise LimitExceeded("size", "elements in the buffer after `offset`", numel, view.numel())
        return view[:numel].view(size)

    # ----------------------------------------------------------------------------------------------
    # lifetime
    # ----------------------------------------------------------------------------------------------
    @exclusive
    def destroy(self) -> None:
        """Release resources now. Requires ``explicitly_destroy=True`` (DeepEP semantics)."""
        if not self.explicitly_destroy:
            raise InvalidArgument("explicitly_destroy", "True to call destroy()", False,
                                  hint="buffers built without it are released when garbage-collected")
        if self._destroyed:
            return
        try:
            self._executor.barrier()
        except Exception as e:  # noqa: BLE001 - logged; the local resources are released all the same
            # NOTES: destroy is also the first step of recovering from a failed peer (docs/api.md,
            # "Shrink and recovery"). And at the end of a job the rank hosting the process group's
            # store may leave as soon as it has every rank's arrival, while another rank is still
            # writing its last keys of this barrier: that rank sees the store's connection break
            # (DistNetworkError) although every rank arrived.
            logger.warning("uccl_ep.Buffer rank %d: destroy() without the final barrier (%s: %s)", self.rank,
                           type(e).__name__, e)
        finally:
            self._executor.destroy()
            self._destroyed = True
            _LIVE_BUFFERS.discard(self)

    def _release(self, why: str, at_exit: bool = False) -> None:
        """Local release of a Buffer nobody destroyed (interpreter exit): no collective barrier, as the
        other ranks need not be here; their waits on this rank end with PeerFailure (the proxy's
        goodbye) or their own timeout.
        NOTES: garbage collection is left to the executors (the host executor's __del__ releases its
        proxy): a Buffer sits in a reference cycle with its executor, so it is collected at no
        particular point of the program, and a device synchronize there could stall a later op."""
        if getattr(self, "_destroyed", True):
            return
        self._destroyed = True
        _LIVE_BUFFERS.discard(self)
        try:
            if self.explicitly_destroy:
                logger.warning("uccl_ep.Buffer rank %d: released at %s without destroy() (explicitly_destroy=True)",
                               self.rank, why)
            if at_exit:
                self._executor.release_at_exit()
            else:
                self._executor.destroy()
        except Exception as e:  # noqa: BLE001 - nothing to raise to at collection or exit
            logger.debug("uccl_ep.Buffer rank %d: release at %s: %s: %s", self.rank, why, type(e).__name__, e)

    def _check_alive(self) -> None:
        if getattr(self, "_destroyed", True):
            raise InvalidArgument("self", "a live Buffer", "a destroyed Buffer")

    # ----------------------------------------------------------------------------------------------
    # streams and events (shared by every op)
    # ----------------------------------------------------------------------------------------------
    def _check_events(self, previous_event, async_finish, allocate_on_comm_stream) -> None:
        if previous_event is not None and not isinstance(previous_event, (EventOverlap, EventHandle)):
            raise InvalidArgument("previous_event", "an EventOverlap or EventHandle (or None)",
                                  type(previous_event).__name__)
        check_bool("async_finish", async_finish)
        if allocate_on_comm_stream and (previous_event is None or not async_finish):
            raise InvalidArgument("allocate_on_comm_stream", "False unless previous_event is given and async_finish=True",
                                  True)

    # ----------------------------------------------------------------------------------------------
    # normal mode
    # ----------------------------------------------------------------------------------------------
    @exclusive
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event=None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (num_tokens_per_rank [R] i32, num_tokens_per_rdma_rank [N] i32 | None,
        num_tokens_per_expert [E] i32, is_token_in_rank [T, R] bool, EventOverlap)."""
        self._check_alive()
        self._check_events(previous_event, async_finish, allocate_on_comm_stream)
        check_tensor("topk_idx", topk_idx, dtypes=(topk_idx_t,), ndim=2)
        self._check_num_experts(num_experts)
        if topk_idx.device.type == "cpu":
            check_topk_ids_in_range("topk_idx", topk_idx, num_experts)
        with self._executor.op_scope(previous_event, async_finish, allocate_on_comm_stream) as scope:
            out = self._executor.get_dispatch_layout(topk_idx, num_experts)
        return (*out, scope.finish(out))

    def _check_num_experts(self, num_experts: int) -> int:
        check_int("num_experts", num_experts, minimum=1)
        if num_experts % self.group_size != 0:
            raise InvalidArgument("num_experts", f"a multiple of the group size {self.group_size}", num_experts)
        if num_experts // self.group_size > NUM_MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_experts", f"experts per rank ({self.group_size} ranks)",
                                num_experts // self.group_size, NUM_MAX_LOCAL_EXPERTS)
        return num_experts

    def _issue_handle(self, handle):
        """Record a handle this Buffer returns: only such handles, unmodified, are accepted back."""
        if handle is not None:
            # NOTES: the seal lives on the plan (only this Buffer's executor made it): a handle built
            # by hand has no sealed plan, one with items replaced does not match the seal.
            try:
                object.__setattr__(handle.plan, "_uccl_ep_seal", (id(self), tuple(map(id, handle))))
            except (AttributeError, TypeError):  # a plan without attributes (None, slots): owner check only
                pass
        return handle

    def _check_nvl_capacity(self, x: torch.Tensor, config: Config) -> None:
        # NOTES: on every normal-mode call's host path: a (config, row size) that fitted once fits
        # again (the buffers and the group do not change), so each is checked once.
        hidden_bytes = x.shape[1] * x.element_size()
        key = (config.num_sms, config.num_max_nvl_chunked_send_tokens, config.num_max_nvl_chunked_recv_tokens,
               config.num_max_rdma_chunked_send_tokens, config.num_max_rdma_chunked_recv_tokens, hidden_bytes)
        fitted = self._nvl_fitted
        if key in fitted:
            return
        check_protocol_limits(self.group_size, num_channels=config.num_channels,
                              chunk_tokens=max(config.num_max_nvl_chunked_send_tokens,
                                               config.num_max_rdma_chunked_send_tokens),
                              ring_tokens=max(config.num_max_nvl_chunked_recv_tokens,
                                              config.num_max_rdma_chunked_recv_tokens))
        need = config.get_nvl_buffer_size_hint(hidden_bytes, self.group_size)
        if need > self.num_nvl_bytes:
            raise LimitExceeded("num_nvl_bytes", f"bytes of the NVL buffer (hidden {x.shape[1]} x "
                                f"{x.element_size()} B, {config.num_channels} channels, {self.group_size} ranks)",
                                need, self.num_nvl_bytes,
                                hint=f"build the Buffer with num_nvl_bytes >= {need} "
                                     "(Config.get_nvl_buffer_size_hint)")
        if self.topology.is_internode:
            need_rdma = config.get_rdma_buffer_size_hint(hidden_bytes, self.group_size)
            if need_rdma > self.num_rdma_bytes:
                raise LimitExceeded("num_rdma_bytes", "bytes of the RDMA buffer", need_rdma, self.num_rdma_bytes)
        if len(fitted) >= 64:
            fitted.clear()
        fitted.add(key)

    @exclusive
    def dispatch(self, x: Union[torch.Tensor, tuple], handle: Optional[tuple] = None,
                 num_tokens_per_rank: Optional[torch.Tensor] = None,
                 num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
                 is_token_in_rank: Optional[torch.Tensor] = None,
                 num_tokens_per_expert: Optional[torch.Tensor] = None, topk_idx: Optional[torch.Tensor] = None,
                 topk_weights: Optional[torch.Tensor] = None, expert_alignment: int = 1,
                 num_worst_tokens: int = 0, config: Optional[Config] = None, previous_event=None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, EventOverlap).

        ``x`` is a tensor [T, H] or an ``(fp8 [T, H], scales [T, S])`` pair (moved as is, never
        re-quantized). With ``handle`` (cached dispatch) the routing of that earlier dispatch is
        reused and ``(recv_x, None, None, None, None, event)`` is returned.
        """
        self._check_alive()
        # NOTES: a fresh dispatch has six tensor arguments to check, worth a signature lookup; a cached
        # dispatch has one, as cheap to check as to sign
        signature, checked = None, False
        if handle is None:
            try:
                signature = dispatch_signature(x, num_tokens_per_rank, num_tokens_per_rdma_rank,
                                               is_token_in_rank, num_tokens_per_expert, topk_idx, topk_weights,
                                               expert_alignment, num_worst_tokens, previous_event, async_finish,
                                               allocate_on_comm_stream)
                checked = signature in self._dispatch_checked
            except Exception:  # noqa: BLE001 - not tensor-like, or unhashable: the checks below say what is wrong
                signature, checked = None, False
        if checked:
            data, scales = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, None)
        else:
            self._check_events(previous_event, async_finish, allocate_on_comm_stream)
            data, scales = check_dispatch_args(self, x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank,
                                               is_token_in_rank, num_tokens_per_expert, topk_idx, topk_weights,
                                               expert_alignment, num_worst_tokens)
            self._dispatch_checked.add(signature)
        if config is None:
            config = self._default_config("dispatch")
        elif not isinstance(config, Config):
            raise InvalidArgument("config", "a uccl_ep.Config (or None)", type(config).__name__)
        self._check_nvl_capacity(data, config)
        if handle is not None:
            self._check_handle(handle, NormalHandle, "dispatch")
            with self._executor.op_scope(previous_event, async_finish, allocate_on_comm_stream) as scope:
                recv_x, recv_scales = self._executor.cached_dispatch(data, scales, handle, config)
            recv = (recv_x, recv_scales) if scales is not None else recv_x
            return recv, None, None, None, None, scope.finish((recv_x, recv_scales))
        if topk_idx is not None and data.device.type == "cpu":  # values: every call
            check_topk_ids_in_range("topk_idx", topk_idx, num_tokens_per_expert.numel())
        with self._executor.op_scope(previous_event, async_finish, allocate_on_comm_stream) as scope:
            recv_x, recv_scales, recv_topk_idx, recv_topk_weights, counts, new_handle = self._executor.dispatch(
                data, scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
                expert_alignment, num_worst_tokens, config)
        recv = (recv_x, recv_scales) if scales is not None else recv_x
        event = scope.finish((recv_x, recv_scales, recv_topk_idx, recv_topk_weights))
        return recv, recv_topk_idx, recv_topk_weights, counts, self._issue_handle(new_handle), event

    @exclusive
    def combine(self, x: torch.Tensor, handle: tuple, topk_weights: Optional[torch.Tensor] = None,
                bias: Union[torch.Tensor, tuple, None] = None, config: Optional[Config] = None,
                previous_event=None, async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (combined_x [T, H], combined_topk_weights [T, K] | None, EventOverlap).

        Unweighted sum over the ranks that received each token (fp32 accumulation), plus the
        optional bias (one tensor or a pair, each [T, H])."""
        self._check_alive()
        self._check_events(previous_event, async_finish, allocate_on_comm_stream)
        self._check_handle(handle, NormalHandle, "combine")
        check_combine_args(x, topk_weights)
        if config is None:
            config = self._default_config("combine")
        elif not isinstance(config, Config):
            raise InvalidArgument("config", "a uccl_ep.Config (or None)", type(config).__name__)
        self._check_nvl_capacity(x, config)
        num_tokens = handle.plan.num_tokens if hasattr(handle.plan, "num_tokens") else None
        biases = self._split_bias(bias, x, num_tokens)
        with self._executor.op_scope(previous_event, async_finish, allocate_on_comm_stream) as scope:
            combined, combined_w = self._executor.combine(x, handle, topk_weights, biases, config)
        return combined, combined_w, scope.finish((combined, combined_w))

    @staticmethod
    def _split_bias(bias, x: torch.Tensor, num_tokens):
        if bias is None:
            return (None, None)
        items = tuple(bias) if isinstance(bias, (tuple, list)) else (bias,)
        if len(items) > 2:
            raise InvalidArgument("bias", "a tensor or a pair of tensors", f"{len(items)} tensors")
        for i, b in enumerate(items):
            check_tensor(f"bias[{i}]", b, dtypes=(x.dtype,), shape=(num_tokens, x.shape[1]), device=x.device)
        return (items + (None, None))[:2]

    def _default_config(self, op: str) -> Config:
        """The Config of a call that passes none: the table's for this group size and Buffer.num_sms.
        NOTES: made once per (op, SM count), not per call (building a Config checks every field: several
        microseconds of each eager op's host path); never handed out, so no caller can change it."""
        key = (op, Buffer.num_sms)
        config = self._default_configs.get(key)
        if config is None:
            table = Buffer.get_dispatch_config if op == "dispatch" else Buffer.get_combine_config
            config = self._default_configs[key] = table(self.group_size)
        return config

    def _check_handle(self, handle: Any, kind: type, op: str) -> None:
        # NOTES: on every op's host path: a handle of the right kind that carries this Buffer's seal
        # passes at once; anything else takes the checks below, which say what is wrong.
        plan = getattr(handle, "plan", None)
        if (type(handle) is kind and handle.owner is self and plan is not None
                and getattr(plan, "_uccl_ep_seal", None) == (id(self), tuple(map(id, handle)))):
            return
        if not isinstance(handle, (NormalHandle,)) and not hasattr(handle, "owner"):
            raise InvalidArgument("handle", f"a handle returned by this Buffer's "
                                  f"{'dispatch' if kind is NormalHandle else 'low_latency_dispatch'}",
                                  type(handle).__name__)
        if not isinstance(handle, kind):
            raise InvalidArgument("handle", f"a {'normal' if kind is NormalHandle else 'low-latency'} handle for {op}",
                                  f"a {getattr(handle, 'kind', type(handle).__name__)} handle",
                                  hint="normal and low-latency handles are not interchangeable")
        if handle.owner is not self:
            raise InvalidArgument("handle", "a handle made by this Buffer", "a handle from another Buffer")
        seal = (id(self), tuple(map(id, handle)))
        if handle.plan is None or hasattr(handle.plan, "__dict__") and getattr(handle.plan, "_uccl_ep_seal", None) != seal:
            raise InvalidArgument("handle", f"a handle returned by this Buffer's "
                                  f"{'dispatch' if kind is NormalHandle else 'low_latency_dispatch'}, unmodified",
                                  "a handle this Buffer did not return (built by hand, or with items replaced)")
