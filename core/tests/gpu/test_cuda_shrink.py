"""Shrink mode on the cuda backend (DeepEP's enable_shrink), on 2+ GPUs, NVLink and forced-proxy paths.

The last rank fails for real: it stops calling at its first low-latency dispatch (silent: DeepEP's
own shrink test), or its process is killed there, or -- with a CUDA graph -- it stops after the
ranks captured and replayed dispatch + combine together, or (proxy path) it is killed between its
first dispatch and its combine, mid-op. Every other rank must:
- complete within 3 x the configured timeout (UCCL_EP_TIMEOUT_S / UCCL_EP_GPU_TIMEOUT_S = 5 s):
  its first op masks the failed rank (the host barrier of the first layout, or the kernels' waits);
- report it in low_latency_query_mask_buffer;
- get dispatch and combine results bitwise equal to uccl_ep.refs with that rank masked (its
  experts' tokens dropped, the rest exact);
- skip it at once in later calls (and graph replays: the kernels read the mask in device memory).

Run on the GPU machine: python -m pytest core/tests/gpu/test_cuda_shrink.py -q -rA
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from multirank import run_ranks  # noqa: E402
from test_cuda_ll import _assert_same_dispatch, _routing, _world  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

TIMEOUT_S = 5.0
ENV = {"UCCL_EP_TIMEOUT_S": str(TIMEOUT_S), "UCCL_EP_GPU_TIMEOUT_S": str(TIMEOUT_S)}
# CUDA_MODULE_LOADING=EAGER: see uccl_ep.cuda.ll_proxy.warn_lazy_module_loading.
PROXY_ENV = {**ENV, "UCCL_EP_FORCE_PROXY": "1", "CUDA_MODULE_LOADING": "EAGER"}
PATHS = {"nvlink": ENV, "proxy": PROXY_ENV}
H, E, T = 2048, 32, 64


def _buffers(world):
    from uccl_ep import Buffer
    nbytes = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    kw = dict(low_latency_mode=True, num_qps_per_rank=E // world, enable_shrink=True)
    ours = Buffer(dist.group.WORLD, 0, nbytes, backend="cuda", **kw)
    ref = Buffer(dist.group.WORLD, 0, nbytes, backend="reference", **kw)
    assert ours.backend == "cuda"
    ours._executor._ll_engine()  # JIT-compiled before any time is taken (the proxy path's is made already)
    return ours, ref


def _inputs(rank, world, seed):
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    topk_idx, topk_w = _routing(T, E, 8, gen, dev)
    y = torch.randn(E // world, world * T, H, generator=gen).to(torch.bfloat16).to(dev)
    return x, topk_idx, topk_w, y


def _check(tag, ref, got_dispatch, got_out, x, topk_idx, topk_w, y):
    """Bitwise against the reference Buffer `ref` (which masks the same ranks)."""
    rx, rc, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)
    _assert_same_dispatch(tag, got_dispatch, (rx, rc, rh), True)
    want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
    torch.cuda.synchronize()
    assert torch.equal(got_out.cpu(), want.cpu()), f"{tag}: combine differs"
    assert not torch.isnan(got_out).any(), f"{tag}: NaN in the combined output"


def _status(buf, world):
    status = torch.full((world,), -1, dtype=torch.int32, device=torch.device("cuda", torch.cuda.current_device()))
    buf.low_latency_query_mask_buffer(status)
    return status.tolist()


def _victim_leaves(rank, victim, mode):
    """The victim fails here: killed, or silent until every other rank is done."""
    if mode == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    store = dist.distributed_c10d._get_default_store()
    store.wait([f"cuda_shrink/done/{r}" for r in range(victim)], datetime.timedelta(seconds=240))


def worker_first_dispatch(rank, world, mode):
    """The victim stops calling (or dies) at its first low-latency dispatch."""
    victim = world - 1
    ours, ref = _buffers(world)
    if rank == victim:
        _victim_leaves(rank, victim, mode)
        return None
    ref.low_latency_update_mask_buffer(victim, mask=True)  # the expectation: the same mask
    timings = []
    for it in range(3):
        x, topk_idx, topk_w, y = _inputs(rank, world, it)
        t0 = time.monotonic()
        got = ours.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)[:3]
        out, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, got[2])
        torch.cuda.synchronize()
        timings.append(time.monotonic() - t0)
        ours._executor.check_error()
        assert _status(ours, world) == [int(r == victim) for r in range(world)], (rank, it, _status(ours, world))
        _check(f"rank {rank} it {it}", ref, got, out, x, topk_idx, topk_w, y)
    dist.distributed_c10d._get_default_store().set(f"cuda_shrink/done/{rank}", "1")
    return timings


def worker_graph(rank, world, mode):
    """Every rank captures dispatch + combine in a CUDA graph and replays it once; then the victim
    stops (or dies). The survivors' replays mask it through the kernels' bounded waits (the layout
    exists: no host barrier), and keep skipping it in later replays."""
    victim = world - 1
    ours, ref = _buffers(world)
    x, topk_idx, topk_w, y = _inputs(rank, world, 0)
    (q, s), cnt, h, _, _ = ours.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)  # fixes the layout
    ours.low_latency_combine(y, topk_idx, topk_w, h)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            (gq, gs), gcnt, gh, _, _ = ours.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)
            gout, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, gh)
    torch.cuda.synchronize()
    dist.barrier()
    graph.replay()  # everyone in
    torch.cuda.synchronize()
    _check(f"rank {rank} replay before the failure", ref, ((gq, gs), gcnt, gh), gout, x, topk_idx, topk_w, y)
    ours._executor.check_error()
    dist.barrier()
    if rank == victim:
        _victim_leaves(rank, victim, mode)
        return None
    ref.low_latency_update_mask_buffer(victim, mask=True)
    timings = []
    for it in range(3):
        nx, nidx, nw, ny = _inputs(rank, world, it + 1)
        x.copy_(nx)
        topk_idx.copy_(nidx)
        topk_w.copy_(nw)
        y.copy_(ny)
        t0 = time.monotonic()
        graph.replay()
        torch.cuda.synchronize()
        timings.append(time.monotonic() - t0)
        ours._executor.check_error()
        assert _status(ours, world) == [int(r == victim) for r in range(world)], (rank, it, _status(ours, world))
        _check(f"rank {rank} replay {it}", ref, ((gq, gs), gcnt, gh), gout, x, topk_idx, topk_w, y)
    dist.distributed_c10d._get_default_store().set(f"cuda_shrink/done/{rank}", "1")
    return timings


def worker_killed_mid_op(rank, world, mode):
    """Forced proxy path: every rank makes the first dispatch, then the victim is killed before its
    combine. With mode "found-dead" the survivors first wait until their proxies have found it dead
    (the liveness grace, half the timeout): the combine's Writes to it are then dropped by the proxy,
    and reach the copy kernel as skip descriptors (dma_ring.h) so that it ends; with "just-killed"
    they combine at once, so the Writes already posted are copied into the dead rank's buffer.
    Either way the receive kernel's wait on the victim masks it, the combine completes with its
    experts' contributions dropped and the rest exact, and later calls skip it at once."""
    victim = world - 1
    ours, ref = _buffers(world)
    x, topk_idx, topk_w, y = _inputs(rank, world, 0)
    got = ours.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)[:3]
    rx, rc, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)  # the victim takes part
    torch.cuda.synchronize()
    ours._executor.check_error()
    _assert_same_dispatch(f"rank {rank} first dispatch", got, (rx, rc, rh), True)
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "found-dead":
        proxy = ours._executor._ll_engine().proxy
        deadline = time.monotonic() + 3 * TIMEOUT_S
        while not proxy.peer_dead(victim):
            assert time.monotonic() < deadline, f"rank {rank}: the proxy did not find rank {victim} dead"
            time.sleep(0.05)
    ref.low_latency_update_mask_buffer(victim, mask=True)
    timings = []
    t0 = time.monotonic()
    out, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, got[2])
    torch.cuda.synchronize()
    timings.append(time.monotonic() - t0)
    ours._executor.check_error()
    assert _status(ours, world) == [int(r == victim) for r in range(world)], (rank, _status(ours, world))
    want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), want.cpu()), f"rank {rank}: combine with the victim killed mid-op differs"
    if mode == "found-dead":  # the proxy dropped the Writes to the victim and queued skips for them
        assert ours._executor._ll_engine().transport_counters().get("ipc_ring_skipped", 0) > 0
    for it in range(1, 3):
        x, topk_idx, topk_w, y = _inputs(rank, world, it)
        t0 = time.monotonic()
        got = ours.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)[:3]
        out, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, got[2])
        torch.cuda.synchronize()
        timings.append(time.monotonic() - t0)
        ours._executor.check_error()
        _check(f"rank {rank} it {it}", ref, got, out, x, topk_idx, topk_w, y)
    return timings


