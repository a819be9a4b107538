"""Timing helpers: CUDA events on GPU, a monotonic clock on CPU; ranks aligned by a barrier."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["time_op", "rank_context"]


def _stats(samples: list[float], prefix: str = "") -> dict[str, float]:
    return {prefix + "mean": statistics.fmean(samples), prefix + "median": statistics.median(samples),
            prefix + "min": min(samples), prefix + "max": max(samples)}


def time_op(fn: Callable[[], object], iters: int, warmup: int, device: torch.device,
            group: dist.ProcessGroup | None = None, synced_iters: int = 0,
            on_timed: Callable[[str], None] | None = None) -> dict[str, float]:
    """Run ``fn`` ``warmup`` times, then time ``iters`` calls; seconds per call.

    GPU, ``mean``/``median``/``min``/``max``: DeepEP's ``bench`` convention, so rows compare with
    its published figures: the calls run back to back, each bracketed by CUDA events on the current
    stream, with one synchronize at the end, and the first sample is dropped. A sample is the
    call's device time; where the host cannot stay ahead of the device (a call whose host path is
    longer than its kernels, or one that waits for the device itself, such as a non-cached
    dispatch reading counts), the host's time shows in it too.

    ``synced_*`` (when ``synced_iters`` > 0): that many more calls, each synchronized before the
    next starts, so each sample is the whole call as one caller sees it, host path included.

    CPU: every call is timed with a monotonic clock (calls are synchronous there); ``synced_*``
    repeats those figures. ``calls`` counts every call made, warm-up included; ``timed_calls`` the
    back-to-back ones, which ``on_timed("start")`` and ``on_timed("end")`` bracket (the device
    idle on both sides), e.g. for counters that describe back-to-back operation only.

    NOTES: Python's garbage collector is off while the calls are timed (after one collection), as
    `timeit` does: a full collection stops the host for milliseconds, and where the host is only a
    few calls ahead of the device that pause lands in one sample as device idle time.
    """
    mark = on_timed or (lambda _: None)
    for _ in range(warmup):
        fn()
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return _timed(fn, iters, warmup, device, group, synced_iters, mark)
    finally:
        if was_enabled:
            gc.enable()


def _timed(fn: Callable[[], object], iters: int, warmup: int, device: torch.device, group: dist.ProcessGroup | None,
           synced_iters: int, mark: Callable[[str], None]) -> dict[str, float]:
    """time_op after its warm-up."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    if group is not None:
        dist.barrier(group=group)
    if device.type != "cuda":
        samples = []
        mark("start")
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        mark("end")
        out = _stats(samples)
        if synced_iters > 0:
            out.update(_stats(samples, "synced_"))
        out["calls"] = warmup + iters
        out["timed_calls"] = iters
        return out
    n = max(iters, 2)  # the first sample is dropped
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    mark("start")
    for i in range(n):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    mark("end")
    out = _stats([s.elapsed_time(e) / 1e3 for s, e in zip(starts[1:], ends[1:])])
    if synced_iters > 0:
        if group is not None:
            dist.barrier(group=group)
        synced = []
        for _ in range(synced_iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            synced.append(start.elapsed_time(end) / 1e3)
        out.update(_stats(synced, "synced_"))
    out["calls"] = warmup + n + synced_iters
    out["timed_calls"] = n
    return out


def rank_context(rank: int, progress_queue: Any = None) -> tuple[Any, torch.device, Callable[[str], None]]:
    """(group, device, progress) of a bench rank whose process group is initialized: the CUDA device
    under NCCL, else the CPU; progress messages go to the parent (rank 0's only)."""
    group = dist.group.WORLD
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(dist.get_backend()).lower() \
        else torch.device("cpu")

    def progress(msg: str) -> None:
        if progress_queue is not None and rank == 0:
            progress_queue.put(msg)

    return group, device, progress
