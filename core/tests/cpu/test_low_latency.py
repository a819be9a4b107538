"""Low-latency mode through uccl_ep.Buffer on 2 and 4 ranks (gloo): per-(expert, source) segment
checks against independent expectations, FP8/UE8M0 layouts, hooks, stats, zero-copy, out=,
buffer parity, masking (shrink), DeepEP's combine tolerance."""

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.bench.expect import check_ll_dispatch
from uccl_ep.refs.fp8 import per_token_cast_back, per_token_cast_to_fp8, unpack_ue8m0
from uccl_ep.utils import calc_diff

pytestmark = pytest.mark.cpu

BACKENDS = ["reference", "host"]


def _make(rank, world, num_max, hidden, num_experts, backend, **kw):
    rdma = Buffer.get_low_latency_rdma_size_hint(num_max, hidden, world, num_experts)
    return Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=num_experts // world,
                  backend=backend, **kw)


def _gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _inputs(rank, T, H, E, K, gen, num_masked=3):
    # DeepEP's LL test input: rank-constant rows (rank - 128) with the token index in the last 128
    # columns, plus fresh random rows; sorted top-k with some -1 entries.
    x_const = torch.full((T, H), float(rank - 128), dtype=torch.bfloat16)
    x_const[:, -128:] = torch.arange(T, dtype=torch.float32).view(-1, 1).to(torch.bfloat16)
    x_rand = (torch.randn(T, H, generator=gen) * 0.1).to(torch.bfloat16)
    scores = torch.randn(T, E, generator=gen).abs() + 1
    topk = scores.topk(K, dim=-1).indices.sort(dim=-1).values
    if T:
        topk[torch.randint(0, T, (num_masked,), generator=gen), torch.randint(0, K, (num_masked,), generator=gen)] = -1
    w = torch.randn(T, K, generator=gen).abs()
    return x_const, x_rand, topk, w


