"""Stand-in of Primus-Turbo's backend manager: `BackendType`, `PrecisionType`, `GlobalBackendManager`.

Priority, as upstream: a code-level setting (`set_moe_dispatch_combine_backend`) beats the
environment variable, which is parsed into a `BackendType` member (one name for every precision;
upper-cased). A name that is not a member gives None ("not set"), as upstream documents for custom
EP backend names. Which members exist depends on the generation (see README.md).
"""

from __future__ import annotations

import os
from enum import Enum, auto
from typing import Dict, Optional

from primus_turbo.common.constants import ENV_AUTO_TUNE, ENV_MOE_DISPATCH_COMBINE_BACKEND

GENERATION = os.environ.get("PRIMUS_TURBO_STANDIN", "latest")
if GENERATION not in ("a6a16cdc", "latest"):
    raise ValueError(f"PRIMUS_TURBO_STANDIN={GENERATION!r}: expected a6a16cdc or latest")

try:
    import deep_ep  # noqa: F401

    HAVE_DEEP_EP = True
except ImportError:
    HAVE_DEEP_EP = False


class PrecisionType(Enum):
    FP4 = auto()
    FP8 = auto()
    BF16_FP16_FP32 = auto()


_MEMBERS = ["CK", "HIPBLASLT", "AITER", "TRITON", "DEEP_EP", "TURBO"]
if GENERATION == "latest":
    _MEMBERS += ["MORI", "UCCL"]
BackendType = Enum("BackendType", _MEMBERS)


class GlobalBackendManager:
    _moe_dispatch_combine_backend: Optional[Dict[PrecisionType, Optional["BackendType"]]] = None
    _auto_tune: Optional[bool] = None

    @classmethod
    def set_moe_dispatch_combine_backend(cls, backend=None, precision: Optional[PrecisionType] = None) -> None:
        if backend is None:
            cls._moe_dispatch_combine_backend = None
            return
        if precision is None:
            cls._moe_dispatch_combine_backend = {p: backend for p in PrecisionType}
        else:
            cls._moe_dispatch_combine_backend = dict(cls._moe_dispatch_combine_backend or {})
            cls._moe_dispatch_combine_backend[precision] = backend

    @classmethod
    def get_moe_dispatch_combine_backend(cls, precision: PrecisionType):
        if cls._moe_dispatch_combine_backend is not None:
            return cls._moe_dispatch_combine_backend.get(precision)
        value = os.environ.get(ENV_MOE_DISPATCH_COMBINE_BACKEND)
        if value is None or not value.strip():
            return None
        try:
            backend = BackendType[value.strip().upper()]
        except KeyError:
            return None  # a custom EP backend name: not a BackendType
        if backend == BackendType.DEEP_EP and not HAVE_DEEP_EP:
            raise AssertionError("DeepEP is required for this module (DEEP_EP selected, deep_ep not importable)")
        return backend

    # the name the latest generation's EP registry calls
    get_ep_backend = get_moe_dispatch_combine_backend

    @classmethod
    def auto_tune_enabled(cls) -> bool:
        if cls._auto_tune is not None:
            return cls._auto_tune
        return os.environ.get(ENV_AUTO_TUNE, "0") == "1"

    @classmethod
    def reset(cls) -> None:
        cls._moe_dispatch_combine_backend = None
        cls._auto_tune = None
