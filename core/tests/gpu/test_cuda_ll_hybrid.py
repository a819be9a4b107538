"""Hybrid low-latency paths of the `cuda` backend against `uccl_ep.refs`: 4 GPUs of one host as 2 nodes
x 2 (UCCL_EP_RANKS_PER_NODE=2). Ranks 0<->1 and 2<->3 reach each other over NVLink (the proxy-path
kernels store straight into the peer's LL buffer and signal its NVLink word), every other pair
through the CPU proxy (ipc transport, the stand-in for a NIC): uccl_ep/cuda/ll_hybrid.py.

The workers of test_cuda_ll.py (every option combination incl. zero copy, hooks and async, masking
and clean, CUDA-graph capture and replay, the bounded device wait) run on that layout, small and
DeepSeek-size (128 x 7168, top-8 of 288); one more checks that the node's own traffic never entered
the proxy (its transport carried no payload to the node's peer) while the other node's did, and that
allow_nvlink_for_low_latency_mode=False still sends every peer through the proxy.

Needs 4 GPUs (2 nodes of 2 distinct GPUs each: the cuda executor takes one GPU per rank; the runtime
does not hold two ranks per GPU), except test_ll_one_rank_nodes_go_through_the_proxy (2+ GPUs, nodes
of one rank: the route the topology alone selects, no NVLink peer). Run:
  UCCL_EP_RANKS_PER_NODE=2 python3 -m pytest core/tests/gpu/test_cuda_ll_hybrid.py -q
(the tests set the variable for their ranks themselves).
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
from test_cuda_ll import BIG, SMALL, _routing, worker_graph, worker_mask_clean, worker_options  # noqa: E402
from test_cuda_ll import worker_timeout  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

WORLD = 4
# CUDA_MODULE_LOADING=EAGER: see uccl_ep.cuda.ll_proxy.warn_lazy_module_loading.
HYBRID_ENV = {"UCCL_EP_RANKS_PER_NODE": "2", "UCCL_EP_FORCE_PROXY": "0", "CUDA_MODULE_LOADING": "EAGER"}


@pytest.fixture
def four_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < WORLD:
        pytest.skip("needs 4 GPUs: 2 nodes x 2")


def worker_paths(rank, world, H, E, T_max, seed):
    """One dispatch + combine vs the reference, per path layout; returns what the proxy carried."""
    from uccl_ep import Buffer
    from uccl_ep.cuda.ll import LowLatencyEngine
    from uccl_ep.cuda.ll_proxy import ProxyLowLatencyEngine
    group = dist.group.WORLD
    nbytes = Buffer.get_low_latency_rdma_size_hint(T_max, H, world, E)
    dev = torch.device("cuda", torch.cuda.current_device())
    ref = Buffer(group, 0, nbytes, low_latency_mode=True, backend="reference")
    partner = rank ^ 1   # the other rank of this rank's node
    out = {}
    for name, kw in (("hybrid", {}), ("forced", dict(allow_nvlink_for_low_latency_mode=False)),
                     ("one node", dict(ranks_per_node=world))):
        buf = Buffer(group, 0, nbytes, low_latency_mode=True, backend="cuda", explicitly_destroy=True, **kw)
        gen = torch.Generator().manual_seed(seed + rank)
        x = torch.randn(T_max, H, generator=gen).to(torch.bfloat16).to(dev)
        topk_idx, topk_w = _routing(T_max, E, 8, gen, dev)
        y = torch.randn(E // world, world * T_max, H, generator=gen).to(torch.bfloat16).to(dev)
        (rq, rs), rc, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
        want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
        torch.cuda.synchronize()
        (q, s), cnt, h, _, _ = buf.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
        got, _, _ = buf.low_latency_combine(y, topk_idx, topk_w, h)
        torch.cuda.synchronize()
        buf._executor.check_error()
        assert torch.equal(cnt.cpu(), rc.cpu()), f"{name}: recv_count differs"
        for e, c in enumerate(cnt.tolist()):
            assert torch.equal(q[e, :c].view(torch.uint8).cpu(), rq[e, :c].view(torch.uint8).cpu()), \
                f"{name}: fp8 rows differ at expert {e}"
            assert torch.equal(s[e, :c].cpu(), rs[e, :c].cpu()), f"{name}: scales differ at expert {e}"
        assert torch.equal(got.cpu(), want.cpu()), f"{name}: combine differs"
        eng = buf._executor._ll
        if name == "one node":   # ranks_per_node = the group: the NVLink kernels, as before
            assert type(eng) is LowLatencyEngine, type(eng)
        else:
            assert isinstance(eng, ProxyLowLatencyEngine), type(eng)
            counters = dict(eng.proxy.transport_counters())
            out[name] = dict(peers=eng.hybrid.peers, commands=int(eng.proxy.commands_posted),
                             payload={j: int(counters.get(f"ipc_bytes_to_{j}", 0)) for j in range(world)})
        dist.barrier()
        buf.destroy()
    hybrid, forced = out["hybrid"], out["forced"]
    assert hybrid["peers"] == (partner,), hybrid
    assert forced["peers"] == (), forced
    remote = [j for j in range(world) if j // 2 != rank // 2]
    # hybrid: no payload to the node's peer through the proxy (its proxy still sends that peer
    # heartbeats: control messages without bytes); per remote peer and op one Write and the signal
    # pair (2 ops); forced: the same for all three peers
    assert hybrid["payload"][partner] == 0, hybrid
    assert all(hybrid["payload"][j] > 0 for j in remote), hybrid
    assert hybrid["commands"] == 2 * len(remote) * 3, hybrid
    assert forced["payload"][partner] > 0, forced
    assert forced["commands"] == 2 * (world - 1) * 3, forced
    return out


def test_ll_hybrid_node_traffic_stays_off_the_proxy(four_gpus):
    out = run_ranks(worker_paths, WORLD, *SMALL.values(), backend="nccl", timeout_s=300, env=HYBRID_ENV)
    print("proxy traffic per rank:", out)


@pytest.mark.parametrize("shape", [SMALL, BIG], ids=["small", "deepseek"])
def test_ll_hybrid_options_match_reference(shape, four_gpus):
    out = run_ranks(worker_options, WORLD, *shape.values(), backend="nccl", timeout_s=600, env=HYBRID_ENV)
    assert all(n > 0 for n in out)


def test_ll_hybrid_cuda_graph_capture(four_gpus):
    run_ranks(worker_graph, WORLD, *BIG.values(), backend="nccl", timeout_s=300, env=HYBRID_ENV)


def test_ll_hybrid_mask_and_clean(four_gpus):
    """The last rank (node 1's second) masked: its node peer and the other node leave it out."""
    run_ranks(worker_mask_clean, WORLD, *SMALL.values(), backend="nccl", timeout_s=300, env=HYBRID_ENV)


def test_ll_hybrid_device_wait_timeout(four_gpus):
    """Rank 0 dispatches alone: it times out on its NVLink peer or a remote one, naming it."""
    out = run_ranks(worker_timeout, WORLD, *SMALL.values(), backend="nccl", timeout_s=300, env=HYBRID_ENV)
    print("timeout outcome:", out[0])


def worker_one_rank_nodes(rank, world, H, E, T_max, seed):
    """Nodes of one rank (2 GPUs as 2 nodes): LL through the proxy kernels with no NVLink peer, chosen
    by the topology (not forced), against the reference like any other layout."""
    from uccl_ep import Buffer
    from uccl_ep.cuda.ll_proxy import ProxyLowLatencyEngine
    nbytes = Buffer.get_low_latency_rdma_size_hint(T_max, H, world, E)
    buf = Buffer(dist.group.WORLD, 0, nbytes, low_latency_mode=True, backend="cuda", explicitly_destroy=True)
    eng = buf._executor._ll
    assert isinstance(eng, ProxyLowLatencyEngine) and eng.hybrid.peers == (), (type(eng), eng.hybrid.peers)
    dist.barrier()
    buf.destroy()
    return worker_options(rank, world, H, E, T_max, seed)


def test_ll_one_rank_nodes_go_through_the_proxy():
    """Runs on 2+ GPUs (UCCL_EP_RANKS_PER_NODE=1): the topology alone selects the proxy kernels."""
    world = min(torch.cuda.device_count(), 4) if torch.cuda.is_available() else 0
    env = dict(HYBRID_ENV, UCCL_EP_RANKS_PER_NODE="1")
    out = run_ranks(worker_one_rank_nodes, world, *SMALL.values(), backend="nccl", timeout_s=600, env=env)
    assert all(n > 0 for n in out)


if __name__ == "__main__":
    for fn, shape in ((worker_paths, SMALL), (worker_options, SMALL), (worker_options, BIG), (worker_graph, BIG)):
        print(fn.__name__, run_ranks(fn, WORLD, *shape.values(), backend="nccl", timeout_s=600, env=HYBRID_ENV))
