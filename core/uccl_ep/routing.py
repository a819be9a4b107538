"""Small routing and layout helpers shared by the reference and the executors.

These are definitions, not protocol: DeepEP's split of a rank's tokens into per-channel ranges,
the "position in a send list" index, local expert ids, and row padding. Keeping one copy makes the
executors and the reference agree on them by construction; the semantics they implement are
checked by tests against hand-computed and independent expectations.
"""

from __future__ import annotations

import torch

__all__ = ["channel_ranges", "per_channel_counts", "order_index", "local_topk", "split_dispatch_fields", "pad_rows"]


def channel_ranges(num_tokens: int, num_channels: int) -> list[tuple[int, int]]:
    """DeepEP's split of a rank's tokens into contiguous per-channel ranges."""
    per = (num_tokens + num_channels - 1) // num_channels
    return [(min(c * per, num_tokens), min((c + 1) * per, num_tokens)) for c in range(num_channels)]


def per_channel_counts(mask: torch.Tensor, num_channels: int) -> torch.Tensor:
    """Counts of True in ``mask`` [T, X] per channel range -> [X, C] int64."""
    cols = [mask[s:e].sum(0, dtype=torch.int64) for s, e in channel_ranges(mask.shape[0], num_channels)]
    return torch.stack(cols, dim=1) if cols else torch.zeros(mask.shape[1], 0, dtype=torch.int64)


def order_index(send_idx: torch.Tensor, num_tokens: int, device) -> torch.Tensor:
    """head[t] = position of token t in ``send_idx``, or -1 when t is not in it (int32 [T])."""
    head = torch.full((num_tokens,), -1, dtype=torch.int32, device=device)
    head[send_idx] = torch.arange(send_idx.numel(), dtype=torch.int32, device=device)
    return head


def local_topk(global_idx: torch.Tensor, weights: torch.Tensor, rank: int, experts_per_rank: int):
    """Global expert ids -> this rank's local ids (-1 elsewhere); weights zeroed where -1."""
    lo = rank * experts_per_rank
    local = (global_idx >= lo) & (global_idx < lo + experts_per_rank)
    return (torch.where(local, global_idx - lo, torch.full_like(global_idx, -1)),
            torch.where(local, weights, torch.zeros_like(weights)))


def split_dispatch_fields(parts: list, has_scales: bool, has_topk: bool, rank: int, experts_per_rank: int):
    """A received dispatch row's unpacked fields, in packing order (x, [scales], [global top-k ids,
    weights], then the rest): (x, scales or None, local top-k ids or None, their weights or None, the
    rest as a list)."""
    rest = list(parts)
    recv_x = rest.pop(0)
    recv_scales = rest.pop(0) if has_scales else None
    recv_topk_idx = recv_topk_weights = None
    if has_topk:
        gidx, w = rest.pop(0), rest.pop(0)
        recv_topk_idx, recv_topk_weights = local_topk(gidx, w, rank, experts_per_rank)
    return recv_x, recv_scales, recv_topk_idx, recv_topk_weights, rest


def pad_rows(t: torch.Tensor, rows: int, fill) -> torch.Tensor:
    """``t`` grown to ``rows`` rows, the new rows set to ``fill``."""
    if t.shape[0] == rows:
        return t
    out = torch.full((rows, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out
