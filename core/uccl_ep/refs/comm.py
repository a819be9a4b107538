"""Variable-size exchanges over a torch.distributed group, for the reference backend.

Works with gloo groups (CPU, and CUDA tensors staged through the host, as vLLM passes its gloo
``cpu_group`` with CUDA data) and NCCL groups (CUDA tensors). Payloads travel as bytes, so any
dtype (bf16, e4m3, int64, bool) crosses every backend.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

__all__ = ["GroupComm"]


class GroupComm:
    """Collective helpers bound to one process group."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        self.has_nccl = "nccl" in backend
        self.has_gloo = "gloo" in backend or not self.has_nccl

    def _comm_device(self, data_device: torch.device) -> torch.device:
        if data_device.type == "cuda" and self.has_nccl:
            return data_device
        if self.has_gloo:
            return torch.device("cpu")
        # An NCCL-only group with CPU data: NCCL needs device buffers.
        return torch.device("cuda", torch.cuda.current_device())

    def all_gather_object(self, obj: object) -> list:
        out: list = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def all_gather_int64(self, values: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Gather a 1-D int64 tensor (same length on every rank) into [size, n]."""
        dev = self._comm_device(device)
        local = values.to(device=dev, dtype=torch.int64).contiguous()
        out = torch.empty(self.size, local.numel(), dtype=torch.int64, device=dev)
        dist.all_gather(list(out.unbind(0)), local, group=self.group)
        return out.to(device)

    def exchange_bytes(self, per_dest: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Send ``per_dest[r]`` (1-D uint8) to rank r; return the 1-D uint8 tensors received, by source."""
        assert len(per_dest) == self.size
        dev = self._comm_device(device)
        send_sizes = [int(t.numel()) for t in per_dest]
        sizes = torch.tensor(send_sizes, dtype=torch.int64, device=dev)
        recv_sizes_t = torch.empty_like(sizes)
        dist.all_to_all_single(recv_sizes_t, sizes, group=self.group)
        recv_sizes = [int(v) for v in recv_sizes_t.tolist()]
        send = torch.cat([t.reshape(-1).to(dev) for t in per_dest]) if per_dest else torch.empty(0, dtype=torch.uint8, device=dev)
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
        # NOTES: every rank enters the collective even when it moves nothing, so ranks stay in
        # lock-step and an empty rank cannot desynchronise the group.
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.group)
        return [c.to(device) for c in torch.split(recv, recv_sizes)]

    def exchange_rows(self, per_dest: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Send rows ``per_dest[r]`` [n_r, *shape] to rank r; return received rows by source.

        Every tensor must share dtype and trailing shape (on every rank).
        """
        ref = per_dest[0]
        tail = tuple(ref.shape[1:])
        as_bytes = [t.contiguous().view(torch.uint8).reshape(-1) for t in per_dest]
        received = self.exchange_bytes(as_bytes, device)
        row_elems = 1
        for s in tail:
            row_elems *= s
        return [r.view(ref.dtype).view(-1, *tail) if row_elems else r.new_empty((0, *tail), dtype=ref.dtype)
                for r in received]

    def barrier(self) -> None:
        dist.barrier(group=self.group)
