"""Make the name `deep_ep` mean uccl_ep in this process, for vLLM's DeepEP code.

vLLM's DeepEP managers (`device_communicators/all2all.py`) `import deep_ep` at call time, its
prepare/finalize modules (`fused_moe/prepare_finalize/deepep_{ht,ll}.py`) at import time, and
`fused_moe/all2all_utils.py` imports those only `if has_deep_ep()`, a cached find_spec plus trial
import. An entry in `sys.modules` whose `__spec__` is real satisfies all three; the cache is
cleared, and modules that bound the old names before the alias existed are re-pointed.

vLLM does not ship a `deep_ep` of its own, so the alias hides only a DeepEP the user installed,
and only in processes where a uccl_* backend was chosen.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import logging
import sys
import threading
import types

__all__ = ["install", "build_module"]

logger = logging.getLogger("uccl_ep.vllm")  # below uccl_ep: UCCL_EP_LOG_LEVEL applies

_PF = "vllm.model_executor.layers.fused_moe.prepare_finalize"
_ALL2ALL_UTILS = "vllm.model_executor.layers.fused_moe.all2all_utils"
_lock = threading.Lock()


def build_module() -> types.ModuleType:
    """A module named `deep_ep` exporting uccl_ep's DeepEP V1 surface."""
    import uccl_ep  # torch is imported here; nothing initializes CUDA

    mod = types.ModuleType("deep_ep", "uccl_ep under the name deep_ep (uccl-ep-vllm)")
    for name in ("Buffer", "Config", "EventOverlap", "EventHandle", "topk_idx_t", "utils", "__version__"):
        setattr(mod, name, getattr(uccl_ep, name))
    # NOTES: importlib.util.find_spec("deep_ep") returns sys.modules["deep_ep"].__spec__ and raises
    # ValueError when it is None; vLLM's has_deep_ep() treats that as "absent".
    mod.__spec__ = importlib.machinery.ModuleSpec("deep_ep", loader=None, origin="uccl_ep", is_package=True)
    mod.__path__ = []
    mod.__uccl_ep__ = True
    return mod


def _repoint_loaded_modules(alias: types.ModuleType) -> None:
    for name in (f"{_PF}.deepep_ht", f"{_PF}.deepep_ll"):
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "deep_ep", None) is not alias:
            loaded.deep_ep = alias
    utils = sys.modules.get(_ALL2ALL_UTILS)
    if utils is not None and not hasattr(utils, "DeepEPHTPrepareAndFinalize"):
        # all2all_utils ran `if has_deep_ep():` before the alias existed; give it the names it
        # would have imported.
        ht = importlib.import_module(f"{_PF}.deepep_ht")
        ll = importlib.import_module(f"{_PF}.deepep_ll")
        utils.DeepEPHTPrepareAndFinalize = ht.DeepEPHTPrepareAndFinalize
        utils.DeepEPLLPrepareAndFinalize = ll.DeepEPLLPrepareAndFinalize
        utils.DEEPEP_QUANT_BLOCK_SHAPE = ll.DEEPEP_QUANT_BLOCK_SHAPE


def install() -> types.ModuleType:
    """Install the alias (idempotent) and return it."""
    with _lock:
        current = sys.modules.get("deep_ep")
        if current is not None and getattr(current, "__uccl_ep__", False):
            alias = current
        else:
            if current is not None:
                logger.warning("uccl_ep_vllm: a uccl_* all2all backend was chosen; the installed deep_ep "
                               "(%s) is hidden in this process", getattr(current, "__file__", current))
            alias = build_module()
            sys.modules["deep_ep"] = alias
            sys.modules["deep_ep.utils"] = alias.utils
        try:
            from vllm.utils import import_utils
            import_utils._has_module.cache_clear()
        except (ImportError, AttributeError):  # moved in an untested version: has_deep_ep re-checks anyway
            pass
    _repoint_loaded_modules(alias)
    return alias