def _run(worker, path, mode):
    world = _world()
    out = run_ranks(worker, world, mode, backend="nccl", timeout_s=300, env=PATHS[path], may_die=(world - 1,))
    for rank, timings in enumerate(out[:-1]):
        print(f"{worker.__name__} {path} {mode}: rank {rank} ops took {[round(t, 3) for t in timings]} s "
              f"(timeouts {TIMEOUT_S} s)")
        assert timings[0] < 3 * TIMEOUT_S, (rank, timings)   # DeepEP's bound: within 3 x the timeout
        assert max(timings[1:]) < 1.0, (rank, timings)        # later calls skip the masked rank at once


@pytest.mark.parametrize("mode", ["silent", "killed"])
@pytest.mark.parametrize("path", ["nvlink", "proxy"])
def test_rank_failing_at_its_first_dispatch_is_masked(path, mode):
    _run(worker_first_dispatch, path, mode)


@pytest.mark.parametrize("mode", ["found-dead", "just-killed"])
def test_rank_killed_mid_op_on_the_proxy_path_is_masked(mode):
    _run(worker_killed_mid_op, "proxy", mode)


@pytest.mark.parametrize("path", ["nvlink", "proxy"])
def test_mask_set_by_the_kernels_holds_in_graph_replays(path):
    _run(worker_graph, path, "silent")


if __name__ == "__main__":
    for path in PATHS:
        for mode in ("silent", "killed"):
            _run(worker_first_dispatch, path, mode)
        _run(worker_graph, path, "silent")
    for mode in ("found-dead", "just-killed"):
        _run(worker_killed_mid_op, "proxy", mode)
