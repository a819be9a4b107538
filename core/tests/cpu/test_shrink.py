"""Shrink mode (DeepEP's enable_shrink) with a rank that fails for real: it stops calling (silent)
or its process is killed at its second low-latency dispatch. The survivors' waits on it end within
the timeout, it is masked (low_latency_query_mask_buffer reports it), dispatch and combine
complete without it (its experts' tokens dropped, the rest exact), later calls skip it at once,
and clean_mask unmasks it. Reference and host backends, 2 and 3 ranks."""

import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.bench.expect import check_ll_dispatch
from uccl_ep.utils import calc_diff

pytestmark = pytest.mark.cpu

TIMEOUT_S = 4.0


def _gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _round(buf, x, topk, w, all_x, all_topk, rank, world, E, masked):
    """One LL dispatch + combine, checked against independent expectations with `masked` out."""
    T = x.shape[0]
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    status = torch.full((world,), -1, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [int(r in masked) for r in range(world)], (rank, status.tolist(), masked)
    check_ll_dispatch(lambda e, b, n: recv[e, b:b + n], count, handle, all_x, all_topk, rank, E, world, masked=masked)
    comb, _, _ = buf.low_latency_combine(recv.clone(), topk, w, handle)
    E_loc = E // world
    owner = torch.where(topk >= 0, topk // E_loc, torch.full_like(topk, -1))
    keep = (topk >= 0) & ~torch.isin(owner, torch.tensor(sorted(masked), dtype=torch.int64))
    expect = x.float() * torch.where(keep, w, torch.zeros_like(w)).sum(1, keepdim=True)
    assert calc_diff(comb.float(), expect) < 1e-5
    assert not torch.isnan(comb).any()


def _shrink_worker(rank, world, backend, mode):
    victim = world - 1  # never rank 0: its process serves the job's Store
    T, H, E, K = 8, 256, 2 * world, 2
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(T, H, generator=g).bfloat16()
    topk = torch.rand(T, E, generator=g).topk(K, dim=1).indices
    w = torch.rand(T, K, generator=g)
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    buf = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world,
                 enable_shrink=True, explicitly_destroy=True, backend=backend, timeout_s=TIMEOUT_S)
    all_x, all_topk = _gather(x), _gather(topk)
    store = dist.distributed_c10d._get_default_store()
    survivors = [r for r in range(world) if r != victim]
    _round(buf, x, topk, w, all_x, all_topk, rank, world, E, set())  # everyone in
    if rank == victim:
        if mode == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        # silent: stops calling, alive, until the survivors are done
        store.wait([f"shrink_test/done/{r}" for r in survivors], datetime.timedelta(seconds=120))
        return None
    t0 = time.monotonic()
    _round(buf, x, topk, w, all_x, all_topk, rank, world, E, {victim})  # the victim gets masked on the way
    first = time.monotonic() - t0
    t0 = time.monotonic()
    _round(buf, x, topk, w, all_x, all_topk, rank, world, E, {victim})  # and is skipped from then on
    later = time.monotonic() - t0
    buf.low_latency_clean_mask_buffer()
    status = torch.full((world,), -1, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    buf.low_latency_update_mask_buffer(victim, mask=True)
    t0 = time.monotonic()
    buf.destroy()  # the shrink barrier leaves the masked victim out
    destroy_s = time.monotonic() - t0
    store.set(f"shrink_test/done/{rank}", "1")
    return first, later, destroy_s


# each backend: both failure modes, 2 and 3 ranks (a pair of cases each, to keep CI time down)
@pytest.mark.parametrize("backend,world,mode", [
    ("host", 2, "silent"), ("host", 3, "killed"), ("reference", 2, "killed"), ("reference", 3, "silent"),
])
def test_failed_rank_is_masked(backend, world, mode):
    results = run_ranks(_shrink_worker, world, backend, mode, timeout_s=240, may_die=(world - 1,),
                        env=dict(UCCL_EP_TIMEOUT_S=str(TIMEOUT_S)))
    for rank, res in enumerate(results[:-1]):
        first, later, destroy_s = res
        print(f"{backend} {world} ranks, {mode} rank: rank {rank} first op {first:.2f}s, later {later:.3f}s, "
              f"destroy {destroy_s:.3f}s (timeout {TIMEOUT_S}s)")
        # DeepEP's bound: the survivor completes within 3 x the timeout; later calls do not wait
        assert first < 3 * TIMEOUT_S, (rank, first)
        assert later < TIMEOUT_S / 2, (rank, later)
        assert destroy_s < TIMEOUT_S, (rank, destroy_s)


# --------------------------------------------------------------------------------------------------
# the cuda executor's host barrier (uccl_ep.cuda.shrink.masked_barrier), with a host stand-in for
# the device mask: the path that masks a rank that stops before its first low-latency op
# --------------------------------------------------------------------------------------------------
class _HostMask:
    """DeviceMask's interface over a set (the real one is int32 words in device memory)."""

    def __init__(self):
        self.masked = set()

    def ranks(self):
        return set(self.masked)

    def update(self, rank, mask):
        (self.masked.add if mask else self.masked.discard)(rank)

    def add(self, ranks):
        self.masked.update(ranks)


def _barrier_worker(rank, world):
    from uccl_ep.cuda.shrink import masked_barrier
    from uccl_ep.errors import Timeout
    from uccl_ep.group_store import GroupStore
    victim = world - 1
    shrink_ch, plain_ch = GroupStore(dist.group.WORLD, TIMEOUT_S / 2, "t1"), GroupStore(dist.group.WORLD, TIMEOUT_S / 2, "t2")
    mask = _HostMask()
    masked_barrier(shrink_ch, mask, "everyone")
    store = dist.distributed_c10d._get_default_store()
    if rank == victim:  # stops calling
        store.wait([f"barrier_test/done/{r}" for r in range(victim)], datetime.timedelta(seconds=60))
        return None
    t0 = time.monotonic()
    masked_barrier(shrink_ch, mask, "victim silent")
    took = time.monotonic() - t0
    assert mask.ranks() == {victim}, mask.ranks()
    t1 = time.monotonic()
    masked_barrier(shrink_ch, mask, "victim masked")  # left out: no wait
    again = time.monotonic() - t1
    try:
        masked_barrier(plain_ch, None, "no shrink")
        raise AssertionError("a barrier without shrink mode did not raise")
    except Timeout as e:
        assert e.peer == victim and e.phase == "no shrink", str(e)
    for ch in (shrink_ch, plain_ch):
        ch.close()
    store.set(f"barrier_test/done/{rank}", "1")
    return took, again


def test_cuda_host_barrier_masks_a_silent_rank():
    for took, again in run_ranks(_barrier_worker, 3, timeout_s=120)[:-1]:
        assert TIMEOUT_S / 2 * 0.9 < took < 3 * TIMEOUT_S / 2 and again < 0.5, (took, again)
