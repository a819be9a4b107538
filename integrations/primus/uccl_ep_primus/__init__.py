"""uccl-ep for AMD Primus / Primus-Turbo: ``PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND=UCCL``.

`register()` puts `UcclEpBackend` into Primus-Turbo's EP backend registry under "UCCL"
(``register_ep_backend``); Primus-Turbo then selects it by that environment variable. Call it
in the training process before the first MoE dispatch:

- ``import uccl_ep_primus.enable`` (e.g. from a Primus patch or your launcher script), or
- ``python -m uccl_ep_primus SCRIPT [ARGS...]`` / ``torchrun ... -m uccl_ep_primus SCRIPT ...``.

Recent Primus-Turbo releases ship their own "UCCL" entry for uccl-project's ``uccl.ep``; this
registration replaces it in the process (the name is what Primus-Turbo's selection maps to).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

from uccl_ep.errors import MissingDependency, Unsupported

from .backend import UcclEpBackend

__version__ = "0.1.0"
__all__ = ["register", "UcclEpBackend", "REGISTRY_MODULE", "DEFAULT_NAME", "__version__"]

REGISTRY_MODULE = "primus_turbo.pytorch.kernels.moe.moe_dispatch_combine_impl"
DEFAULT_NAME = "UCCL"


def _registry() -> ModuleType:
    try:
        module = importlib.import_module(REGISTRY_MODULE)
    except ImportError as exc:
        raise MissingDependency(f"uccl-ep-primus needs Primus-Turbo ({REGISTRY_MODULE} did not import: {exc})") from exc
    return module


def register(name: str = DEFAULT_NAME, registry: Optional[ModuleType] = None) -> type:
    """Register `UcclEpBackend` as ``name`` (upper-cased, as Primus-Turbo reads the env var).

    Idempotent. Refuses (`Unsupported`) when another class already serves ``name`` with a live
    buffer in this process, since swapping it would strand that buffer's in-flight handles.
    """
    module = registry or _registry()
    if not callable(getattr(module, "register_ep_backend", None)):
        raise Unsupported(f"this Primus-Turbo has no {REGISTRY_MODULE}.register_ep_backend(name, cls); "
                          "uccl-ep-primus needs a release with the EP backend registry")
    key = name.upper()
    instances = getattr(module, "_backend_instances", None)
    if isinstance(instances, dict) and key in instances and not isinstance(instances[key], UcclEpBackend):
        live = instances[key]
        if getattr(live, "_buffer", None) is not None:
            raise Unsupported(f"Primus-Turbo backend {key!r} is already in use by {type(live).__name__} with a live "
                              "buffer; register uccl_ep before the first MoE dispatch")
        del instances[key]  # an idle instance of the class being replaced
    module.register_ep_backend(key, UcclEpBackend)
    return UcclEpBackend
