"""Stand-in of Primus-Turbo's EP backend registry (see README.md for what each generation does).

The public surface is upstream's: `EPBufferConfig`, `set_buffer_global_config`, `register_ep_backend`,
`_BACKEND_REGISTRY`, `_backend_instances`, `_get_backend_instance`, `_get_backend_name`,
`moe_dispatch_impl`, `moe_combine_impl`. The DeepEP-style backends are reduced to the Buffer calls
upstream makes (layout, fresh / cached dispatch with `num_worst_tokens`, combine, events).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict, Optional

from primus_turbo.pytorch.core.backend import GENERATION, BackendType, GlobalBackendManager, PrecisionType

_LATEST = GENERATION == "latest"


@dataclass
class EPBufferConfig:
    num_sms: int = 64 if _LATEST else 32
    dispatch_config: Any = None
    combine_config: Any = None


_buffer_config = EPBufferConfig()
_buffer_config_per_backend: Dict[str, EPBufferConfig] = {}


def set_buffer_global_config(num_use_cu: int = 32, autotune_config: Optional[tuple] = None,
                             backend: Optional[str] = None) -> None:
    global _buffer_config
    d, c = autotune_config if autotune_config is not None else (None, None)
    cfg = EPBufferConfig(num_sms=num_use_cu, dispatch_config=d, combine_config=c)
    if _LATEST and backend is not None:
        _buffer_config_per_backend[backend] = cfg
    else:
        _buffer_config = cfg
        _buffer_config_per_backend.clear()


def _config_for(name: str) -> EPBufferConfig:
    return _buffer_config_per_backend.get(name, _buffer_config)


class _DeepEPLikeBackend:
    """Any module with DeepEP's Buffer protocol; subclasses give `_get_module`."""

    def __init__(self) -> None:
        self._buffer = None

    @staticmethod
    def _get_module():
        raise NotImplementedError

    def _make_buffer_kwargs(self, group) -> dict:
        return {}

    def is_initialized(self) -> bool:
        return self._buffer is not None

    @staticmethod
    def supports_cuda_graph() -> bool:
        return True

    def _ensure(self, group, hidden_bytes: int, config: EPBufferConfig) -> None:
        Buffer = self._get_module().Buffer
        Buffer.set_num_sms(config.num_sms)
        cfgs = (config.dispatch_config or Buffer.get_dispatch_config(group.size()),
                config.combine_config or Buffer.get_combine_config(group.size()))
        nvl = max(c.get_nvl_buffer_size_hint(hidden_bytes, group.size()) for c in cfgs)
        try:
            rdma = max(c.get_rdma_buffer_size_hint(hidden_bytes, group.size()) for c in cfgs)
        except (RuntimeError, AttributeError):
            rdma = 0
        b = self._buffer
        if b is None or not isinstance(b, Buffer) or b.group != group or b.num_nvl_bytes < nvl or b.num_rdma_bytes < rdma:
            self._buffer = Buffer(group, nvl, rdma, **self._make_buffer_kwargs(group))

    if _LATEST:
        def init_buffer(self, group, hidden_size, num_experts, num_topk, seqlen, fp8_dispatch, config) -> None:
            self._ensure(group, hidden_size * 2, config)
    else:
        def init_buffer(self, group, hidden_bytes, config) -> None:
            self._ensure(group, hidden_bytes, config)

    def _events(self):
        mod = self._get_module()
        return mod.utils.EventOverlap, mod.utils.EventHandle

    def dispatch(self, x, handle=None, topk_idx=None, token_weights=None, num_experts=None, async_finish=False,
                 allocate_on_comm_stream=False, num_worst_tokens=0, config=None):
        EventOverlap, EventHandle = self._events()
        buf = self._buffer
        assert buf is not None, "init_buffer() must be called before dispatch()"
        prev = EventOverlap(EventHandle()) if async_finish else None
        if handle is None:
            per_rank, per_rdma, per_expert, in_rank, event = buf.get_dispatch_layout(
                topk_idx, num_experts, previous_event=prev, async_finish=async_finish,
                allocate_on_comm_stream=allocate_on_comm_stream)
            out = buf.dispatch(x, topk_idx=topk_idx, topk_weights=token_weights, num_tokens_per_rank=per_rank,
                               num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
                               num_tokens_per_expert=per_expert, previous_event=event, async_finish=async_finish,
                               allocate_on_comm_stream=allocate_on_comm_stream, num_worst_tokens=num_worst_tokens,
                               **({"config": config} if config is not None else {}))
        else:
            out = buf.dispatch(x, handle=handle, previous_event=prev, async_finish=async_finish,
                               allocate_on_comm_stream=allocate_on_comm_stream,
                               **({"config": config} if config is not None else {}))
        recv_x, recv_idx, recv_w, per_expert_counts, handle, after = out
        if async_finish:
            after.current_stream_wait()
        return recv_x, recv_idx, recv_w, per_expert_counts, handle

    def combine(self, x, handle, topk_weights=None, async_finish=False, allocate_on_comm_stream=False, config=None):
        EventOverlap, EventHandle = self._events()
        buf = self._buffer
        assert buf is not None, "init_buffer() must be called before combine()"
        prev = EventOverlap(EventHandle()) if async_finish else None
        combined, combined_w, after = buf.combine(
            x, handle=handle, topk_weights=None if topk_weights is None else topk_weights.float(),
            async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream, previous_event=prev,
            **({"config": config} if config is not None else {}))
        if async_finish:
            after.current_stream_wait()
        return combined, combined_w

    def release_buffer(self) -> None:
        self._buffer = None


