"""Timing helpers: CUDA events on GPU, a monotonic clock on CPU; ranks aligned by a barrier."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

__all__ = ["time_op"]


def time_op(fn: Callable[[], object], iters: int, warmup: int, device: torch.device,
            group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Run ``fn`` ``warmup`` times, then time ``iters`` calls one by one.

    Returns seconds per call: mean, median, min, max. Each call is synchronized before its clock
    stops, so the time includes launch and every notify step (DeepEP's `bench` convention).
    """
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if group is not None:
        dist.barrier(group=group)
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return {"mean": statistics.fmean(samples), "median": statistics.median(samples),
            "min": min(samples), "max": max(samples)}
