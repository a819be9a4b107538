"""Both modes of one `cuda` Buffer through one proxy session (uccl_ep/cuda/proxy_session.py), on 2+
GPUs of one host acting as nodes (ranks_per_node=1, allow_nvlink_for_low_latency_mode=False: normal
mode and low-latency mode both through the proxy, ipc transport).

One proxy is bootstrapped per rank (start_proxy counted), both engines hold the executor's session,
and ops of the two modes take turns -- normal dispatch, cached dispatch and combine, then
low-latency FP8 dispatch and combine, twice -- so the copy rings change hands between the
normal-mode kernels' copy role and the low-latency copy kernel in both directions, and the
low-latency clean leaves normal mode's counters alone. Every output is compared bitwise with the
reference run on the same group (the reference first; every op of ours ends on every rank before
the next one, as in test_cuda_ht_internode.py).
Run: python -m pytest core/tests/gpu/test_cuda_proxy_session.py -q -rA
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multirank import run_ranks  # noqa: E402
from test_cuda_ht_internode import _check_handle, _eq, _no_device_error  # noqa: E402
from test_cuda_ll import _assert_same_dispatch  # noqa: E402
from test_cuda_ll import _routing as _ll_routing  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

ENV = {"CUDA_MODULE_LOADING": "EAGER"}  # see uccl_ep.cuda.proxy_session.warn_lazy_module_loading


def _world():
    return min(torch.cuda.device_count(), 8) if torch.cuda.is_available() else 0


def worker(rank, world, H, T, E, seed):
    import uccl_ep.proxy
    from uccl_ep import Buffer
    torch.cuda.set_device(rank % torch.cuda.device_count())  # a gloo group: the launcher sets no device
    real, started = uccl_ep.proxy.start_proxy, []
    uccl_ep.proxy.start_proxy = lambda *a, **k: started.append(1) or real(*a, **k)
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    config = Buffer.get_dispatch_config(world)
    nvl = config.get_nvl_buffer_size_hint(H * 2, world)
    rdma = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    kw = dict(low_latency_mode=True, num_qps_per_rank=E // world, ranks_per_node=1,
              allow_nvlink_for_low_latency_mode=False)
    ours = Buffer(group, nvl, rdma, backend="cuda", **kw)
    ref = Buffer(group, nvl, rdma, backend="reference", **kw)
    ex = ours._executor
    assert ours.backend == "cuda" and ex.ht_through_proxy and ex.ll_through_proxy, \
        (ex.ht_through_proxy, ex.ll_through_proxy)
    assert ex.session is not None and ex._ht.session is ex.session and ex._ll.session is ex.session
    assert ex._ht.proxy is ex._ll.proxy is ex.session.proxy
    assert len(started) == 1, f"rank {rank}: {len(started)} proxies bootstrapped for one Buffer"
    quiet = dist.new_group(backend="gloo")

    def settle():
        torch.cuda.synchronize()
        dist.barrier(group=quiet)

    gen = torch.Generator().manual_seed(seed * 100 + rank)
    K, checked = 8, 0
    for it in range(2):
        # normal mode
        tag = f"rank {rank} round {it} normal"
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
        idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(K, dim=-1).indices
        idx[torch.rand(T, K, generator=gen) < 0.05] = -1
        idx, w = idx.to(dev), torch.rand(T, K, generator=gen).to(dev)
        lay_r = ref.get_dispatch_layout(idx, E)
        settle()
        lay_o = ours.get_dispatch_layout(idx, E)
        settle()
        for a, b, name in zip(lay_o[:4], lay_r[:4], ("ntpr", "ntprr", "ntpe", "in_rank")):
            _eq(f"{tag} layout {name}", a, b)
        args = dict(num_tokens_per_rank=lay_o[0], num_tokens_per_rdma_rank=lay_o[1], is_token_in_rank=lay_o[3],
                    num_tokens_per_expert=lay_o[2], topk_idx=idx, topk_weights=w, config=config)
        gr = ref.dispatch(x, **args)
        settle()
        go = ours.dispatch(x, **args)
        settle()
        _no_device_error(tag + " dispatch", ours)
        _eq(tag + " recv_x", go[0], gr[0])
        _eq(tag + " topk_idx", go[1], gr[1])
        _eq(tag + " topk_w", go[2], gr[2])
        assert go[3] == gr[3], f"{tag}: expert list {go[3]} != {gr[3]}"
        _check_handle(tag, go[4], gr[4], 0, 0)
        c_r = ref.dispatch(x, handle=gr[4], config=config)
        settle()
        c_o = ours.dispatch(x, handle=go[4], config=config)
        settle()
        _no_device_error(tag + " cached dispatch", ours)
        _eq(tag + " cached", c_o[0], c_r[0])
        cr = ref.combine(go[0], gr[4], topk_weights=go[2], config=config)
        settle()
        co = ours.combine(go[0], go[4], topk_weights=go[2], config=config)
        settle()
        _no_device_error(tag + " combine", ours)
        _eq(tag + " combine", co[0], cr[0])
        _eq(tag + " combined weights", co[1], cr[1])
        # low-latency mode on the same session
        tag = f"rank {rank} round {it} low-latency"
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
        idx, w = _ll_routing(T, E, K, gen, dev)
        rx, rc, rh, _, _ = ref.low_latency_dispatch(x, idx, T, E, use_fp8=True)
        settle()
        ox, oc, oh, _, _ = ours.low_latency_dispatch(x, idx, T, E, use_fp8=True)
        settle()
        _no_device_error(tag + " dispatch", ours)
        _assert_same_dispatch(tag, (ox, oc, oh), (rx, rc, rh), True)
        y = torch.randn(E // world, world * T, H, generator=gen).to(torch.bfloat16).to(dev)
        want, _, _ = ref.low_latency_combine(y, idx, w, rh)
        settle()
        got, _, _ = ours.low_latency_combine(y, idx, w, oh)
        settle()
        _no_device_error(tag + " combine", ours)
        _eq(tag + " combine", got, want)
        checked += 1
    counters = ex.session.transport_counters()
    kind = ex.session.proxy.transport_name.split(":")[-1]
    out = (checked, len(started), ex.session.proxy.transport_name, int(counters.get(f"ipc_{kind}_copies", 0)))
    dist.barrier()
    return out


def test_both_modes_share_one_proxy_session():
    world = _world()
    if world < 2:
        pytest.skip("needs 2 GPUs")
    out = run_ranks(worker, world, 2048, 96, 8 * world, 3, backend="gloo", timeout_s=600, env=ENV)
    for rank, (checked, started, transport, copies) in enumerate(out):
        print(f"rank {rank}: {checked} rounds, {started} proxy bootstrapped, transport {transport}, {copies} copies")
        assert checked == 2 and started == 1
        assert transport.startswith("ipc") and copies > 0, "the traffic did not cross the ipc transport"
