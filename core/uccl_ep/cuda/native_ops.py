"""uccl_ep's torch ops (core/csrc/torch_ops, torch's stable C ABI): an eager low-latency op's
output allocation, parameters, send launch, error-word check and receive launch in one call.

Built beside the native module when the build saw torch >= 2.10's headers; loaded here by
`torch.ops.load_library` after torch. Where the library is missing or does not load (an older
torch, a build without torch), `ops()` is None, `unavailable_reason()` says why, and the engines
take the Python path (the same kernels and parameters, more host time per call).
"""

from __future__ import annotations

import os

import torch

__all__ = ["ops", "unavailable_reason", "RECEIVE_LAUNCHED", "RECEIVE_LEFT_TO_CALLER", "ERROR_WORD_SET"]

# The ops' last output (torch_ops/ll_ops.cc, Status).
RECEIVE_LAUNCHED, RECEIVE_LEFT_TO_CALLER, ERROR_WORD_SET = 0, 1, 2

_loaded: tuple | None = None  # (ops namespace or None, why not)


def _library_path() -> str:
    """Where the build installs the op library: beside the native module."""
    from .. import _C
    return os.path.join(os.path.dirname(_C.__file__), "_ops.so")


def _load() -> tuple:
    from .. import _C
    path = _library_path()
    if not os.path.exists(path):
        return None, f"{path} was not built (the build saw no torch >= 2.10 headers)"
    try:
        torch.ops.load_library(path)
        ns = torch.ops.uccl_ep
        theirs, ours = int(ns.op_plan_abi()), int(_C.cuda.op_plan_abi())
        if theirs != ours:
            return None, (f"{path} was built for another uccl_ep._C (op plan layout {theirs:#x}, this build's "
                          f"{ours:#x}): rebuild uccl-ep")
        # NOTES: the overloads' own callables (OpOverload._op): calling the OpOverload adds a Python
        # frame to every eager op; no autograd or tracing applies to these ops.
        return tuple(getattr(op, "_op", op) for op in (ns.ll_dispatch.default, ns.ll_combine.default)), None
    except (OSError, RuntimeError, AttributeError) as e:
        return None, f"{path} did not load under torch {torch.__version__}: {e}"


def ops():
    """(ll_dispatch, ll_combine) callables of the ops, or None where the library is unavailable."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded[0]


def unavailable_reason() -> str | None:
    ops()
    return _loaded[1]