def _ll_worker(rank, world, backend, seed, T, num_max):
    H, E, K = 512, 4 * world, 3
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    buf = _make(rank, world, num_max, H, E, backend)
    E_loc = E // world
    x_const, x_rand, topk, w = _inputs(rank, T, H, E, K, gen)
    all_topk = _gather(topk)
    cumulative = torch.zeros(E_loc, dtype=torch.int32)
    wait_stats = torch.zeros(world, dtype=torch.int64)
    checked = 0
    for x in (x_const, x_rand):
        all_x = _gather(x)
        for use_fp8, round_scale, use_ue8m0 in ((False, False, False), (True, False, False), (True, True, False),
                                                (True, True, True)):
            for hook_mode in (False, True):
                recv, recv_count, handle, ev, hook = buf.low_latency_dispatch(
                    x, topk, num_max, E, cumulative_local_expert_recv_stats=cumulative,
                    dispatch_wait_recv_cost_stats=wait_stats, use_fp8=use_fp8, round_scale=round_scale,
                    use_ue8m0=use_ue8m0, return_recv_hook=hook_mode)
                assert (hook is not None) == hook_mode
                if hook_mode:
                    hook()
                # shapes and layouts
                if use_fp8:
                    q, scales = recv
                    assert q.dtype == torch.float8_e4m3fn and q.shape == (E_loc, world * num_max, H)
                    n_sc = H // 512 if use_ue8m0 else H // 128
                    assert scales.dtype == (torch.int32 if use_ue8m0 else torch.float32)
                    assert scales.shape == (E_loc, world * num_max, n_sc)
                    assert scales.stride() == (n_sc * world * num_max, 1, world * num_max)  # column-major
                    all_q = [per_token_cast_to_fp8(v.float(), round_scale=round_scale)[0].view(torch.uint8)
                             for v in all_x]
                    checked += check_ll_dispatch(lambda e, b, n: q[e, b:b + n].view(torch.uint8), recv_count, handle,
                                                 all_q, all_topk, rank, E, world)
                    # dequantized rows are close to the source rows (DeepEP's per_token_cast_back)
                    for e in range(E_loc):
                        for j in range(world):
                            packed = int(handle[1][e, j])
                            b, n = packed >> 32, packed & 0xFFFFFFFF
                            if n == 0:
                                continue
                            sc = scales[e, b:b + n]
                            deq = per_token_cast_back(q[e, b:b + n], unpack_ue8m0(sc) if use_ue8m0 else sc)
                            rows = all_x[j][handle[0][e, b:b + n].long()].float()
                            assert calc_diff(deq, rows) < 1e-3
                else:
                    assert recv.dtype == torch.bfloat16 and recv.shape == (E_loc, world * num_max, H)
                    checked += check_ll_dispatch(lambda e, b, n: recv[e, b:b + n], recv_count, handle,
                                                 all_x, all_topk, rank, E, world)
                    if x is x_const:
                        # DeepEP's data check: rows constant except the last 128 columns = token index
                        for e in range(E_loc):
                            for j in range(world):
                                packed = int(handle[1][e, j])
                                b, n = packed >> 32, packed & 0xFFFFFFFF
                                rows = recv[e, b:b + n].float()
                                assert (rows[:, :-128] == j - 128).all()
                                assert torch.equal(rows[:, -1].long(), handle[0][e, b:b + n].long() % T)
                # combine (BF16 expert outputs = the dispatched rows themselves)
                if not use_fp8:
                    y = recv.clone()
                    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)   # poisoned
                    comb, cev, chook = buf.low_latency_combine(y, topk, w, handle, out=out, return_recv_hook=hook_mode)
                    if hook_mode:
                        chook()
                    assert comb.data_ptr() == out.data_ptr()
                    expect = x.float() * torch.where(topk >= 0, w, torch.zeros_like(w)).sum(1, keepdim=True)
                    assert not torch.isnan(comb).any() and comb.shape == (T, H)
                    if T:
                        assert calc_diff(comb.float(), expect) < 1e-5
    # stats: cumulative == sum of recv counts over all dispatches
    total = torch.zeros(E_loc, dtype=torch.int64)
    for j, tk in enumerate(all_topk):
        for e in range(E_loc):
            total[e] += int((tk == rank * E_loc + e).sum())
    assert torch.equal(cumulative.long(), total * 16), (cumulative, total)
    assert (wait_stats >= 0).all() and wait_stats.sum() > 0
    return checked


@pytest.mark.parametrize("backend,world,T,num_max", [
    ("reference", 2, 24, 32), ("reference", 4, 8, 8), ("reference", 2, 0, 4), ("host", 2, 24, 32), ("host", 4, 8, 8)])
def test_ll_dispatch_combine_options(backend, world, T, num_max):
    seed = int(torch.randint(0, 10_000, ()).item())
    run_ranks(_ll_worker, world, backend, seed, T, num_max, timeout_s=300)


def _zero_copy_and_parity_worker(rank, world, backend, seed):
    T, H, E, K = 16, 256, 2 * world, 2
    gen = torch.Generator().manual_seed(seed + rank)
    buf = _make(rank, world, T, H, E, backend)
    _, x, topk, w = _inputs(rank, T, H, E, K, gen, num_masked=2)
    expect = x.float() * torch.where(topk >= 0, w, torch.zeros_like(w)).sum(1, keepdim=True)
    # two dispatches in flight (both buffer parities), combined in order
    r1, _, h1, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    r2, _, h2, _, _ = buf.low_latency_dispatch(x * 2, topk, T, E, use_fp8=False)
    c1, _, _ = buf.low_latency_combine(r1.clone(), topk, w, h1)
    assert calc_diff(c1.float(), expect) < 1e-5
    # zero-copy: write expert outputs into the next combine buffer, pass x only for its shape
    nxt = buf.get_next_low_latency_combine_buffer(h2)
    assert nxt.shape == r2.shape and nxt.dtype == torch.bfloat16
    nxt.copy_(r2)
    c2, _, _ = buf.low_latency_combine(torch.zeros_like(r2), topk, w, h2, zero_copy=True)
    assert calc_diff(c2.float(), expect * 2) < 1e-5
    # clean (needed after normal-mode use) then keep working
    buf.clean_low_latency_buffer(T, H, E)
    r3, _, h3, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    c3, _, _ = buf.low_latency_combine(r3.clone(), topk, w, h3, async_finish=True)
    assert calc_diff(c3.float(), expect) < 1e-5
    return True


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_zero_copy_parity_and_clean(backend, world):
    run_ranks(_zero_copy_and_parity_worker, world, backend, int(torch.randint(0, 10_000, ()).item()), timeout_s=240)


