"""The native module (`uccl_ep._C`), imported on first use so that importing uccl_ep needs no build."""

from __future__ import annotations

from ..errors import MissingDependency

__all__ = ["native"]


def native():
    """The native module, or `MissingDependency` saying how to get it."""
    try:
        from .. import _C
    except ImportError as e:  # pragma: no cover - the package always ships _C
        raise MissingDependency(f"uccl_ep's native module is missing ({e}); reinstall uccl-ep (pip install ./core from the checkout)") from e
    return _C
