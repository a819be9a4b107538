"""uccl_ep knobs for Megatron runs, set once per process.

The launcher fills them from the ``--uccl-*`` flags after Megatron parses its arguments; users
of Megatron-Core's Python API call `configure` themselves. Unset values (None) leave
`uccl_ep.Buffer`'s own defaults in force (its constructor defaults and env overrides, see
docs/env.md), so nothing here duplicates uccl_ep's registry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from uccl_ep.errors import InvalidArgument

__all__ = ["UcclSettings", "configure", "current", "reset", "BACKENDS"]

#: executor names `uccl_ep.Buffer(backend=...)` accepts
BACKENDS = ("auto", "reference", "host", "cuda")


@dataclass(frozen=True)
class UcclSettings:
    """What the Megatron flex dispatcher passes to `uccl_ep.Buffer` (None = uccl_ep's default)."""

    backend: Optional[str] = None
    timeout_s: Optional[float] = None
    gpu_timeout_s: Optional[float] = None
    ranks_per_node: Optional[int] = None

    def buffer_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _check(settings: UcclSettings) -> UcclSettings:
    if settings.backend is not None and settings.backend not in BACKENDS:
        raise InvalidArgument("backend", f"one of {', '.join(BACKENDS)}", repr(settings.backend))
    for name in ("timeout_s", "gpu_timeout_s"):
        value = getattr(settings, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise InvalidArgument(name, "a positive, finite number of seconds", repr(value))
    rpn = settings.ranks_per_node
    if rpn is not None and (isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 0):
        raise InvalidArgument("ranks_per_node", "an int >= 0 (0 = detect from host names)", repr(rpn))
    return settings


_current = UcclSettings()


def configure(**changes: Any) -> UcclSettings:
    """Change some settings (keyword names of `UcclSettings`); returns the new settings.

    Takes effect for buffers created afterwards; call it before the first MoE forward.
    """
    global _current
    unknown = set(changes) - {f.name for f in dataclasses.fields(UcclSettings)}
    if unknown:
        raise InvalidArgument(sorted(unknown)[0], f"one of {', '.join(f.name for f in dataclasses.fields(UcclSettings))}",
                              "an unknown setting")
    _current = _check(dataclasses.replace(_current, **changes))
    return _current


def current() -> UcclSettings:
    return _current


def reset() -> None:
    global _current
    _current = UcclSettings()
