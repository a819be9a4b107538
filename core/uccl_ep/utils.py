"""`uccl_ep.utils`: DeepEP's `deep_ep.utils` names plus the helpers its tests use.

Megatron-Core imports ``from deep_ep.utils import EventHandle, EventOverlap``; the same names
are here. ``calc_diff`` and the FP8 helpers follow DeepEP's test utilities so results are
checked the way DeepEP checks them.
"""

from __future__ import annotations

import torch

from .events import EventHandle, EventOverlap
from .refs.fp8 import per_token_cast_back, per_token_cast_to_fp8

__all__ = ["EventHandle", "EventOverlap", "calc_diff", "per_token_cast_to_fp8", "per_token_cast_back"]


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepEP's similarity error: 1 - 2*sum(x*y) / sum(x*x + y*y), after +1 on both (0 = equal)."""
    x, y = x.double() + 1, y.double() + 1
    denominator = (x * x + y * y).sum()
    sim = 2 * (x * y).sum() / denominator
    return float((1 - sim).item())
