"""Pack several per-row tensors into one byte row, so one exchange moves a token's data,
scales, top-k ids, weights and metadata together."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["pack_rows", "unpack_rows", "row_bytes"]


def _as_byte_rows(t: torch.Tensor) -> torch.Tensor:
    width = row_bytes(t.dtype, tuple(t.shape[1:]))
    if t.dim() == 1:
        t = t.view(-1, 1)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], width)


def pack_rows(cols: Sequence[torch.Tensor]) -> torch.Tensor:
    """[n, ...] tensors (same n, same device) -> uint8 [n, total row bytes]."""
    return torch.cat([_as_byte_rows(c) for c in cols], dim=1)


def row_bytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for s in shape:
        n *= s
    return n


def unpack_rows(blob: torch.Tensor, specs: Sequence[tuple[torch.dtype, tuple[int, ...]]], n: int) -> list[torch.Tensor]:
    """Inverse of :func:`pack_rows` given each column's (dtype, trailing shape)."""
    widths = [row_bytes(d, s) for d, s in specs]
    blob = blob.reshape(n, sum(widths)) if n else blob.new_empty((0, sum(widths)))
    out = []
    start = 0
    for (dtype, shape), w in zip(specs, widths):
        # NOTES: clone, not contiguous(): a one-row slice is already "contiguous" but may start at
        # a byte offset the wider dtype cannot view.
        part = blob[:, start:start + w].clone(memory_format=torch.contiguous_format)
        out.append(part.view(dtype).reshape(n, *shape))
        start += w
    return out
