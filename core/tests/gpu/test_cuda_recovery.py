"""Normal mode of the cuda backend with a rank killed mid-op, and the documented recovery (docs/api.md,
"Shrink and recovery"), on 2+ GPUs of one host: over NVLink (the intranode kernels) and through the
proxy (ranks_per_node=1: GPUs as nodes, ipc transport, the kernels' copy role).

- The survivors are inside a dispatch when the last rank's process is killed (it never joins that
  op): each raises PeerFailure naming it within the timeout (UCCL_EP_TIMEOUT_S = 5 s). The watch of
  the peers' processes on this host (uccl_ep/cuda/liveness.py) ends the kernels' bounded waits
  through the error word; on the proxy path the proxy's heartbeats would as well.
- destroy() releases the Buffer with that rank gone: every device allocation, pinned host
  allocation and host registration uccl_ep made through the driver is given back (counted at the
  driver binding, and the device's free memory is back), and no /dev/shm region, uccl_ep thread or
  OS thread is left (against the same process before the Buffer was built, after a warm-up).
- A Buffer on a group of the survivors carries on: combine(dispatch(x)) = x * (ranks the token went
  to), twice. With 2 GPUs the survivors' group has one rank.

The CPU counterparts: core/tests/cpu/test_recovery.py (host and reference backends) and
core/tests/cpu/test_peer_watch.py (the watch, the error word, destroy with failing steps).
Run on the GPU machine: python -m pytest core/tests/gpu/test_cuda_recovery.py -q -rA
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from multirank import run_ranks  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

TIMEOUT_S = 5.0
ENV = {"UCCL_EP_TIMEOUT_S": str(TIMEOUT_S), "UCCL_EP_GPU_TIMEOUT_S": str(TIMEOUT_S),
       "CUDA_MODULE_LOADING": "EAGER"}  # see uccl_ep.cuda.ll_proxy.warn_lazy_module_loading
PATHS = {"nvlink": {}, "proxy": {"ranks_per_node": 1}}
H = 2048
_COUNTED = {"mem_alloc": ("device", 1), "mem_free": ("device", -1), "host_alloc_mapped": ("pinned", 1),
            "host_free": ("pinned", -1), "host_register": ("registered", 1), "host_unregister": ("registered", -1)}


def _world():
    return min(torch.cuda.device_count(), 8) if torch.cuda.is_available() else 0


def _count_driver_allocations() -> dict:
    """Wrap the driver binding's allocation calls (every uccl_ep allocation goes through them) with
    counters of what is outstanding: device memory, pinned host memory, host registrations."""
    from uccl_ep.cuda.runtime import driver
    drv = driver()
    live = {"device": 0, "pinned": 0, "registered": 0}
    for name, (kind, step) in _COUNTED.items():
        def wrapped(*args, _f=getattr(drv, name), _k=kind, _s=step):
            out = _f(*args)
            live[_k] += _s
            return out
        setattr(drv, name, wrapped)
    return live


def _resources(live: dict) -> dict:
    mine = f"_{os.getpid()}_"
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return dict(driver=dict(live), free_bytes=torch.cuda.mem_get_info()[0],
                shm=sorted(n for n in os.listdir("/dev/shm") if mine in n),
                os_threads=len(os.listdir("/proc/self/task")),
                uccl_threads=sorted(t.name for t in threading.enumerate() if t.name.startswith("uccl_ep")))


def _settled(live: dict, before: dict) -> dict:
    """_resources() once threads being torn down are gone (at most 5 s)."""
    deadline = time.monotonic() + 5.0
    while True:
        got = _resources(live)
        if (got["os_threads"] <= before["os_threads"] and not got["uccl_threads"]) or time.monotonic() > deadline:
            return got


def _leaks(label: str, before: dict, got: dict) -> list[str]:
    out = []
    if got["driver"] != before["driver"]:
        out.append(f"{label}: driver allocations outstanding {before['driver']} -> {got['driver']}")
    if got["free_bytes"] < before["free_bytes"] - (8 << 20):
        out.append(f"{label}: device free memory {before['free_bytes']} -> {got['free_bytes']}")
    if set(got["shm"]) - set(before["shm"]):
        out.append(f"{label}: /dev/shm regions left: {sorted(set(got['shm']) - set(before['shm']))}")
    if got["os_threads"] > before["os_threads"] or got["uccl_threads"]:
        out.append(f"{label}: threads {before['os_threads']} -> {got['os_threads']}, uccl_ep: {got['uccl_threads']}")
    return out


def _make(group, path):
    from uccl_ep import Buffer
    world = dist.get_world_size(group)
    nvl = Buffer.get_dispatch_config(world).get_nvl_buffer_size_hint(H * 2, world)
    buf = Buffer(group, nvl, 0, backend="cuda", explicitly_destroy=True, timeout_s=TIMEOUT_S, **PATHS[path])
    assert buf.backend == "cuda"
    return buf


def _inputs(group, rank, seed):
    world = dist.get_world_size(group)
    T, E, K = 64, 8 * world, min(4, 8 * world)
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(seed * 10 + rank)
    x = torch.randn(T, H, generator=g).bfloat16().to(dev)
    topk = torch.rand(T, E, generator=g).topk(K, dim=1).indices.to(dev)
    w = torch.rand(T, K, generator=g).to(dev)
    return x, topk, w, E


def _dispatch(buf, x, topk, w, E):
    ntpr, _, ntpe, in_rank, _ = buf.get_dispatch_layout(topk, E)
    out = buf.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_rank=ntpr, is_token_in_rank=in_rank,
                       num_tokens_per_expert=ntpe)
    return out, in_rank


def _round(buf, group, rank, seed):
    """One dispatch + combine on `group`, checked: combine(dispatch(x)) = x * (ranks the token went to)."""
    x, topk, w, E = _inputs(group, rank, seed)
    (rx, _, rw, _, handle, _), in_rank = _dispatch(buf, x, topk, w, E)
    comb, _, _ = buf.combine(rx, handle, topk_weights=rw)
    torch.cuda.synchronize()
    buf._executor.check_error()
    hits = in_rank.sum(1, keepdim=True).float()
    assert torch.allclose(comb.float(), (x.float() * hits).bfloat16().float(), rtol=1e-2, atol=1e-2), \
        f"rank {rank} seed {seed}: combine(dispatch(x)) != x * hits"


def worker(rank, world, path):
    from uccl_ep.errors import PeerFailure
    torch.cuda.set_device(rank % torch.cuda.device_count())
    victim = world - 1  # not rank 0, whose process serves the job's Store
    live = _count_driver_allocations()
    warm = _make(dist.group.WORLD, path)  # kernels loaded, lazy pools made, before anything is counted
    _round(warm, dist.group.WORLD, rank, 0)
    warm.destroy()
    dist.barrier()
    before = _resources(live)
    buf = _make(dist.group.WORLD, path)
    _round(buf, dist.group.WORLD, rank, 1)
    dist.barrier()
    if rank == victim:  # joins no further op, and dies while the others wait in one
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    x, topk, w, E = _inputs(dist.group.WORLD, rank, 2)
    t0 = time.monotonic()
    try:
        _dispatch(buf, x, topk, w, E)
        torch.cuda.synchronize()
        buf._executor.check_error()
        raise AssertionError(f"rank {rank}: dispatch with a dead peer did not raise")
    except PeerFailure as e:
        took = time.monotonic() - t0
        assert e.rank == rank and e.peer == victim, str(e)
        error = str(e)
    # recovery: destroy, a group of the survivors, a new Buffer, carry on
    t1 = time.monotonic()
    buf.destroy()
    destroy_s = time.monotonic() - t1
    after_destroy = _settled(live, before)
    survivors = list(range(world - 1))
    group = dist.new_group(survivors, backend="gloo", use_local_synchronization=True,
                           timeout=datetime.timedelta(seconds=60))
    dist.barrier(group=group)  # the new group's own threads exist before counting
    with_group = _resources(live)
    rebuilt = _make(group, path)
    for seed in (3, 4):
        _round(rebuilt, group, rank, seed)
    rebuilt.destroy()
    after = _settled(live, with_group)
    dist.destroy_process_group(group)
    leaks = _leaks("destroy with a dead peer", before, after_destroy) + _leaks("the rebuilt Buffer", with_group, after)
    return dict(took=took, error=error, destroy_s=destroy_s, leaks=leaks, before=before, after_destroy=after_destroy)


@pytest.mark.parametrize("path", list(PATHS))
def test_normal_mode_peer_killed_mid_op_and_recovery(path):
    world = _world()
    out = run_ranks(worker, world, path, backend="gloo", timeout_s=300, env=ENV, may_die=(world - 1,))
    for rank, r in enumerate(out[:-1]):
        print(f"{path}: rank {rank} PeerFailure {r['took']:.2f} s after the op began (the victim died ~1 s in; "
              f"timeout {TIMEOUT_S} s), destroy {r['destroy_s']:.2f} s: {r['error']}")
        print(f"  before {r['before']}\n  after destroy {r['after_destroy']}")
        assert r["took"] < TIMEOUT_S, (rank, r["took"])
        assert r["destroy_s"] < 2 * TIMEOUT_S, (rank, r["destroy_s"])
        assert not r["leaks"], r["leaks"]


if __name__ == "__main__":
    for p in PATHS:
        test_normal_mode_peer_killed_mid_op_and_recovery(p)
