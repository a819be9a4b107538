"""Bounded waits with typed errors where a peer misbehaves, and inputs refused before anything is
sent: the reference backend honours the Buffer's timeout (a stalled peer -> Timeout naming rank,
peer and phase; a dead one -> PeerFailure), Buffer() bounds its host-name exchange, non-finite
timeouts are refused, and a low-latency top-k row that repeats an expert is refused on the sender
(reference and host) so no write lands past a slab and the ranks stay in step."""

import datetime
import math
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.bench.expect import check_ll_dispatch
from uccl_ep.errors import InvalidArgument, PeerFailure, Timeout
from uccl_ep.utils import calc_diff

pytestmark = pytest.mark.cpu

TIMEOUT_S = 2.0


def _ll_buffer(world, T, H, E, backend, **kw):
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    return Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world, backend=backend,
                  explicitly_destroy=True, **kw)


def _expect(exc_type, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        return e
    raise AssertionError(f"{fn.__name__} did not raise {exc_type.__name__}")


# --------------------------------------------------------------------------------------------------
# duplicates in a low-latency top-k row
# --------------------------------------------------------------------------------------------------
def _duplicates_worker(rank, world, backend):
    T, H, E = 16, 128, 2 * world
    buf = _ll_buffer(world, T, H, E, backend, timeout_s=30.0)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(rank)).bfloat16()
    dup = torch.zeros(T, 2, dtype=torch.int64)  # every token selects expert 0 twice: 32 messages, 16 slots
    e = _expect(InvalidArgument, buf.low_latency_dispatch, x, dup, T, E, use_fp8=False)
    assert e.argument == "topk_idx" and "expert 0 more than once in row 0" in str(e), str(e)
    one_dup = torch.tensor([[1, -1, 1]] + [[0, 1, -1]] * (T - 1), dtype=torch.int64)
    _expect(InvalidArgument, buf.low_latency_dispatch, x, one_dup, T, E, use_fp8=False)
    # nothing was sent: the next valid op pairs up correctly and lands every row in its slab
    topk = torch.tensor([[0, -1], [1, 0]] * (T // 2), dtype=torch.int64)
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    all_x, all_topk = [None] * world, [None] * world
    dist.all_gather_object(all_x, x)
    dist.all_gather_object(all_topk, topk)
    check_ll_dispatch(lambda e_, b, n: recv[e_, b:b + n], count, handle, all_x, all_topk, rank, E, world)
    w = torch.rand(T, 2, generator=torch.Generator().manual_seed(7 + rank))
    _expect(InvalidArgument, buf.low_latency_combine, recv.clone(), torch.zeros(T, 2, dtype=torch.int64), w, handle)
    comb, _, _ = buf.low_latency_combine(recv.clone(), topk, w, handle)
    expect = x.float() * torch.where(topk >= 0, w, torch.zeros_like(w)).sum(1, keepdim=True)
    assert calc_diff(comb.float(), expect) < 1e-5
    buf.destroy()
    return True


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_ll_duplicate_experts_refused_before_sending(backend):
    run_ranks(_duplicates_worker, 2, backend, timeout_s=180)


# --------------------------------------------------------------------------------------------------
# the reference backend's bounded waits; timeouts refused
# --------------------------------------------------------------------------------------------------
def _reference_worker(rank, world):
    store = dist.distributed_c10d._get_default_store()
    for bad in (float("nan"), float("inf"), -1.0, 0, True, "5"):
        for arg in ("timeout_s", "gpu_timeout_s"):
            e = _expect(InvalidArgument, Buffer, dist.group.WORLD, 0, 1 << 20, low_latency_mode=True,
                        backend="reference", **{arg: bad})
            assert e.argument == arg, str(e)
    T, H, E = 8, 128, 4
    x = torch.randn(T, H).bfloat16()
    topk = torch.tensor([[0, 3]] * T, dtype=torch.int64)
    timings = {}
    # 1. low-latency dispatch with a stalled peer: rank 1 builds its Buffer, then stops calling
    buf = _ll_buffer(world, T, H, E, "reference", timeout_s=TIMEOUT_S)
    if rank == 0:
        t0 = time.monotonic()
        e = _expect(Timeout, buf.low_latency_dispatch, x, topk, T, E, use_fp8=False)
        timings["ll_stalled"] = time.monotonic() - t0
        assert (e.rank, e.peer) == (0, 1) and "low_latency_dispatch" in e.phase, str(e)
        store.set("peer_timeouts/ll", "1")
    else:
        store.wait(["peer_timeouts/ll"], datetime.timedelta(seconds=60))
    # 2. normal dispatch with a stalled peer
    nbuf = Buffer(dist.group.WORLD, 16 << 20, 0, backend="reference", timeout_s=TIMEOUT_S, explicitly_destroy=True)
    if rank == 0:
        ntpr, _, ntpe, in_rank, _ = nbuf.get_dispatch_layout(topk, E)
        t0 = time.monotonic()
        e = _expect(Timeout, nbuf.dispatch, x, num_tokens_per_rank=ntpr, is_token_in_rank=in_rank,
                    num_tokens_per_expert=ntpe, topk_idx=topk, topk_weights=torch.ones(T, 2))
        timings["normal_stalled"] = time.monotonic() - t0
        assert (e.rank, e.peer) == (0, 1) and e.phase.startswith("dispatch"), str(e)
        store.set("peer_timeouts/normal", "1")
    else:
        store.wait(["peer_timeouts/normal"], datetime.timedelta(seconds=60))
    # 3. a dead peer: PeerFailure naming it, within the timeout
    buf2 = _ll_buffer(world, T, H, E, "reference", timeout_s=TIMEOUT_S)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    e = _expect(PeerFailure, buf2.low_latency_dispatch, x, topk, T, E, use_fp8=False)
    timings["ll_dead"] = time.monotonic() - t0
    assert (e.rank, e.peer) == (0, 1) and "low_latency_dispatch" in e.phase, str(e)
    for b in (buf, nbuf, buf2):
        b.destroy()  # the peer is gone: local resources are released all the same
    return timings


def test_reference_backend_honours_the_timeout():
    timings = run_ranks(_reference_worker, 2, timeout_s=180, may_die=(1,))[0]
    print(timings)
    for what, took in timings.items():
        assert took < TIMEOUT_S + 1.5, (what, took)
    assert timings["ll_stalled"] >= TIMEOUT_S * 0.9 and timings["normal_stalled"] >= TIMEOUT_S * 0.9


def _construction_worker(rank, world):
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # never builds its Buffer
        store.wait(["peer_timeouts/constructed"], datetime.timedelta(seconds=60))
        return None
    t0 = time.monotonic()
    e = _expect(Timeout, Buffer, dist.group.WORLD, 1 << 20, 0, backend="reference", timeout_s=TIMEOUT_S)
    took = time.monotonic() - t0
    store.set("peer_timeouts/constructed", "1")
    assert (e.rank, e.peer) == (0, 1) and "host names" in e.phase, str(e)
    return took


def test_buffer_construction_is_bounded():
    took = run_ranks(_construction_worker, 2, timeout_s=120, pg_timeout_s=600)[0]
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 1.5, took
    assert not math.isnan(took)
