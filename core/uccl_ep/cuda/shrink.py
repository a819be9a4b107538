"""Shrink mode of the `cuda` executor (DeepEP's ``enable_shrink``): the rank mask in device memory
and the host-side waits that honour it.

The mask is int32 [R] in device memory (nonzero = masked), passed by address to every low-latency
kernel (``mask`` in kernel_abi.h), which reads it when it runs: a CUDA graph replays with the mask
of the moment. A receive kernel whose bounded wait on a peer expires masks that peer (shrink mode;
device/shrink.cuh). The Buffer's mask calls act on it in stream order, like DeepEP's small kernels:
``update`` / ``clean`` are device fills on the current stream, ``query`` a stream-ordered copy.

Host barriers (layout changes, clean_low_latency_buffer, destroy) go over the group's Store with a
bound (`uccl_ep.group_store`); in shrink mode they leave masked ranks out and mask a rank that misses
them, which is how a rank that stopped calling before its first low-latency op gets masked.
"""

from __future__ import annotations

import torch

from ..group_store import GroupStore
from .runtime import DeviceMemory, driver, raw_tensor

__all__ = ["DeviceMask", "masked_barrier"]


class DeviceMask:
    """int32 [R] mask words in device memory, and their torch view."""

    def __init__(self, device: int, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self.mem = DeviceMemory(device, 4 * num_ranks)
        driver().memset_d8(device, self.mem.ptr, 0, 4 * num_ranks, 0)
        driver().synchronize(device)
        self.words = raw_tensor(self.mem.ptr, 4 * num_ranks, device, self.mem).view(torch.int32)

    @property
    def ptr(self) -> int:
        return self.mem.ptr

    def update(self, rank: int, mask: bool) -> None:
        self.words[rank].fill_(1 if mask else 0)

    def query(self, out: torch.Tensor) -> None:
        out.copy_(self.words.ne(0).to(torch.int32))

    def clean(self) -> None:
        self.words.zero_()

    def ranks(self) -> set[int]:
        """The masked ranks now (synchronizes with the current stream)."""
        return {r for r, v in enumerate(self.words.tolist()) if v}

    def add(self, ranks) -> None:
        for r in ranks:
            self.update(int(r), True)

    def free(self) -> None:
        self.mem.free()


def masked_barrier(channel: GroupStore, mask: DeviceMask | None, phase: str) -> None:
    """A barrier over the group's Store, bounded by the channel's timeout. With a mask (shrink mode)
    masked ranks are left out, and a rank that misses the barrier -- or that left this rank out --
    is masked; without, a missing rank raises Timeout / PeerFailure naming it."""
    if mask is None:
        channel.barrier(phase)
        return
    masked = mask.ranks()
    channel.publish_skips(masked)

    def lost(peer: int, error: BaseException) -> bool:
        mask.update(peer, True)
        masked.add(peer)
        channel.publish_skips(masked)
        return True

    channel.barrier(phase, skip=masked, on_missing=lost, learn_skips=True)
    mask.add(channel.skipped_by())
