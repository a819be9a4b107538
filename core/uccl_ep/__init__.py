"""uccl_ep: portable expert-parallel dispatch/combine with DeepEP V1's API.

    import uccl_ep
    buffer = uccl_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes)   # same as deep_ep.Buffer

Public surface (docs/api.md): Buffer, Config, Tuning, EventOverlap, EventHandle, topk_idx_t, utils,
refs (the pure-torch reference), env (env-var registry), errors (typed errors).
Importing this package touches no GPU, no NIC and no compiler.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from . import env, errors, log
from .tuning import Tuning

__all__ = ["__version__", "Buffer", "Config", "Tuning", "EventHandle", "EventOverlap", "topk_idx_t", "utils", "env",
           "errors", "get_low_latency_rdma_size_hint"]

# NOTES: the names below load torch; they are imported on first use (PEP 562) so that `uccl_ep.env`
# (the env registry) stays importable without torch, e.g. by the framework plugins' status checks.
_LAZY = {"Buffer": ("buffer", "Buffer"), "topk_idx_t": ("buffer", "topk_idx_t"), "Config": ("config", "Config"),
         "EventHandle": ("events", "EventHandle"), "EventOverlap": ("events", "EventOverlap"),
         "utils": ("utils", None)}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "get_low_latency_rdma_size_hint":
        value = __getattr__("Buffer").get_low_latency_rdma_size_hint
    elif name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(f".{module}", __name__)
        value = mod if attr is None else getattr(mod, attr)
    else:
        try:  # a submodule not imported yet (e.g. uccl_ep.cuda after a plain `import uccl_ep`)
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


log.configure()