class TurboEPBackend(_DeepEPLikeBackend):
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def _get_module():
        import primus_turbo.pytorch.deep_ep as turbo_ep  # raises in the stand-in

        return turbo_ep


class DeepEPBackend(_DeepEPLikeBackend):
    @staticmethod
    def is_available() -> bool:
        try:
            import deep_ep  # noqa: F401
        except ImportError:
            return False
        return True

    @staticmethod
    def _get_module():
        import deep_ep

        return deep_ep

    def _make_buffer_kwargs(self, group) -> dict:
        try:
            param = inspect.signature(self._get_module().Buffer).parameters.get("is_intranode")
        except (TypeError, ValueError):
            param = None
        if param is not None and param.default is False:
            return {"is_intranode": group.size() <= 8}  # uccl-project's wrapper
        return {}


class _NotInstalled(_DeepEPLikeBackend):
    module = ""

    @classmethod
    def is_available(cls) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(cls.module) is not None
        except (ImportError, ValueError):
            return False


class MoriEPBackend(_NotInstalled):
    module = "mori"


class UCCLEPBackend(_NotInstalled):
    """uccl-project's `uccl.ep` (the latest generation's built-in UCCL entry)."""

    module = "uccl"


_BACKEND_REGISTRY: Dict[str, type] = {"TURBO": TurboEPBackend, "DEEP_EP": DeepEPBackend}
if _LATEST:
    _BACKEND_REGISTRY.update(MORI=MoriEPBackend, UCCL=UCCLEPBackend)
_backend_instances: Dict[str, Any] = {}


def register_ep_backend(name: str, cls: type) -> None:
    _BACKEND_REGISTRY[name] = cls


def _get_backend_instance(name: str):
    if name not in _backend_instances:
        if name not in _BACKEND_REGISTRY:
            raise ValueError(f"Unknown EP backend '{name}'. Available: {list(_BACKEND_REGISTRY.keys())}")
        cls = _BACKEND_REGISTRY[name]
        if not cls.is_available():
            raise RuntimeError(f"EP backend '{name}' is registered but its dependencies are not installed.")
        _backend_instances[name] = cls()
    return _backend_instances[name]


_DEFAULT_BACKEND_NAME = "TURBO"
_BACKEND_TYPE_TO_NAME = {BackendType[n]: n for n in ("TURBO", "DEEP_EP", "MORI", "UCCL") if n in BackendType.__members__}


def _get_backend_name() -> str:
    if _LATEST:
        bt = GlobalBackendManager.get_ep_backend(PrecisionType.BF16_FP16_FP32)
        return _DEFAULT_BACKEND_NAME if bt is None else _BACKEND_TYPE_TO_NAME.get(bt, _DEFAULT_BACKEND_NAME)
    bt = GlobalBackendManager.get_moe_dispatch_combine_backend(PrecisionType.BF16_FP16_FP32)
    return bt.name if bt is not None else _DEFAULT_BACKEND_NAME


def get_hidden_bytes(x) -> int:
    inp = x[0] if isinstance(x, tuple) else x
    return inp.size(1) * max(inp.element_size(), 2)


def moe_dispatch_impl(x, group, handle=None, topk_idx=None, token_weights=None, num_experts=None,
                      async_finish=False, allocate_on_comm_stream=False, num_worst_tokens=0):
    name = _get_backend_name()
    cfg = _config_for(name)
    backend = _get_backend_instance(name)
    kwargs = dict(handle=handle, topk_idx=topk_idx, token_weights=token_weights, num_experts=num_experts,
                  async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream,
                  num_worst_tokens=num_worst_tokens)
    if not _LATEST:
        backend.init_buffer(group, get_hidden_bytes(x), cfg)
        return backend.dispatch(x, **kwargs)
    if num_experts is None or topk_idx is None:
        assert backend.is_initialized(), "Backend is not initialized"
    else:
        inp = x[0] if isinstance(x, tuple) else x
        backend.init_buffer(group, hidden_size=inp.size(1), num_experts=num_experts, num_topk=topk_idx.size(1),
                            seqlen=inp.size(0), fp8_dispatch=isinstance(x, tuple), config=cfg)
    return backend.dispatch(x, config=cfg.dispatch_config, **kwargs)


def moe_combine_impl(x, group, handle, topk_weights=None, async_finish=False, allocate_on_comm_stream=False):
    name = _get_backend_name()
    cfg = _config_for(name)
    backend = _get_backend_instance(name)
    kwargs = dict(handle=handle, topk_weights=topk_weights, async_finish=async_finish,
                  allocate_on_comm_stream=allocate_on_comm_stream)
    if not _LATEST:
        backend.init_buffer(group, get_hidden_bytes(x), cfg)
        return backend.combine(x, **kwargs)
    assert backend.is_initialized(), "Backend is not initialized"
    return backend.combine(x, config=cfg.combine_config, **kwargs)


__all__ = ["EPBufferConfig", "set_buffer_global_config", "register_ep_backend", "moe_dispatch_impl",
           "moe_combine_impl"]
