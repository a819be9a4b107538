"""A Buffer nobody destroys is still released: when it is garbage-collected (the host executor's
proxy stops) and, when something keeps it alive to the end, at interpreter exit (the proxy says
goodbye, so a peer waiting on this rank fails at once with PeerFailure naming the cause instead of
waiting for its timeout). Host executor through the proxy, 2 gloo ranks; the cuda executor's exit
release by itself."""

import gc
import threading
import time

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.errors import PeerFailure

pytestmark = pytest.mark.cpu

T, H, E = 8, 128, 4
_KEEP = []  # what rank 0 leaves behind at exit (the Buffer in a daemon thread's frame)


def _ll_buffer(world, **kw):
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    return Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world, backend="host",
                  **kw)


def _gc_worker(rank, world):
    buf = _ll_buffer(world, timeout_s=30.0)
    session = buf._executor.session
    assert session is not None and not session.closed
    del buf
    gc.collect()
    closed = session.closed
    dist.barrier()
    return closed


def test_garbage_collected_buffer_stops_its_proxy():
    assert run_ranks(_gc_worker, 2, timeout_s=120, env={"UCCL_EP_FORCE_PROXY": "1"}) == [True, True]


def _exit_worker(rank, world):
    buf = _ll_buffer(world, timeout_s=60.0)
    if rank == 0:
        # kept alive past the interpreter's teardown: a daemon thread's frame is never collected
        hold = threading.Event()
        t = threading.Thread(target=lambda b=buf: hold.wait(), daemon=True)
        t.start()
        _KEEP.append((buf, t))
        return "left"
    x = torch.randn(T, H).bfloat16()
    topk = torch.stack([torch.randperm(E)[:2] for _ in range(T)])
    t0 = time.monotonic()
    try:
        buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    except PeerFailure as e:
        return time.monotonic() - t0, str(e)
    return time.monotonic() - t0, "no error"


def test_buffer_alive_at_exit_says_goodbye():
    left, (took, msg) = run_ranks(_exit_worker, 2, timeout_s=120, env={"UCCL_EP_FORCE_PROXY": "1"})
    assert left == "left"
    assert "closed its endpoint" in msg, msg
    assert took < 30.0, (took, msg)  # the goodbye, not the 60 s timeout


def test_cuda_executor_at_exit_stops_threads_without_waiting_for_the_device(monkeypatch):
    from types import SimpleNamespace

    from uccl_ep.cuda.executor import CudaExecutor
    closed = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: closed.append("device wait"))
    fake = SimpleNamespace(_watch=SimpleNamespace(close=lambda: closed.append("watch")),
                           session=SimpleNamespace(close=lambda: closed.append("session")))
    CudaExecutor.release_at_exit(fake)
    assert closed == ["watch", "session"]  # a kernel stuck on a gone peer cannot hold the exit up
    CudaExecutor.release_at_exit(SimpleNamespace(_watch=None, session=None))  # nothing opened: nothing to do
