"""Low-latency kernels of the `cuda` backend through the CPU proxy, against `uccl_ep.refs`, on 2+ GPUs
of one host acting as separate nodes: GPU -> FIFO -> proxy -> ipc transport (peer copy into the
receiver's LL buffer, then the immediate) -> receiving proxy -> counter -> receive kernel. The peer
copy is made by the sender's copy kernel from the proxy's descriptor ring (UCCL_EP_IPC_COPY=kernel,
the default; transport/copy_ring.cu) or by the proxy thread through the driver (=cuda).

The same workers as test_cuda_ll.py (every option combination, masking and clean, CUDA-graph
capture and replay, the bounded device wait) run with UCCL_EP_FORCE_PROXY=1; one more checks the
proxy path really carried the traffic (commands posted, CUDA peer copies) when selected through
DeepEP's own flag, allow_nvlink_for_low_latency_mode=False.

The NIC test needs a libfabric provider that registers GPU memory (FI_HMEM); no machine of this
project has one. Run: bash tools/lab/run_device.sh build proxy
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
from test_cuda_ll import BIG, SMALL, _routing, _world, worker_graph, worker_mask_clean, worker_options  # noqa: E402
from test_cuda_ll import worker_logfmt, worker_timeout  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

# CUDA_MODULE_LOADING=EAGER: see uccl_ep.cuda.ll_proxy.warn_lazy_module_loading.
EAGER_ENV = {"CUDA_MODULE_LOADING": "EAGER"}
PROXY_ENV = {"UCCL_EP_FORCE_PROXY": "1", **EAGER_ENV}


def worker_engaged(rank, world, H, E, T_max, seed):
    """allow_nvlink_for_low_latency_mode=False selects the proxy path; it carried the traffic."""
    from uccl_ep import Buffer
    from uccl_ep.cuda.ll_proxy import ProxyLowLatencyEngine
    group = dist.group.WORLD
    nbytes = Buffer.get_low_latency_rdma_size_hint(T_max, H, world, E)
    buf = Buffer(group, 0, nbytes, low_latency_mode=True, backend="cuda", allow_nvlink_for_low_latency_mode=False)
    ref = Buffer(group, 0, nbytes, low_latency_mode=True, backend="reference")
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(T_max, H, generator=gen).to(torch.bfloat16).to(dev)
    topk_idx, topk_w = _routing(T_max, E, 8, gen, dev)
    (q, s), cnt, h, _, _ = buf.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
    y = torch.randn(E // world, world * T_max, H, generator=gen).to(torch.bfloat16).to(dev)
    got, _, _ = buf.low_latency_combine(y, topk_idx, topk_w, h)
    (rq, rs), rc, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
    want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
    torch.cuda.synchronize()
    buf._executor.check_error()
    assert torch.equal(cnt.cpu(), rc.cpu()), "recv_count differs"
    assert torch.equal(got.cpu(), want.cpu()), "combine differs"
    eng = buf._executor._ll
    assert isinstance(eng, ProxyLowLatencyEngine), type(eng)
    counters = eng.proxy.transport_counters()
    kind = eng.proxy.transport_name.split(":")[-1]
    out = (eng.proxy.transport_name, int(eng.proxy.commands_posted), int(counters.get(f"ipc_{kind}_copies", 0)))
    dist.barrier()
    return out


@pytest.mark.parametrize("shape", [SMALL, BIG], ids=["small", "deepseek"])
def test_ll_proxy_options_match_reference(shape):
    out = run_ranks(worker_options, _world(), *shape.values(), backend="nccl", timeout_s=600, env=PROXY_ENV)
    assert all(n > 0 for n in out)


@pytest.mark.parametrize("copy", ["kernel", "cuda"])
def test_ll_proxy_carries_the_traffic(copy):
    """Both ipc copy engines: the copy kernel reading the proxies' descriptor rings (the default),
    and the proxy thread's own cuMemcpyDtoDAsync (UCCL_EP_IPC_COPY=cuda)."""
    env = dict(EAGER_ENV, UCCL_EP_IPC_COPY=copy)
    for name, commands, copies in run_ranks(worker_engaged, _world(), *SMALL.values(), backend="nccl", timeout_s=300,
                                             env=env):
        assert name == f"ipc:{copy}"
        # dispatch and combine: per peer one Write (its packed region) and the signal pair; the rank's
        # own region is read in place, never pushed
        assert commands == 2 * (_world() - 1) * 3, commands
        assert copies > 0


@pytest.mark.parametrize("shape", [SMALL, BIG], ids=["small", "deepseek"])
def test_ll_proxy_logfmt_combine(shape):
    """LogFMT combine through the proxy (rows encoded into the packed regions): bit for bit the
    reference's, within DeepEP's tolerance of BF16, also under a CUDA graph (worker_logfmt)."""
    out = run_ranks(worker_logfmt, _world(), *shape.values(), backend="nccl", timeout_s=600, env=PROXY_ENV)
    assert all(n > 0 for n in out)


def test_ll_proxy_mask_and_clean():
    run_ranks(worker_mask_clean, _world(), *SMALL.values(), backend="nccl", timeout_s=300, env=PROXY_ENV)


def test_ll_proxy_cuda_graph_capture():
    run_ranks(worker_graph, _world(), *BIG.values(), backend="nccl", timeout_s=300, env=PROXY_ENV)


def _no_gpudirect_nic() -> str | None:
    from uccl_ep.proxy import native
    name, why = native().fabric_probe(os.environ.get("UCCL_EP_FABRIC_PROVIDER", ""), "", 0)
    return None if name else why


@pytest.mark.skipif(_no_gpudirect_nic() is not None, reason="needs a NIC whose libfabric provider registers GPU "
                    "memory (FI_HMEM: efa, or verbs with nvidia-peermem)")
def test_ll_proxy_through_a_gpudirect_nic():
    """The path between hosts (ipc+fabric), on one host: with every GPU its own node every peer is on
    another node, so all traffic crosses the NIC (loopback) from and into GPU memory."""
    env = dict(PROXY_ENV, UCCL_EP_TRANSPORT="fabric", UCCL_EP_RANKS_PER_NODE="1")
    out = run_ranks(worker_options, _world(), *SMALL.values(), backend="nccl", timeout_s=600, env=env)
    assert all(n > 0 for n in out)


def test_ll_proxy_device_wait_timeout():
    out = run_ranks(worker_timeout, _world(), *SMALL.values(), backend="nccl", timeout_s=300, env=PROXY_ENV)
    print("timeout outcome:", out[0])


if __name__ == "__main__":
    os.environ.update(PROXY_ENV)
    plan = [(worker_engaged, SMALL)] if sys.argv[1:] == ["small"] else \
        [(worker_engaged, SMALL), (worker_options, SMALL), (worker_options, BIG), (worker_graph, BIG),
         (worker_timeout, SMALL)]
    for fn, shape in plan:
        print(fn.__name__, run_ranks(fn, _world(), *shape.values(), backend="nccl", timeout_s=600, env=PROXY_ENV))
