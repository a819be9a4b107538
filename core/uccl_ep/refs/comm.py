"""Variable-size exchanges between the ranks of a group, for the reference backend.

Every exchange is point to point over the group's Store (`uccl_ep.group_store`): each wait is
bounded by the Buffer's ``timeout_s`` and ends in `Timeout` / `PeerFailure` naming this rank, the
peer and the phase, and a masked peer (shrink mode) is simply not sent to nor waited for. Any
torch.distributed group works (gloo; NCCL with CUDA tensors, staged through the host, as vLLM
passes CUDA data with a gloo ``cpu_group``). Payloads travel as bytes, so any dtype (bf16, e4m3,
int64, bool) crosses.

NOTES: the reference used gloo/NCCL collectives before; a collective cannot leave a peer out
(shrink) nor say which peer it waits for, and it waits for the process group's timeout.
"""

from __future__ import annotations

import pickle
from typing import Callable, Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from ..group_store import GroupStore

__all__ = ["GroupComm"]


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).to("cpu").contiguous().view(torch.uint8).numpy().tobytes()


class GroupComm:
    """Exchanges bound to one process group, each bounded by ``timeout_s``."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        self.has_nccl = "nccl" in backend
        self.channel = GroupStore(group, timeout_s, "ref")

    def close(self) -> None:
        self.channel.close()

    def all_gather_object(self, obj: object, phase: str = "all_gather") -> list:
        return [pickle.loads(b) for b in self.channel.all_gather(pickle.dumps(obj), phase)]

    def all_gather_int64(self, values: torch.Tensor, device: torch.device, phase: str = "all_gather") -> torch.Tensor:
        """Gather a 1-D int64 tensor (same length on every rank) into [size, n]."""
        got = self.channel.all_gather(_to_bytes(values.to(torch.int64)), phase)
        return torch.stack([torch.frombuffer(bytearray(b), dtype=torch.int64) for b in got]).to(device)

    def exchange_bytes(self, per_dest: Sequence[Optional[torch.Tensor]], device: torch.device, phase: str,
                       skip: Iterable[int] = (), on_missing: Optional[Callable[[int, BaseException], bool]] = None,
                       learn_skips: bool = False) -> list[torch.Tensor]:
        """Send ``per_dest[r]`` (1-D uint8) to rank r; return the 1-D uint8 tensors received, by
        source (empty for skipped sources). See `GroupStore.exchange` for skip / on_missing."""
        assert len(per_dest) == self.size
        payloads = [None if t is None else _to_bytes(t) for t in per_dest]
        got = self.channel.exchange(payloads, phase, skip=skip, on_missing=on_missing, learn_skips=learn_skips)
        return [torch.frombuffer(bytearray(b), dtype=torch.uint8).to(device) if b else
                torch.empty(0, dtype=torch.uint8, device=device) for b in got]

    def exchange_rows(self, per_dest: Sequence[torch.Tensor], device: torch.device, phase: str = "exchange",
                      skip: Iterable[int] = (), on_missing: Optional[Callable[[int, BaseException], bool]] = None,
                      learn_skips: bool = False) -> list[torch.Tensor]:
        """Send rows ``per_dest[r]`` [n_r, *shape] to rank r; return received rows by source (none
        from skipped sources). Every tensor must share dtype and trailing shape (on every rank)."""
        ref = per_dest[0]
        tail = tuple(ref.shape[1:])
        as_bytes = [t.contiguous().view(torch.uint8).reshape(-1) for t in per_dest]
        received = self.exchange_bytes(as_bytes, device, phase, skip, on_missing, learn_skips)
        row_elems = 1
        for s in tail:
            row_elems *= s
        return [r.view(ref.dtype).view(-1, *tail) if row_elems and r.numel() else
                torch.empty((0, *tail), dtype=ref.dtype, device=device) for r in received]

    def skipped_by(self) -> set[int]:
        return self.channel.skipped_by()

    def publish_skips(self, skip: Iterable[int]) -> None:
        self.channel.publish_skips(skip)

    def barrier(self, phase: str = "barrier", skip: Iterable[int] = (),
                on_missing: Optional[Callable[[int, BaseException], bool]] = None, learn_skips: bool = False) -> None:
        self.channel.barrier(phase, skip=skip, on_missing=on_missing, learn_skips=learn_skips)
