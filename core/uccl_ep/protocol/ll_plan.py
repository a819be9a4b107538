"""What a low-latency dispatch fixed for its combine, the same for every executor (the handle's plan)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LowLatencyPlan"]


@dataclass
class LowLatencyPlan:
    num_tokens: int              # tokens this rank dispatched (T <= num_max)
    num_max: int
    hidden: int
    num_experts: int
    recv_count: torch.Tensor     # [E_loc] int32 (on CPU)
    masked_at_dispatch: tuple[int, ...]
