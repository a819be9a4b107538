"""The `cuda` backend: JIT-compiled CUDA kernels (core/kernels) over NVLink, driven through the lazy
driver API in `uccl_ep._C.cuda`. Importing this package needs neither a GPU nor nvcc; both are
looked up at first use and reported with `MissingDependency` when absent."""

from __future__ import annotations

__all__ = ["load_executor", "unavailable_reason"]


def load_executor():
    from .executor import CudaExecutor
    return CudaExecutor


def unavailable_reason(ctx) -> str | None:
    from .executor import unavailable_reason as reason
    return reason(ctx)
