"""Point SGLang's DeepEP dispatcher module at uccl_ep, in this process.

`sglang.srt.layers.moe.token_dispatcher.deepep` does `from deep_ep import Buffer, Config` at
import time and looks both names up as module globals whenever it builds a buffer or a config
(`DeepEPBuffer.get_deepep_buffer`, `DeepEPConfig`, the normal and low-latency impls). Rebinding
those globals therefore switches every DeepEP-path dispatcher of the process (main model, draft
model, two-batch overlap) to uccl_ep without touching SGLang's code, and leaves the installed
`deep_ep` package (sgl-deep-ep, a hard dependency since 0.5.20) alone for everything else.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import threading
from typing import Any

__all__ = ["DISPATCHER_MODULE", "activate", "rebind", "is_rebound"]

logger = logging.getLogger("uccl_ep.sglang")  # below uccl_ep: UCCL_EP_LOG_LEVEL applies

DISPATCHER_MODULE = "sglang.srt.layers.moe.token_dispatcher.deepep"

# NOTES: SGLang's module imports the FP8 quantizer only after `from deep_ep import ...` succeeded,
# so where deep_ep failed to import (no usable GPU at import time, or not installed before 0.5.20)
# the name is missing. It moved between releases; the first importable one is used.
_FP8_QUANT_MODULES = (
    "sglang.kernels.ops.quantization.fp8_kernel",       # 0.5.17+
    "sglang.srt.layers.quantization.fp8_kernel",        # 0.5.11 .. 0.5.16
)

_lock = threading.Lock()
_finder_installed = False


def is_rebound(module: Any) -> bool:
    return bool(getattr(module, "__uccl_ep__", False))


def _lazy_fp8_quant(*args: Any, **kwargs: Any) -> Any:
    for name in _FP8_QUANT_MODULES:
        try:
            fn = getattr(importlib.import_module(name), "sglang_per_token_group_quant_fp8")
        except (ImportError, AttributeError):
            continue
        return fn(*args, **kwargs)
    from uccl_ep.errors import MissingDependency
    raise MissingDependency("FP8 dispatch with --moe-a2a-backend uccl needs SGLang's "
                            "`sglang_per_token_group_quant_fp8` kernel (sglang-kernel), which "
                            f"could not be imported from any of {', '.join(_FP8_QUANT_MODULES)}")


def rebind(module: Any) -> None:
    """Make `module` (SGLang's deepep.py) use uccl_ep's Buffer and Config. Idempotent."""
    import uccl_ep  # torch is imported here; nothing initializes CUDA

    with _lock:
        if is_rebound(module):
            return
        previous = getattr(module, "Buffer", None)
        module.Buffer = uccl_ep.Buffer
        module.Config = uccl_ep.Config
        if not hasattr(module, "sglang_per_token_group_quant_fp8"):
            module.sglang_per_token_group_quant_fp8 = _lazy_fp8_quant
        module.use_deepep = True
        if hasattr(module, "_deepep_import_error"):
            module._deepep_import_error = None
        # A DeepEPConfig singleton built before the swap holds the old Config objects and the old
        # Buffer.num_sms; drop it so the next get_instance() rebuilds it from uccl_ep.
        config_cls = getattr(module, "DeepEPConfig", None)
        if config_cls is not None and getattr(config_cls, "_instance", None) is not None:
            config_cls._instance = None
        module.__uccl_ep__ = True
    logger.info("uccl_ep_sglang: %s now uses uccl_ep.Buffer (was %s)", DISPATCHER_MODULE,
                getattr(previous, "__module__", None))


class _RebindAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the dispatcher module with the other finders, then rebinds it right after it runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname != DISPATCHER_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                self._inner = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        rebind(module)


def activate() -> None:
    """Rebind now if SGLang's dispatcher module is loaded, else as soon as it is imported."""
    global _finder_installed
    module = sys.modules.get(DISPATCHER_MODULE)
    if module is not None:
        rebind(module)
        return
    with _lock:
        if not _finder_installed:
            sys.meta_path.insert(0, _RebindAfterImport())
            _finder_installed = True