def _mask_worker(rank, world, backend, seed):
    T, H, E, K = 12, 128, 2 * world, 2
    gen = torch.Generator().manual_seed(seed + rank)
    buf = _make(rank, world, T, H, E, backend, enable_shrink=True)
    _, x, topk, w = _inputs(rank, T, H, E, K, gen, num_masked=0)
    E_loc = E // world
    cut = world - 1
    status = torch.full((world,), -7, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    if rank != cut:                       # every other rank cuts the last rank off
        buf.low_latency_update_mask_buffer(cut, mask=True)
        buf.low_latency_query_mask_buffer(status)
        assert status.tolist() == [1 if r == cut else 0 for r in range(world)]
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    all_x, all_topk = _gather(x), _gather(topk)
    buf.low_latency_query_mask_buffer(status)
    if rank == cut:
        # nobody sends to the cut rank; like a DeepEP timeout, it masks them all in turn
        assert status.tolist() == [0 if r == cut else 1 for r in range(world)]
        assert int(count.sum()) == sum(int((tk == e).sum()) for tk in all_topk[cut:]
                                       for e in range(cut * E_loc, (cut + 1) * E_loc))
    else:
        check_ll_dispatch(lambda e, b, n: recv[e, b:b + n], count, handle, all_x, all_topk, rank, E, world,
                          masked={cut})
    comb, _, _ = buf.low_latency_combine(recv.clone(), topk, w, handle)
    owner = torch.where(topk >= 0, topk // E_loc, torch.full_like(topk, -1))
    alive = {cut} if rank == cut else set(range(world)) - {cut}
    keep = (topk >= 0) & torch.isin(owner, torch.tensor(sorted(alive)))
    expect = x.float() * torch.where(keep, w, torch.zeros_like(w)).sum(1, keepdim=True)
    assert calc_diff(comb.float(), expect) < 1e-5
    buf.low_latency_clean_mask_buffer()
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=False)
    check_ll_dispatch(lambda e, b, n: recv[e, b:b + n], count, handle, all_x, all_topk, rank, E, world)
    return True


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_shrink_masking(backend, world):
    run_ranks(_mask_worker, world, backend, int(torch.randint(0, 10_000, ()).item()), timeout_s=240)


def test_fp8_codes_within_one_step():
    """The tolerance the bench holds DeepEP's own FP8 cast to (bench/verify.check_ll): one e4m3 step."""
    from uccl_ep.bench.expect import fp8_codes_within_one_step
    x = torch.randn(64, 256) * 30
    q = per_token_cast_to_fp8(x)[0].view(torch.uint8)
    assert fp8_codes_within_one_step(q, q)
    up = q.clone()
    up[q & 0x7F < 0x7E] += 1                      # one step away from zero, same sign
    assert fp8_codes_within_one_step(up, q)
    two = up.clone()
    two[0, 0] = q[0, 0] + 2 if int(q[0, 0]) & 0x7F < 0x7D else q[0, 0] - 2
    assert not fp8_codes_within_one_step(two, q)
    flipped = q.clone()
    flipped[0, 1] = q[0, 1] ^ 0x80                # another sign: far off unless zero
    assert fp8_codes_within_one_step(flipped, q) == (int(q[0, 1]) & 0x7F == 0)
    zeros = torch.tensor([0x00, 0x80], dtype=torch.uint8)
    assert fp8_codes_within_one_step(zeros, zeros.flip(0))
