"""`UcclEpBackend`: Primus-Turbo's EP backend protocol implemented on `uccl_ep.Buffer`.

Primus-Turbo (primus_turbo/pytorch/kernels/moe/moe_dispatch_combine_impl.py) looks a backend up
by name in its registry and calls, per MoE layer:

    backend.init_buffer(group, hidden_size=, num_experts=, num_topk=, seqlen=, fp8_dispatch=, config=)
        (before a fresh dispatch; the earlier registry calls init_buffer(group, hidden_bytes, config)
        positionally before every dispatch and combine)
    backend.dispatch(x, handle=None, topk_idx=, token_weights=, num_experts=, async_finish=,
                     allocate_on_comm_stream=, num_worst_tokens=, config=)
        -> (recv_x, recv_topk_idx, recv_topk_weights, tokens_per_expert, handle)
    backend.dispatch(x, handle=handle, ...)              (cached layout: backward of combine)
    backend.combine(x, handle, topk_weights=, async_finish=, allocate_on_comm_stream=, config=)
        -> (combined_x, combined_topk_weights)

``config`` is Primus-Turbo's EPBufferConfig (num_sms, dispatch_config, combine_config). This class
does not inherit Primus-Turbo's DeepEP base so it works with every release that has the registry;
it follows the same call sequence as DeepEP (layout, then dispatch; events on async_finish).
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist

import uccl_ep
from uccl_ep import EventHandle, EventOverlap
from uccl_ep.errors import InvalidArgument

__all__ = ["UcclEpBackend"]

_CONFIG_FIELDS = ("num_sms", "num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens",
                  "num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens")


def _as_uccl_config(cfg: Any) -> Optional[uccl_ep.Config]:
    """A tuned DeepEP-style Config (any class with DeepEP's fields) as a uccl_ep.Config."""
    if cfg is None or isinstance(cfg, uccl_ep.Config):
        return cfg
    missing = [f for f in _CONFIG_FIELDS if not hasattr(cfg, f)]
    if missing:
        raise InvalidArgument("config", f"a DeepEP-style Config with {', '.join(_CONFIG_FIELDS)}",
                              f"{type(cfg).__name__} without {', '.join(missing)}")
    return uccl_ep.Config(*(int(getattr(cfg, f)) for f in _CONFIG_FIELDS))


def _hidden_bytes(args: tuple, kwargs: dict) -> tuple[int, Any]:
    """(hidden_bytes, EPBufferConfig) from either generation of ``init_buffer``'s arguments."""
    if "hidden_size" in kwargs or len(args) >= 5:
        names = ("hidden_size", "num_experts", "num_topk", "seqlen", "fp8_dispatch", "config")
        values = dict(zip(names, args))
        values.update(kwargs)
        # NOTES: sized for 2-byte elements at least (as DeepEP-style backends do), so FP8 payloads
        # and bf16 grads share one buffer.
        return int(values["hidden_size"]) * 2, values.get("config")
    if "hidden_bytes" in kwargs or len(args) in (1, 2):
        values = dict(zip(("hidden_bytes", "config"), args))
        values.update(kwargs)
        return int(values["hidden_bytes"]), values.get("config")
    raise InvalidArgument("init_buffer()", "(group, hidden_size, num_experts, num_topk, seqlen, fp8_dispatch, config) "
                          "or (group, hidden_bytes, config)", f"{len(args)} positional, keywords {sorted(kwargs)}")


class UcclEpBackend:
    """uccl_ep behind Primus-Turbo's ``register_ep_backend`` (one instance per process)."""

    name = "UCCL"

    def __init__(self) -> None:
        self._buffer: Optional[uccl_ep.Buffer] = None

    # --- capability ------------------------------------------------------------------------------
    @staticmethod
    def is_available() -> bool:
        return True  # uccl_ep is imported by this module

    @staticmethod
    def supports_cuda_graph() -> bool:
        # NOTES: dispatch learns receive counts on the host (as DeepEP's normal mode does without
        # num_worst_tokens), which a captured graph cannot do; Primus-Turbo then warns under capture.
        return False

    @classmethod
    def can_release(cls, *, will_reinit: bool = False) -> bool:  # noqa: ARG003
        return True

    def is_initialized(self) -> bool:
        return self._buffer is not None

    def setup_env(self, **overrides: Optional[str]) -> None:
        """Nothing to export: uccl_ep reads its own registry (docs/env.md) and never writes os.environ."""
        if any(v is not None for v in overrides.values()):
            raise InvalidArgument("setup_env()", "no overrides (configure uccl_ep with UCCL_EP_* variables)",
                                  sorted(k for k, v in overrides.items() if v is not None))

    # --- buffer ----------------------------------------------------------------------------------
    def init_buffer(self, group: dist.ProcessGroup, *args: Any, **kwargs: Any) -> None:
        hidden_bytes, config = _hidden_bytes(args, kwargs)
        num_sms = getattr(config, "num_sms", None)
        if num_sms is not None:
            uccl_ep.Buffer.set_num_sms(int(num_sms))
        ranks = group.size()
        dispatch_cfg = _as_uccl_config(getattr(config, "dispatch_config", None)) or \
            uccl_ep.Buffer.get_dispatch_config(ranks)
        combine_cfg = _as_uccl_config(getattr(config, "combine_config", None)) or \
            uccl_ep.Buffer.get_combine_config(ranks)
        nvl = max(c.get_nvl_buffer_size_hint(hidden_bytes, ranks) for c in (dispatch_cfg, combine_cfg))
        rdma = max(c.get_rdma_buffer_size_hint(hidden_bytes, ranks) for c in (dispatch_cfg, combine_cfg))
        buf = self._buffer
        if buf is None or buf.group is not group or buf.num_nvl_bytes < nvl or buf.num_rdma_bytes < rdma:
            self._buffer = uccl_ep.Buffer(group, nvl, rdma)

    def release_buffer(self) -> None:
        self._buffer = None

    def _require_buffer(self, op: str) -> uccl_ep.Buffer:
        if self._buffer is None:
            raise InvalidArgument("self", f"an initialized backend before {op}()", "no buffer",
                                  hint="Primus-Turbo calls init_buffer() on the first dispatch with topk_idx")
        return self._buffer

    # --- communication ---------------------------------------------------------------------------
    def dispatch(self, x, handle=None, topk_idx=None, token_weights=None, num_experts=None, async_finish=False,
                 allocate_on_comm_stream=False, num_worst_tokens=0, config=None):
        buf = self._require_buffer("dispatch")
        config = _as_uccl_config(config)
        start = EventOverlap(EventHandle()) if async_finish else None
        if handle is None:
            if topk_idx is None or token_weights is None or num_experts is None:
                raise InvalidArgument("topk_idx", "topk_idx, token_weights and num_experts for a fresh dispatch",
                                      "a missing one", hint="pass handle= for a cached dispatch")
            per_rank, per_rdma_rank, per_expert, in_rank, event = buf.get_dispatch_layout(
                topk_idx, num_experts, previous_event=start, async_finish=async_finish,
                allocate_on_comm_stream=allocate_on_comm_stream)
            recv_x, recv_idx, recv_w, per_expert_counts, handle, done = buf.dispatch(
                x, topk_idx=topk_idx, topk_weights=token_weights, num_tokens_per_rank=per_rank,
                num_tokens_per_rdma_rank=per_rdma_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                num_worst_tokens=num_worst_tokens, config=config, previous_event=event, async_finish=async_finish,
                allocate_on_comm_stream=allocate_on_comm_stream)
        else:
            recv_x, recv_idx, recv_w, per_expert_counts, handle, done = buf.dispatch(
                x, handle=handle, config=config, previous_event=start, async_finish=async_finish,
                allocate_on_comm_stream=allocate_on_comm_stream)
        if async_finish:
            done.current_stream_wait()
        return recv_x, recv_idx, recv_w, per_expert_counts, handle

    def combine(self, x, handle, topk_weights=None, async_finish=False, allocate_on_comm_stream=False, config=None):
        buf = self._require_buffer("combine")
        start = EventOverlap(EventHandle()) if async_finish else None
        combined, combined_w, done = buf.combine(
            x, handle=handle, topk_weights=None if topk_weights is None else topk_weights.float(),
            config=_as_uccl_config(config), previous_event=start, async_finish=async_finish,
            allocate_on_comm_stream=allocate_on_comm_stream)
        if async_finish:
            done.current_stream_wait()
        return combined, combined_w

    def tune_configs(self, *args: Any, **kwargs: Any):
        """Primus-Turbo's autotuner skips backends that raise this."""
        raise NotImplementedError("uccl_ep has no config autotuning yet; its default configs are used")
