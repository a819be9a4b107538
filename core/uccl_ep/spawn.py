"""Run a function on N local ranks (processes) with torch.distributed, bounded in time.

Used by `uccl-ep bench` and by the multi-rank tests:

    results = run_ranks(worker, 2, arg1, arg2)      # worker(rank, world, arg1, arg2) -> picklable

Each rank initializes a process group (gloo by default; nccl when ``backend="nccl"``), calls the
worker, and sends back its return value or its traceback. A rank that fails, hangs past
``timeout_s`` or dies makes the whole call raise with every rank's story; nothing is left running.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

__all__ = ["run_ranks", "free_port", "RankFailure"]


class RankFailure(AssertionError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, backend: str, env: dict, pg_timeout_s: float,
           fn: Callable, args: tuple, results: Any) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch.distributed as dist
    try:
        if backend == "nccl":
            import torch
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        out = fn(rank, world, *args)
        results.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_ranks(fn: Callable, world: int, *args: Any, timeout_s: float = 180.0, backend: str = "gloo",
              env: dict | None = None, pg_timeout_s: float = 60.0, on_idle: Callable[[], None] | None = None,
              may_die: tuple = ()) -> list:
    """Run ``fn(rank, world, *args)`` on ``world`` processes; return the per-rank results.

    ``on_idle`` is called about once a second while waiting (e.g. to drain a progress queue).
    Ranks in ``may_die`` may end without reporting (a test that kills them): their result is None.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, backend, dict(env or {}), pg_timeout_s, fn, args,
                                              results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, tuple[str, Any]] = {}
    import time
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, status, value = results.get(timeout=min(remaining, 0.2))
                got[rank] = (status, value)
                if status == "error":
                    # One failure usually strands the others in a collective: give them a moment to
                    # report, then stop waiting.
                    deadline = min(deadline, time.monotonic() + 10.0)
            except queue.Empty:
                if on_idle is not None:
                    on_idle()
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
                if all(r in got or (r in may_die and not procs[r].is_alive()) for r in range(world)):
                    break
    finally:
        for p in procs:
            p.join(timeout=0.5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    missing = [r for r in range(world) if r not in got and r not in may_die]
    if errors or missing:
        story = []
        for r, tb in sorted(errors.items()):
            story.append(f"--- rank {r} failed:\n{tb}")
        for r in missing:
            code = procs[r].exitcode
            story.append(f"--- rank {r} did not report (exit code {code}; timeout {timeout_s}s or crash)")
        raise RankFailure("\n".join(story))
    return [got[r][1] if r in got else None for r in range(world)]
