"""Normal mode with a rank killed mid-job, and the documented recovery (docs/api.md, "Shrink and
recovery"): every survivor's next op raises PeerFailure naming the dead rank within the timeout;
destroy() releases the Buffer without the dead rank; a new Buffer on a group of the survivors
carries on with exact results; nothing leaks (threads, file descriptors, /dev/shm regions)."""

import datetime
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.errors import PeerFailure

pytestmark = pytest.mark.cpu

TIMEOUT_S = 4.0


def _resources():
    """(OS threads, open fds, uccl_ep Python threads, /dev/shm regions) of this process (uccl_ep names
    its regions uccl_ep_<job>_<pid>_...)."""
    mine = f"_{os.getpid()}_"
    shm = sorted(n for n in os.listdir("/dev/shm") if mine in n) if os.path.isdir("/dev/shm") else []
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own fd)
            pass
    return (len(os.listdir("/proc/self/task")), sorted(fds),
            sorted(t.name for t in threading.enumerate() if t.name.startswith("uccl_ep")), shm)


def _settled(before):
    """_resources() once threads and fds that are being torn down are gone (at most 10 s)."""
    deadline = time.monotonic() + 10.0
    while True:
        got = _resources()
        if (got[0] <= before[0] and len(got[1]) <= len(before[1])) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _round(buf, group, rank, seed):
    """A normal-mode dispatch + combine on `group`, checked: combine(dispatch(x)) = x * (ranks hit)."""
    world = dist.get_world_size(group)
    T, H, E, K = 12, 256, 4 * world, 2
    g = torch.Generator().manual_seed(seed * 10 + rank)
    x = torch.randn(T, H, generator=g).bfloat16()
    topk = torch.rand(T, E, generator=g).topk(K, dim=1).indices
    w = torch.rand(T, K, generator=g)
    ntpr, _, ntpe, in_rank, _ = buf.get_dispatch_layout(topk, E)
    rx, _, rw, _, handle, _ = buf.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_rank=ntpr,
                                           is_token_in_rank=in_rank, num_tokens_per_expert=ntpe)
    comb, _, _ = buf.combine(rx, handle, topk_weights=rw)
    hits = in_rank.sum(1, keepdim=True).float()
    assert torch.allclose(comb.float(), (x.float() * hits).bfloat16().float(), rtol=1e-2, atol=1e-2)
    return x, topk, w, (ntpr, ntpe, in_rank)


def _make(group, backend):
    return Buffer(group, 32 << 20, 0, backend=backend, timeout_s=TIMEOUT_S, explicitly_destroy=True)


def _recovery_worker(rank, world, backend):
    torch.set_num_threads(1)
    victim = world - 1  # not rank 0, whose process serves the job's Store
    warm = _make(dist.group.WORLD, backend)  # every lazy pool (torch, gloo) exists before counting
    _round(warm, dist.group.WORLD, rank, 0)
    warm.destroy()
    dist.barrier()
    before = _resources()
    buf = _make(dist.group.WORLD, backend)
    x, topk, w, layout = _round(buf, dist.group.WORLD, rank, 1)
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)  # the victim is gone before the survivors' next op
    t0 = time.monotonic()
    try:
        ntpr, ntpe, in_rank = layout
        buf.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_rank=ntpr, is_token_in_rank=in_rank,
                     num_tokens_per_expert=ntpe)
        raise AssertionError("dispatch with a dead peer did not raise")
    except PeerFailure as e:
        took = time.monotonic() - t0
        assert e.rank == rank and e.peer == victim, str(e)
    # recovery: destroy, a group of the survivors, a new Buffer, carry on
    buf.destroy()
    survivors = list(range(world - 1))
    # NOTES: rank 0's Store server holds one socket per connection a peer opens, so rank 0 counts its
    # descriptors only while no survivor has a connection open that it will close: after every
    # survivor's destroy, and before any sets up the new group (synchronized over the existing
    # Store connection, which opens none)
    store = dist.distributed_c10d._get_default_store()

    def survivors_at(step):
        store.set(f"recovery/{step}/{rank}", "1")
        store.wait([f"recovery/{step}/{r}" for r in survivors], datetime.timedelta(seconds=30))
    survivors_at("destroyed")
    after_destroy = _settled(before)
    survivors_at("measured")
    group = dist.new_group(survivors, use_local_synchronization=True,
                           timeout=datetime.timedelta(seconds=60))
    dist.barrier(group=group)  # the new group's own threads exist before counting
    survivors_at("grouped")
    with_group = _resources()
    survivors_at("grouped-measured")
    rebuilt = _make(group, backend)
    for seed in (2, 3):
        _round(rebuilt, group, rank, seed)
    rebuilt.destroy()
    survivors_at("rebuilt-destroyed")
    after = _settled(with_group)
    survivors_at("rebuilt-measured")
    dist.destroy_process_group(group)
    return took, before, after_destroy, with_group, after


@pytest.mark.parametrize("backend", ["host", "reference"])
def test_normal_mode_peer_failure_and_recovery(backend):
    results = run_ranks(_recovery_worker, 3, backend, timeout_s=240, may_die=(2,))
    for rank, (took, before, after_destroy, with_group, after) in enumerate(results[:2]):
        print(f"{backend}: rank {rank} PeerFailure after {took:.2f}s (timeout {TIMEOUT_S}s); threads before "
              f"{before[0]}, after destroy {after_destroy[0]}; with the new group {with_group[0]}, after the "
              f"rebuilt Buffer {after[0]}")
        assert took < TIMEOUT_S, (rank, took)
        for label, before, got in (("destroy with a dead peer", before, after_destroy),
                                   ("the rebuilt Buffer", with_group, after)):
            assert got[0] <= before[0], f"rank {rank}: threads leaked by {label}: {before[0]} -> {got[0]}"
            extra = list(got[1])
            for f in before[1]:
                if f in extra:
                    extra.remove(f)
            assert not extra, f"rank {rank}: fds leaked by {label}: {extra}"
            assert not got[2], f"rank {rank}: uccl_ep threads left after {label}: {got[2]}"
            assert set(got[3]) <= set(before[3]), f"rank {rank}: /dev/shm regions left by {label}: " \
                                                  f"{sorted(set(got[3]) - set(before[3]))}"
