"""Stand-in for Primus-Turbo's EP backend registry, written from its documented interface.

Why a stand-in: Primus-Turbo is not published on PyPI (it is built from source inside ROCm
images with hipcc and its own DeepEP port), so CI (Debian 12, CPU, registries only) cannot
install it. This module reproduces only the surface uccl-ep-primus relies on, as described in
shared/reference/frameworks.md §4 and Primus-Turbo's moe_dispatch_combine_impl.py:

- ``_BACKEND_REGISTRY`` (name -> class, with built-ins; recent releases have a "UCCL" entry for
  uccl-project's ``uccl.ep``), ``_backend_instances`` (lazy singletons), ``register_ep_backend``;
- ``PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND`` (upper-cased) picks the backend by name;
- ``moe_dispatch_impl`` calls ``init_buffer`` (new keyword form, or the older
  ``(group, hidden_bytes, config)`` form when ``INIT_STYLE == "old"``) before a fresh dispatch,
  then ``dispatch(..., num_worst_tokens=, config=)``; ``moe_combine_impl`` calls ``combine``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

ENV = "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND"
INIT_STYLE = "new"


@dataclass
class EPBufferConfig:
    num_sms: int = 64
    dispatch_config: Optional[Any] = None
    combine_config: Optional[Any] = None


class _BuiltinTurbo:
    @staticmethod
    def is_available() -> bool:
        return False  # the in-tree ROCm kernels


class _BuiltinUcclProject:
    """Stand-in for the built-in "UCCL" entry (uccl-project's uccl.ep) of recent releases."""

    def __init__(self) -> None:
        self._buffer = None

    @staticmethod
    def is_available() -> bool:
        return True


_BACKEND_REGISTRY: Dict[str, type] = {"TURBO": _BuiltinTurbo, "UCCL": _BuiltinUcclProject}
_backend_instances: Dict[str, Any] = {}


def register_ep_backend(name: str, cls: type) -> None:
    _BACKEND_REGISTRY[name] = cls


def _get_backend_instance(name: str):
    if name not in _backend_instances:
        if name not in _BACKEND_REGISTRY:
            raise ValueError(f"Unknown EP backend '{name}'. Available: {list(_BACKEND_REGISTRY)}")
        cls = _BACKEND_REGISTRY[name]
        if not cls.is_available():
            raise RuntimeError(f"EP backend '{name}' is registered but its dependencies are not installed.")
        _backend_instances[name] = cls()
    return _backend_instances[name]


def selected_name() -> str:
    return os.environ.get(ENV, "TURBO").upper()


def moe_dispatch_impl(x, group, handle=None, topk_idx=None, token_weights=None, num_experts=None,
                      async_finish=False, allocate_on_comm_stream=False, num_worst_tokens=0):
    backend = _get_backend_instance(selected_name())
    cfg = EPBufferConfig()
    if topk_idx is not None and num_experts is not None:
        data = x[0] if isinstance(x, tuple) else x
        if INIT_STYLE == "new":
            backend.init_buffer(group, hidden_size=data.size(1), num_experts=num_experts, num_topk=topk_idx.size(1),
                                seqlen=data.size(0), fp8_dispatch=isinstance(x, tuple), config=cfg)
        else:
            backend.init_buffer(group, data.size(1) * max(data.element_size(), 2), cfg)
    return backend.dispatch(x, handle=handle, topk_idx=topk_idx, token_weights=token_weights, num_experts=num_experts,
                            async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream,
                            num_worst_tokens=num_worst_tokens, config=cfg.dispatch_config)


def moe_combine_impl(x, group, handle, topk_weights=None, async_finish=False, allocate_on_comm_stream=False):
    backend = _get_backend_instance(selected_name())
    return backend.combine(x, handle=handle, topk_weights=topk_weights, async_finish=async_finish,
                           allocate_on_comm_stream=allocate_on_comm_stream, config=None)
