"""DeepEP V1 as a baseline of the benchmark matrix: find the real library, build its buffers.

uccl-ep ships a drop-in package also named ``deep_ep`` (integrations/deep_ep) whose classes are
uccl_ep's. Benchmarking it as "DeepEP" would compare uccl-ep with itself, so `find_deepep` accepts
a ``deep_ep`` only when all of these hold:
- its compiled extension ``deep_ep_cpp`` imports (the shim has none);
- ``deep_ep`` is not loaded from uccl-ep's own integrations folder;
- ``deep_ep.Buffer`` is neither ``uccl_ep.Buffer`` nor a subclass of it.
Each refusal says why, and the bench prints that reason beside its table.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["DeepEP", "find_deepep", "Lib", "uccl_lib", "deepep_lib"]


@dataclass
class DeepEP:
    """The outcome of a look for DeepEP: ``module`` when usable, else None and ``reason``."""
    module: Any
    reason: str
    version: str = ""

    @property
    def found(self) -> bool:
        return self.module is not None


def _shim_dir() -> str:
    """uccl-ep's integrations/deep_ep folder of this checkout (may not exist in a wheel install)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "integrations", "deep_ep"))


def find_deepep() -> DeepEP:
    """Import the real DeepEP V1 if it is on the path; never uccl-ep's drop-in ``deep_ep``."""
    try:
        mod = importlib.import_module("deep_ep")
    except Exception as e:  # noqa: BLE001  an optional baseline: any import failure means "absent"
        return DeepEP(None, f"`import deep_ep` failed ({type(e).__name__}: {e})")
    path = os.path.normpath(os.path.abspath(getattr(mod, "__file__", "") or ""))
    version = str(getattr(mod, "__version__", ""))
    if "+uccl" in version or path.startswith(_shim_dir() + os.sep):
        return DeepEP(None, f"`deep_ep` at {path} is uccl-ep's drop-in package, not DeepEP", version)
    try:
        import uccl_ep
        buffer_cls = getattr(mod, "Buffer", None)
        if buffer_cls is None:
            return DeepEP(None, f"`deep_ep` at {path} has no Buffer", version)
        if buffer_cls is uccl_ep.Buffer or (isinstance(buffer_cls, type) and issubclass(buffer_cls, uccl_ep.Buffer)):
            return DeepEP(None, f"`deep_ep.Buffer` at {path} is uccl_ep.Buffer (a drop-in), not DeepEP", version)
    except ImportError:
        pass
    try:
        importlib.import_module("deep_ep_cpp")
    except Exception as e:  # noqa: BLE001
        return DeepEP(None, f"`deep_ep` at {path} imports but its extension `deep_ep_cpp` does not "
                            f"({type(e).__name__}: {e}): not DeepEP's build", version)
    return DeepEP(mod, f"DeepEP from {os.path.dirname(path)}", version)


class Lib:
    """One library behind DeepEP V1's Buffer API, as the matrix drives it: how to build its
    normal-mode and low-latency buffers; every call after that is the same for both libraries."""

    def __init__(self, name: str, module: Any, ht_kwargs: dict, ll_kwargs: dict) -> None:
        self.name = name
        self.module = module
        self.Buffer = module.Buffer
        self._ht_kwargs = ht_kwargs
        self._ll_kwargs = ll_kwargs
        self.buffers: list = []

    def ht_buffer(self, group, num_nvl_bytes: int):
        buf = self.Buffer(group, num_nvl_bytes, 0, **self._ht_kwargs)
        self.buffers.append(buf)
        return buf

    def ll_buffer(self, group, num_rdma_bytes: int, num_qps_per_rank: int):
        buf = self.Buffer(group, 0, num_rdma_bytes, low_latency_mode=True, num_qps_per_rank=num_qps_per_rank,
                          allow_nvlink_for_low_latency_mode=True, **self._ll_kwargs)
        self.buffers.append(buf)
        return buf

    def can_graph(self, buf, device) -> bool:
        """Whether low-latency calls of ``buf`` can be captured in a CUDA graph here."""
        if device.type != "cuda":
            return False
        return self.name != "uccl-ep" or getattr(buf, "backend", "") == "cuda"

    def destroy(self) -> None:
        """Release the buffers (DeepEP's are built with ``explicitly_destroy=True``: its destructor
        path can hang at interpreter exit)."""
        for buf in self.buffers:
            if getattr(buf, "explicitly_destroy", False) and getattr(buf, "runtime", None) is not None:
                buf.destroy()
        self.buffers.clear()


def uccl_lib(backend: str, tune: Sequence[str] = ()) -> Lib:
    """uccl-ep's Buffers, with ``tune`` (``--tune`` key=value texts) as their Tuning where given."""
    import uccl_ep
    kw = dict(backend=backend)
    if tune:
        kw["tuning"] = uccl_ep.Tuning.from_pairs(tune)
    return Lib("uccl-ep", uccl_ep, kw, dict(kw))


def deepep_lib(found: DeepEP) -> Lib:
    if not found.found:
        raise ValueError(f"DeepEP is not available: {found.reason}")
    return Lib("deepep", found.module, dict(explicitly_destroy=True), dict(explicitly_destroy=True))
