"""backend="host" against the reference executor (uccl_ep.refs), in processes, bit for bit.

Each rank builds a host Buffer and a reference Buffer on the same group and runs identical
inputs through both: every output tensor, expert count list and handle item must be equal
(LL dispatch outputs are compared whole, which implies per (expert, source) segment). Cases:
BF16 and FP8, biases, cached handles, num_worst_tokens, expert alignment, -1 routing, all tokens
to one expert, a rank with no tokens and a rank nobody routes to; 2 and 4 ranks, 2 nodes x 2
ranks (internode: dedup per node, forwarding, hierarchical reduce); loop and tcp;ofi_rxm, with
and without the fault transport (100% reorder, delays, torn writes).
"""

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.proxy import transport_unavailable_reason
from uccl_ep.refs.fp8 import per_token_cast_to_fp8

pytestmark = pytest.mark.cpu

HAVE_FABRIC = transport_unavailable_reason("fabric") is None
FAULT_ENV = {"UCCL_EP_FAULT": "reorder=1,delay=16,tear=0.5,pieces=4,seed=9"}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:  # fp8 and bool: compare the bytes
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


def _diff(a, b, name, out):
    """Append to `out` every place where the nested outputs a and b differ."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            out.append(f"{name}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{name}[{i}]", out)
    elif isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if not _same(a, b):
            out.append(f"{name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
    elif a != b:
        out.append(f"{name}: {a!r} vs {b!r}")


# --------------------------------------------------------------------------------------------------
# normal (high-throughput) mode
# --------------------------------------------------------------------------------------------------
def _ht_inputs(case, rank, world, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    E, K, H = 4 * world, 4, 256
    T = int(torch.randint(40, 90, (1,), generator=g))
    if case == "empty_rank" and rank == 1:
        T = 0
    scores = torch.rand(T, E, generator=g)
    if case == "empty_rank":
        scores[:, E - E // world:] = -1  # nobody routes to the last rank
    topk = scores.topk(K, dim=1).indices
    if case in ("minus_one", "random"):
        topk[torch.rand(T, K, generator=g) < (0.3 if case == "minus_one" else 0.1)] = -1
    if case == "one_expert":
        topk = torch.full((T, K), -1, dtype=torch.int64)
        topk[:, 0] = 1
    x = torch.randn(T, H, generator=g).bfloat16()
    w = torch.rand(T, K, generator=g)
    return x, topk, w, E


def _ht_run(buf, case, x, topk, w, E, world, seed, rank):
    out = {}
    ntpr, ntprr, ntpe, in_rank, _ = buf.get_dispatch_layout(topk, E)
    out["layout"] = (ntpr, ntprr, ntpe, in_rank)
    xin = per_token_cast_to_fp8(x.float()) if case == "fp8" else x
    worst = 90 * world + 3 if case == "worst" else 0
    align = 4 if case == "random" else 1
    rx, ridx, rw, lst, handle, _ = buf.dispatch(xin, topk_idx=topk, topk_weights=w, num_tokens_per_rank=ntpr,
                                                num_tokens_per_rdma_rank=ntprr, is_token_in_rank=in_rank,
                                                num_tokens_per_expert=ntpe, expert_alignment=align,
                                                num_worst_tokens=worst)
    out["dispatch"] = (rx, ridx, rw, lst, tuple(handle))
    g = torch.Generator().manual_seed(seed * 7 + rank)
    rows = (rx[0] if isinstance(rx, tuple) else rx).shape[0]
    if buf.topology.is_internode:
        # NOTES: values on a 1/16 grid make every fp32 sum exact, so the hierarchical reduce must
        # agree with the reference's flat order bit for bit (see host/ht_internode.py).
        y = (torch.randint(-64, 64, (rows, x.shape[1]), generator=g) / 16).bfloat16()
        b0 = (torch.randint(-64, 64, tuple(x.shape), generator=g) / 16).bfloat16()
    else:
        y = torch.randn(rows, x.shape[1], generator=g).bfloat16()
        b0 = torch.randn(tuple(x.shape), generator=g).bfloat16()
    b1 = torch.ones_like(b0)
    out["combine"] = buf.combine(y, handle, topk_weights=rw, bias=(b0, b1))[:2]
    out["combine_nobias"] = buf.combine(y, handle)[:2]
    x2 = (x.float() * 3).bfloat16()
    xin2 = per_token_cast_to_fp8(x2.float()) if case == "fp8" else x2
    out["cached"] = buf.dispatch(xin2, handle=handle)[0]
    return out


def _ht_worker(rank, world, rpn, seed, cases):
    kw = dict(ranks_per_node=rpn) if rpn else {}
    nvl, rdma = 64 << 20, (32 << 20) if rpn else 0
    host = Buffer(dist.group.WORLD, nvl, rdma, backend="host", explicitly_destroy=True, **kw)
    ref = Buffer(dist.group.WORLD, nvl, rdma, backend="reference", explicitly_destroy=True, **kw)
    problems = {}
    for i, case in enumerate(cases):
        x, topk, w, E = _ht_inputs(case, rank, world, seed + i)
        a = _ht_run(host, case, x, topk, w, E, world, seed + i, rank)
        b = _ht_run(ref, case, x, topk, w, E, world, seed + i, rank)
        diffs = []
        for k in a:
            _diff(a[k], b[k], f"{case}.{k}", diffs)
        problems[case] = diffs
    backend = host.backend
    host.destroy()
    ref.destroy()
    return backend, problems


HT_CASES = ["random", "minus_one", "one_expert", "empty_rank", "fp8", "worst"]


def _check(results, backend="host"):
    for rank, (name, problems) in enumerate(results):
        assert name == backend
        for case, diffs in problems.items():
            assert diffs == [], f"rank {rank} case {case}: {diffs[:5]}"


@pytest.mark.parametrize("world,rpn", [(2, 0), (4, 0), (4, 2)])
def test_ht_matches_reference(world, rpn):
    _check(run_ranks(_ht_worker, world, rpn, 11, HT_CASES, timeout_s=300))


@pytest.mark.skipif(not HAVE_FABRIC, reason="libfabric is not installed")
def test_ht_internode_over_fabric_with_faults():
    env = dict(FAULT_ENV, UCCL_EP_TRANSPORT="fabric")
    _check(run_ranks(_ht_worker, 4, 2, 23, ["random", "fp8", "empty_rank"], timeout_s=300, env=env))


def test_ht_intranode_loop_with_faults():
    _check(run_ranks(_ht_worker, 2, 0, 31, ["random", "one_expert", "worst"], timeout_s=300, env=FAULT_ENV))


# --------------------------------------------------------------------------------------------------
# low-latency mode
# --------------------------------------------------------------------------------------------------
LL_CASES = [
    dict(name="bf16", fp8=False),
    dict(name="fp8", fp8=True),
    dict(name="fp8_round", fp8=True, round_scale=True),
    dict(name="fp8_ue8m0", fp8=True, round_scale=True, ue8m0=True),
    dict(name="minus_one", fp8=True, minus=0.3),
    dict(name="one_expert", fp8=False, one_expert=True),
    dict(name="empty_rank", fp8=True, empty_rank=True),
    dict(name="hook_zero_copy_out", fp8=False, hook=True, zero_copy=True, out=True),
    dict(name="masked", fp8=True, mask=True),
]


def _ll_run(buf, c, x, topk, w, T, E, rank, world):
    if c.get("mask"):
        buf.low_latency_update_mask_buffer(world - 1, True)
    cum = torch.zeros(E // world, dtype=torch.int32)
    rx, cnt, handle, _, hook = buf.low_latency_dispatch(
        x, topk, T, E, cumulative_local_expert_recv_stats=cum, use_fp8=c["fp8"],
        round_scale=c.get("round_scale", False), use_ue8m0=c.get("ue8m0", False), return_recv_hook=c.get("hook", False))
    if hook is not None:
        hook()
    y = (rx[0].float() * 0.5).bfloat16() if c["fp8"] else rx * 2
    out = torch.empty(x.shape[0], x.shape[1], dtype=torch.bfloat16) if c.get("out") else None
    if c.get("zero_copy"):
        buf.get_next_low_latency_combine_buffer(handle).copy_(y)
    comb, _, hook = buf.low_latency_combine(y, topk, w, handle, zero_copy=c.get("zero_copy", False),
                                            return_recv_hook=c.get("hook", False), out=out)
    if hook is not None:
        hook()
    if c.get("mask"):
        buf.low_latency_clean_mask_buffer()
    return dict(x=rx, count=cnt, src_info=handle[0], layout_range=handle[1], cum=cum,
                combined=comb if out is None else out)


def _ll_worker(rank, world, rpn, seed, cases):
    T, H, E, K = 24, 512, 4 * world, 4
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    kw = dict(ranks_per_node=rpn) if rpn else {}
    bufs = [Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world, backend=b,
                   enable_shrink=True, explicitly_destroy=True, **kw) for b in ("host", "reference")]
    problems = {}
    for i, c in enumerate(cases):
        g = torch.Generator().manual_seed((seed + i) * 1000 + rank)
        n = 0 if c.get("empty_rank") and rank == 1 else int(torch.randint(1, T + 1, (1,), generator=g))
        x = torch.randn(n, H, generator=g).bfloat16()
        topk = torch.rand(n, E, generator=g).topk(K, dim=1).indices
        if c.get("minus"):
            topk[torch.rand(n, K, generator=g) < c["minus"]] = -1
        if c.get("one_expert"):
            topk = torch.full((n, K), -1, dtype=torch.int64)
            topk[:, 1] = E - 1
        w = torch.rand(n, K, generator=g)
        a = _ll_run(bufs[0], c, x, topk, w, T, E, rank, world)
        b = _ll_run(bufs[1], c, x, topk, w, T, E, rank, world)
        diffs = []
        for k in a:
            _diff(a[k], b[k], f"{c['name']}.{k}", diffs)
        problems[c["name"]] = diffs
    backend = bufs[0].backend
    for b in bufs:
        b.destroy()
    return backend, problems


@pytest.mark.parametrize("world,rpn", [(2, 0), (4, 0), (4, 2)])
def test_ll_matches_reference(world, rpn):
    _check(run_ranks(_ll_worker, world, rpn, 5, LL_CASES, timeout_s=300))


@pytest.mark.parametrize("transport", ["loop"] + (["fabric"] if HAVE_FABRIC else []))
def test_ll_with_faults(transport):
    env = dict(FAULT_ENV, UCCL_EP_TRANSPORT=transport)
    _check(run_ranks(_ll_worker, 2, 0, 17, LL_CASES[:5], timeout_s=300, env=env))


# --------------------------------------------------------------------------------------------------
# random-routing stress
# --------------------------------------------------------------------------------------------------
def _stress_worker(rank, world, iters, seed):
    T, H, E, K = 16, 128, 4 * world, 3
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    bufs = [Buffer(dist.group.WORLD, 16 << 20, hint, low_latency_mode=True, backend=b, explicitly_destroy=True)
            for b in ("host", "reference")]
    bad = []
    for it in range(iters):
        g = torch.Generator().manual_seed(seed * 100003 + it * 17 + rank)
        n = int(torch.randint(0, T + 1, (1,), generator=g))
        x = torch.randn(n, H, generator=g).bfloat16()
        topk = torch.randint(-1, E, (n, K), generator=g)
        if it % 2 == 0:  # low-latency: distinct experts per row (DeepEP's routing), some -1
            topk = torch.rand(n, E, generator=g).topk(K, dim=1).indices
            topk[torch.rand(n, K, generator=g) < 0.2] = -1
        w = torch.rand(n, K, generator=g)
        outs = []
        for buf in bufs:
            if it % 2:  # normal mode round trip
                ntpr, ntprr, ntpe, in_rank, _ = buf.get_dispatch_layout(topk, E)
                rx, ridx, rw, lst, handle, _ = buf.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_rank=ntpr,
                                                            is_token_in_rank=in_rank, num_tokens_per_expert=ntpe)
                outs.append((rx, ridx, rw, lst, buf.combine(rx, handle, topk_weights=rw)[:2]))
            else:
                buf.clean_low_latency_buffer(T, H, E)
                rx, cnt, handle, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=bool(it % 4))
                y = rx[0].float().bfloat16() if it % 4 else rx
                outs.append((rx, cnt, handle[0], handle[1], buf.low_latency_combine(y, topk, w, handle)[0]))
        diffs = []
        _diff(outs[0], outs[1], f"iter {it}", diffs)
        if diffs:
            bad.append(diffs[:3])
    for b in bufs:
        b.destroy()
    return bufs[0].backend, {"stress": bad}


def test_random_routing_stress():
    _check(run_ranks(_stress_worker, 2, 40, 3, timeout_s=300, env=FAULT_ENV))


@pytest.mark.slow
def test_random_routing_stress_full():
    _check(run_ranks(_stress_worker, 2, 10_000, 4, timeout_s=3600, env=FAULT_ENV))
