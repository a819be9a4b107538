"""Normal-mode (intranode) kernels of the `cuda` backend against `uccl_ep.refs`, on 2+ GPUs.

Rows are ordered by (source rank, source token) in both, so every output is compared bitwise:
layout, recv_x (BF16 and FP8 bytes), scales, local top-k ids and weights, the per-expert list,
the handle's prefix matrices and source indices, num_worst_tokens padding, cached dispatch,
and combine (fp32 sum in rank order, bias none / one / two) with combined weights. Routing:
uniform with -1 entries, everything to one rank, and a rank with zero tokens; SM counts: the
default config and a small one whose 32-slot rings force flow control. [small-ce] / [deepseek-ce]:
the copy-engine combine (Tuning.ht_combine_ce), interleaved with ring combines (num_worst_tokens
handles).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from multirank import run_ranks  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def _routing(kind, T, E, K, R, rank, gen, dev):
    if kind == "skewed":   # every token to experts of rank 0 only
        per = E // R
        idx = torch.stack([torch.randperm(per, generator=gen)[:K] for _ in range(T)]) if T else \
            torch.zeros(0, K, dtype=torch.int64)
    else:
        scores = torch.randn(T, E, generator=gen).abs() + 1
        idx = scores.topk(K, dim=-1).indices
        if T:
            idx[torch.rand(T, K, generator=gen) < 0.05] = -1
    w = torch.rand(T, K, generator=gen)
    return idx.to(dev), w.to(dev)


def _eq(tag, a, b):
    if a is None or b is None:
        assert a is None and b is None, f"{tag}: one side is None"
        return
    a, b = a.cpu(), b.cpu()
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert a.shape == b.shape and a.dtype == b.dtype, f"{tag}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    assert torch.equal(a, b), f"{tag}: differs ({(a.float() - b.float()).abs().max().item() if a.numel() else 0})"


def worker(rank, world, H, T, E, seed, ce=False):
    from uccl_ep import Buffer, Config, Tuning
    # 2: the copy-engine dispatch too; ht_ce_min_mb=0: the copy engines even for these small shapes
    tuning = Tuning(ht_combine_ce=bool(ce), ht_dispatch_ce="1" if ce == 2 else "0", ht_ce_min_mb=0)
    from uccl_ep.refs.fp8 import per_token_cast_to_fp8
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    K = 8
    configs = [Buffer.get_dispatch_config(world), Config(8, 4, 32)]
    nvl = max(c.get_nvl_buffer_size_hint(H * 2, world) for c in configs)
    ours = Buffer(group, nvl, 0, backend="cuda", tuning=tuning)
    ref = Buffer(group, nvl, 0, backend="reference")
    assert ours.backend == "cuda"
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    checked = 0
    for ci, config in enumerate(configs):
        for kind in ("uniform", "skewed", "empty"):
            n_tok = 0 if (kind == "empty" and rank == world - 1) else T
            x = torch.randn(n_tok, H, generator=gen).to(torch.bfloat16).to(dev)
            idx, w = _routing(kind, n_tok, E, K, world, rank, gen, dev)
            lay_o = ours.get_dispatch_layout(idx, E)
            lay_r = ref.get_dispatch_layout(idx, E)
            for a, b, name in zip(lay_o[:4], lay_r[:4], ("ntpr", "ntprr", "ntpe", "in_rank")):
                _eq(f"rank {rank} {kind} layout {name}", a, b)
            q, s = per_token_cast_to_fp8(x)
            s_col = s.t().contiguous().t()   # column-major scales, as DeepEP's tests pass them
            for xin, label in ((x, "bf16"), ((q, s_col), "fp8")):
                for with_topk in (True, False):
                    for worst in (0, world * T):
                        if worst and not with_topk:
                            continue
                        tag = f"rank {rank} cfg {ci} {kind} {label} topk={with_topk} worst={worst}"
                        kw = dict(num_tokens_per_rank=lay_o[0], is_token_in_rank=lay_o[3], num_tokens_per_expert=lay_o[2],
                                  config=config, num_worst_tokens=worst)
                        if with_topk:
                            kw.update(topk_idx=idx, topk_weights=w)
                        prev = ours.capture()
                        go = ours.dispatch(xin, previous_event=prev, async_finish=True, allocate_on_comm_stream=True,
                                           **kw)
                        go[5].current_stream_wait()
                        gr = ref.dispatch(xin, **{k: v for k, v in kw.items()})
                        torch.cuda.synchronize()
                        n = gr[4].plan.num_recv
                        cut = (lambda t: t[:n]) if worst else (lambda t: t)  # noqa: E731
                        if label == "fp8":
                            _eq(tag + " recv_x", cut(go[0][0]), cut(gr[0][0]))
                            _eq(tag + " scales", cut(go[0][1]), cut(gr[0][1]))
                        else:
                            _eq(tag + " recv_x", cut(go[0]), cut(gr[0]))
                        if with_topk:
                            _eq(tag + " topk_idx", go[1], gr[1])       # -1 padding past n included
                            _eq(tag + " topk_w", cut(go[2]), cut(gr[2]))
                        assert go[3] == gr[3], f"{tag}: expert list {go[3]} != {gr[3]}"
                        for i in (0, 1, 2):
                            _eq(f"{tag} handle[{i}]", go[4][i], gr[4][i])
                        _eq(tag + " recv_src_idx", cut(go[4][3]), cut(gr[4][3]))
                        _eq(tag + " send_head sent-mask", go[4][5] >= 0, gr[4][5] >= 0)
                        # cached dispatch reproduces the rows
                        c_o = ours.dispatch(xin, handle=go[4], config=config)
                        torch.cuda.synchronize()
                        _eq(tag + " cached", cut(c_o[0][0] if label == "fp8" else c_o[0]),
                            cut(go[0][0] if label == "fp8" else go[0]))
                        if label != "bf16":
                            continue
                        # combine: same expert outputs (the received rows) on both sides
                        y = go[0]
                        yw = go[2] if with_topk else None
                        b0 = torch.randn(n_tok, H, generator=gen).to(torch.bfloat16).to(dev)
                        b1 = torch.randn(n_tok, H, generator=gen).to(torch.bfloat16).to(dev)
                        # the copy-engine combine takes every handle with host counts (not num_worst_tokens)
                        assert go[4].plan.ce == (ce and not worst), f"{tag}: plan.ce {go[4].plan.ce}"
                        for bias in (None, b0, (b0, b1)):
                            co = ours.combine(y, go[4], topk_weights=yw, bias=bias, config=config)
                            cr = ref.combine(y, gr[4], topk_weights=yw, bias=bias, config=config)
                            torch.cuda.synchronize()
                            _eq(tag + f" combine bias={0 if bias is None else (1 if torch.is_tensor(bias) else 2)}",
                                co[0], cr[0])
                            _eq(tag + " combined weights", co[1], cr[1])
                        checked += 1
    ours._executor.check_error()
    assert ours._executor._ht._k["ht_dispatch"].name == "ht_dispatch"
    assert ours._executor._ht._k["ht_combine"].name == "ht_combine"
    assert (ours._executor._ht.ce._k is not None) == bool(ce), "the copy-engine combine ran iff asked"
    assert (ours._executor._ht.ce.dispatches > 0) == (ce == 2), "the copy-engine dispatch ran iff asked"
    return checked


_SHAPES = {"small": dict(H=2048, T=512, E=64, seed=1), "deepseek": dict(H=7168, T=4096, E=256, seed=2)}


def _cases():
    """[small], [deepseek]: the ring kernels; [small-ce], ...: the copy-engine combine;
    [small-dce], ...: the copy-engine dispatch too."""
    cases = [pytest.param(shape, False, id=shape) for shape in _SHAPES]
    for shape in _SHAPES:  # Tuning.ht_combine_ce: rows back by copy engines, every SM sums
        cases.append(pytest.param(shape, 1, id=f"{shape}-ce"))
    for shape in _SHAPES:  # Tuning.ht_dispatch_ce too: the receivers' copy engines in dispatch
        cases.append(pytest.param(shape, 2, id=f"{shape}-dce"))
    return cases


@pytest.mark.parametrize("shape,ce", _cases())
def test_ht_matches_reference(shape, ce):
    world = min(torch.cuda.device_count(), 8)
    out = run_ranks(worker, world, *_SHAPES[shape].values(), ce, backend="nccl", timeout_s=900)
    assert all(n > 0 for n in out)


def _graph_worker(rank, world, H, T, E, dce):
    """Cached dispatch + copy-engine combine captured in one CUDA graph: every replay (new x, new
    expert outputs) equals the reference; the combine's epochs and chunk flags live on the device,
    so replays stay in step. Then one eager combine after the replays, to show the eager epochs
    continue from the graph's."""
    from uccl_ep import Buffer, Tuning
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    K = 8
    config = Buffer.get_dispatch_config(world)
    nvl = config.get_nvl_buffer_size_hint(H * 2, world)
    tuning = Tuning(ht_combine_ce=True, ht_dispatch_ce="1" if dce else "0", ht_ce_min_mb=0)
    ours = Buffer(group, nvl, 0, backend="cuda", tuning=tuning)
    ref = Buffer(group, nvl, 0, backend="reference")
    gen = torch.Generator().manual_seed(77 + rank)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    idx, w = _routing("uniform", T, E, K, world, rank, gen, dev)
    lay = ours.get_dispatch_layout(idx, E)
    kw = dict(num_tokens_per_rank=lay[0], is_token_in_rank=lay[3], num_tokens_per_expert=lay[2], config=config)
    go = ours.dispatch(x, topk_idx=idx, topk_weights=w, **kw)
    gr = ref.dispatch(x, topk_idx=idx, topk_weights=w, **kw)
    torch.cuda.synchronize()
    assert go[4].plan.ce
    yw = go[2]
    ours.combine(ours.dispatch(x, handle=go[4], config=config)[0], go[4], topk_weights=yw, config=config)  # warm-up
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            recv = ours.dispatch(x, handle=go[4], config=config)[0]
            y = recv * 2  # the "experts": a kernel between dispatch and combine
            out, out_w, _ = ours.combine(y, go[4], topk_weights=yw, config=config)
    torch.cuda.synchronize()
    dist.barrier()
    for it in range(3):
        x.copy_(torch.randn(T, H, generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        r_recv = ref.dispatch(x, handle=gr[4], config=config)[0]
        r_out, r_w, _ = ref.combine(r_recv * 2, gr[4], topk_weights=yw, config=config)
        torch.cuda.synchronize()
        _eq(f"rank {rank} graph replay {it} recv_x", recv, r_recv)
        _eq(f"rank {rank} graph replay {it} combine", out, r_out)
        _eq(f"rank {rank} graph replay {it} combined weights", out_w, r_w)
        dist.barrier()
    e_out, _, _ = ours.combine(recv, go[4], topk_weights=yw, config=config)
    r_out, _, _ = ref.combine(recv, gr[4], topk_weights=yw, config=config)
    torch.cuda.synchronize()
    _eq(f"rank {rank} eager combine after the replays", e_out, r_out)
    ours._executor.check_error()
    return 1


@pytest.mark.parametrize("dce", [False, True], ids=["combine", "dispatch+combine"])
def test_ht_copy_engine_combine_in_a_cuda_graph(dce):
    out = run_ranks(_graph_worker, min(torch.cuda.device_count(), 8), 2048, 512, 64, dce, backend="nccl",
                    timeout_s=300)
    assert all(n == 1 for n in out)


def _mismatch_worker(rank, world):
    from uccl_ep import Buffer, Tuning
    from uccl_ep.errors import InvalidArgument
    try:
        Buffer(dist.group.WORLD, num_nvl_bytes=64 << 20, backend="cuda",
               tuning=Tuning(ht_combine_warps=16 if rank == 0 else 24))
    except InvalidArgument as e:
        assert "the same warps per peer on every rank" in str(e), str(e)
        # NOTES: rank 0 holds the group's store: leaving before the peer has read the exchange that
        # refused it would fail the peer's read with a store error instead of this refusal
        dist.barrier()
        return 1
    return 0


def test_ranks_with_different_block_sizes_are_refused():
    """Ranks whose HT block sizes differ would wait on counters the peer never writes: the Buffer is
    refused on every rank, with each rank's sizes named, instead of a device-wait timeout later."""
    out = run_ranks(_mismatch_worker, min(torch.cuda.device_count(), 8), backend="nccl", timeout_s=300)
    assert all(n == 1 for n in out)


if __name__ == "__main__":
    print(run_ranks(worker, min(torch.cuda.device_count(), 8), 2048, 512, 64, 1, backend="nccl", timeout_s=900))


def _first_combine_worker(rank, world):
    """The first copy-engine combine of a process whose group is gloo (no NCCL set up the peer paths
    before): its copies must not wait for the device while the peer's sum kernel waits for them."""
    os.environ["UCCL_EP_GPU_TIMEOUT_S"] = "5"
    from uccl_ep import Buffer, Tuning
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    T, H, E, K = 64, 2048, 16, 4
    config = Buffer.get_dispatch_config(world)
    ours = Buffer(dist.group.WORLD, config.get_nvl_buffer_size_hint(H * 2, world), 0, backend="cuda",
                  tuning=Tuning(ht_combine_ce=True, ht_ce_min_mb=0))
    gen = torch.Generator().manual_seed(rank + 5)
    x = torch.randn(T, H, generator=gen).bfloat16().to(dev)
    idx = torch.rand(T, E, generator=gen).topk(K, dim=1).indices.to(dev)
    w = torch.rand(T, K, generator=gen).to(dev)
    a, _, c, d, _ = ours.get_dispatch_layout(idx, E)
    rx, _, rw, _, h, _ = ours.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=a, is_token_in_rank=d,
                                       num_tokens_per_expert=c, config=config)
    comb, _, _ = ours.combine(rx, h, topk_weights=rw, config=config)
    torch.cuda.synchronize()
    ours._executor.check_error()
    assert h.plan.ce, "the copy-engine combine was not taken"
    want = (x.float() * d.sum(1, keepdim=True).float()).bfloat16()
    assert torch.allclose(comb.float(), want.float(), rtol=1e-2, atol=1e-2)
    return 1


def test_first_copy_engine_combine_of_a_gloo_process():
    out = run_ranks(_first_combine_worker, min(torch.cuda.device_count(), 8), backend="gloo", timeout_s=300)
    assert all(n == 1 for n in out)
