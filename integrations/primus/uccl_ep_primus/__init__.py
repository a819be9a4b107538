"""uccl-ep for AMD Primus / Primus-Turbo.

`register()` puts `UcclEpBackend` into Primus-Turbo's EP backend registry (``register_ep_backend``)
under "UCCL"; `check_selected()` asks Primus-Turbo's own selection which backend a dispatch will
use and refuses, naming the variable and the cause, when it is not uccl_ep. `activate()` does both
and is what runs in the training process, before the first MoE dispatch:

- ``import uccl_ep_primus.enable`` (e.g. from a Primus patch or your launcher script), or
- ``python -m uccl_ep_primus SCRIPT [ARGS...]`` / ``torchrun ... -m uccl_ep_primus SCRIPT ...``
  (what the recipes in recipes/primus/ render).

Selection, per Primus-Turbo generation (docs/primus.md):

- the ``_backend/`` registry (``init_buffer(group, hidden_size=, ...)``): "UCCL" is a member of its
  ``BackendType`` and a built-in entry for uccl-project's ``uccl.ep``; registering replaces that
  entry in this process, and ``PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND=UCCL`` selects uccl_ep;
- the earlier registry (``init_buffer(group, hidden_bytes, config)``): the variable is read
  through ``BackendType``, which has only TURBO and DEEP_EP there, so "UCCL" silently means TURBO.
  There ``PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND=DEEP_EP`` with the ``deep_ep`` drop-in
  (deep-ep-uccl) is the route, and `check_selected` accepts it.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Optional

from uccl_ep.errors import MissingDependency, Unsupported
from uccl_ep.log import get_logger

from .backend import UcclEpBackend

__version__ = "0.1.0"
__all__ = ["register", "check_selected", "activate", "UcclEpBackend", "REGISTRY_MODULE", "DEFAULT_NAME", "ENV",
           "__version__"]

REGISTRY_MODULE = "primus_turbo.pytorch.kernels.moe.moe_dispatch_combine_impl"
DEFAULT_NAME = "UCCL"
#: Primus-Turbo's variable (primus_turbo/common/constants.py); read here, never written.
ENV = "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND"

logger = get_logger("primus")


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


def _resolved_name(module: ModuleType) -> str:
    for resolver in ("_get_backend_name", "_resolve_backend_name"):
        fn = getattr(module, resolver, None)
        if callable(fn):
            return str(fn())
    raise Unsupported(f"{REGISTRY_MODULE} has neither _get_backend_name() nor _resolve_backend_name(); this "
                      "Primus-Turbo's backend selection is not one uccl-ep-primus knows how to check")


def _deep_ep_is_uccl() -> Optional[str]:
    """None when `import deep_ep` gives uccl_ep's classes here, else what it gives."""
    try:
        import deep_ep
    except ImportError as exc:
        return f"no importable deep_ep ({exc})"
    import uccl_ep

    if getattr(deep_ep, "Buffer", None) is uccl_ep.Buffer:
        return None
    return f"deep_ep from {getattr(deep_ep, '__file__', deep_ep)}, which is not uccl_ep's drop-in"


def check_selected(registry: Optional[ModuleType] = None) -> str:
    """The backend name Primus-Turbo's own selection resolves to, if it runs on uccl_ep.

    Raises `Unsupported` otherwise, naming the variable, its value and the reason: a runner hook or
    launcher overwrote it (Primus's ``05_using_uep.sh`` sets TURBO unless USING_UEP=1, DEEP_EP with
    it), a code-level ``GlobalBackendManager`` setting outranks it, this Primus-Turbo cannot resolve
    the name, or DEEP_EP would import a ``deep_ep`` that is not uccl-ep's drop-in.
    """
    module = registry or _registry()
    value = os.environ.get(ENV)
    shown = f"{ENV}={value!r}" if value is not None else f"{ENV} unset"
    try:
        name = _resolved_name(module)
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - Primus-Turbo's own refusal (e.g. DEEP_EP without deep_ep)
        raise Unsupported(f"Primus-Turbo cannot resolve its EP backend ({shown}): {type(exc).__name__}: {exc}. "
                          f"Set {ENV}=UCCL, or DEEP_EP with the deep_ep drop-in (docs/primus.md)") from exc
    cls = getattr(module, "_BACKEND_REGISTRY", {}).get(name)
    if cls is UcclEpBackend:
        logger.info("Primus-Turbo selects %s -> uccl_ep (%s)", name, shown)
        return name
    if name == "DEEP_EP":
        why = _deep_ep_is_uccl()
        if why is None:
            logger.info("Primus-Turbo selects DEEP_EP -> the deep_ep drop-in -> uccl_ep (%s)", shown)
            return name
        raise Unsupported(f"Primus-Turbo selects DEEP_EP ({shown}) and would run {why}. Install deep-ep-uccl "
                          f"(integrations/deep_ep) for that route, or set {ENV}=UCCL where the Primus-Turbo "
                          "release resolves it (docs/primus.md)")
    manager = _code_level_setting()
    if manager is not None:
        cause = (f"a code-level GlobalBackendManager.set_moe_dispatch_combine_backend({manager}) outranks {ENV}; "
                 "remove it")
    elif value is not None and value.strip().upper() in (DEFAULT_NAME, "UCCL_EP") and name != value.strip().upper():
        cause = (f"this Primus-Turbo resolves {ENV} through GlobalBackendManager's BackendType names, which have no "
                 f"{value.strip().upper()}, so it falls back to {name}; use {ENV}=DEEP_EP with the deep_ep drop-in "
                 "(deep-ep-uccl) on this release")
    else:
        cause = (f"the variable must say UCCL (or DEEP_EP with the deep_ep drop-in) in the training process. If the "
                 f"job goes through Primus's runner, its hook 05_using_uep.sh sets {ENV}=TURBO unless USING_UEP=1 "
                 "(and DEEP_EP with it): launch the entry point directly (recipes/primus/*.toml) or use the DEEP_EP "
                 "route")
    raise Unsupported(f"Primus-Turbo would run MoE dispatch/combine on {name} ({shown}), not on uccl_ep: {cause}")


def _code_level_setting() -> Optional[str]:
    core = sys.modules.get("primus_turbo.pytorch.core.backend")
    manager = getattr(core, "GlobalBackendManager", None)
    table = getattr(manager, "_moe_dispatch_combine_backend", None)
    if not table:
        return None
    values = {getattr(v, "name", str(v)) for v in table.values() if v is not None}
    return ", ".join(sorted(values)) or None


def activate(registry: Optional[ModuleType] = None) -> str:
    """`register` then `check_selected`: uccl_ep will run Primus-Turbo's MoE dispatch/combine."""
    module = registry or _registry()
    register(registry=module)
    return check_selected(module)
