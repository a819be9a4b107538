"""Low-latency kernels of the `cuda` backend against `uccl_ep.refs`, on 2+ GPUs.

Every option combination is compared with the reference executor on the same fresh random
inputs: our kernels order slab segments by source rank and rows by token, as the reference does,
so the valid rows, scales, src_info, layout_range and counts must be bitwise equal, and so must
the combined output (one IEEE fp32 multiply-add per top-k entry, k ascending). Also: both buffer
parities, -1 routing, fewer tokens than the maximum, masking, CUDA-graph capture and replay, and
the bounded device wait (a peer that never dispatches makes the caller raise Timeout), and inputs
overwritten as soon as a call returns.

Run directly on a GPU machine: python core/tests/gpu/test_cuda_ll.py
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from multirank import run_ranks  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def _routing(T, E, K, gen, device, num_neg=10):
    scores = torch.randn(T, E, generator=gen).abs() + 1
    idx = scores.topk(K, dim=-1, sorted=True).indices
    if T > 0:
        for _ in range(num_neg):
            idx[torch.randint(0, T, (1,), generator=gen), torch.randint(0, K, (1,), generator=gen)] = -1
    w = torch.randn(T, K, generator=gen).abs()
    return idx.to(device), w.to(device)


def _valid_rows(t, counts):
    return [t[e, :int(c)] for e, c in enumerate(counts.tolist())]


def _assert_same_dispatch(tag, got, ref, use_fp8):
    (gx, gc, gh), (rx, rc, rh) = got, ref
    assert torch.equal(gc.cpu(), rc.cpu()), f"{tag}: recv_count {gc.tolist()} != {rc.tolist()}"
    # NOTES: where a source sent nothing, the begin half of layout_range is unspecified (DeepEP
    # packs whatever its counter held); counts must match everywhere, begins where count > 0.
    g_lr, r_lr = gh[1].cpu(), rh[1].cpu()
    g_cnt, r_cnt = g_lr & 0xFFFFFFFF, r_lr & 0xFFFFFFFF
    assert torch.equal(g_cnt, r_cnt), f"{tag}: layout_range counts differ"
    nz = r_cnt > 0
    assert torch.equal((g_lr >> 32)[nz], (r_lr >> 32)[nz]), f"{tag}: layout_range begins differ"
    for e, (a, b) in enumerate(zip(_valid_rows(gh[0], gc), _valid_rows(rh[0], rc))):
        assert torch.equal(a.cpu(), b.cpu()), f"{tag}: src_info differs at expert {e}"
    if use_fp8:
        gq, gs = gx
        rq, rs = rx
        assert gs.dtype == rs.dtype and gs.shape == rs.shape and gs.stride() == rs.stride(), \
            f"{tag}: scales layout {gs.shape}/{gs.stride()} vs {rs.shape}/{rs.stride()}"
        for e, c in enumerate(gc.tolist()):
            assert torch.equal(gq[e, :c].view(torch.uint8).cpu(), rq[e, :c].view(torch.uint8).cpu()), \
                f"{tag}: fp8 rows differ at expert {e}"
            assert torch.equal(gs[e, :c].cpu(), rs[e, :c].cpu()), f"{tag}: scales differ at expert {e}"
    else:
        for e, c in enumerate(gc.tolist()):
            assert torch.equal(gx[e, :c].cpu(), rx[e, :c].cpu()), f"{tag}: bf16 rows differ at expert {e}"


def _assert_matches_reference(tag, ref, got_dispatch, got_out, x, topk_idx, topk_w, y, T_max, E):
    """FP8 dispatch of x and combine of y on the reference Buffer `ref` against what ours returned."""
    rx, rc, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
    _assert_same_dispatch(tag, got_dispatch, (rx, rc, rh), True)
    want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
    torch.cuda.synchronize()
    assert torch.equal(got_out.cpu(), want.cpu()), f"{tag}: combine differs"


def _ll_pair(group, T_max, H, E, **kw):
    from uccl_ep import Buffer
    R = dist.get_world_size(group)
    nbytes = Buffer.get_low_latency_rdma_size_hint(T_max, H, R, E)
    ours = Buffer(group, 0, nbytes, low_latency_mode=True, num_qps_per_rank=E // R, backend="cuda", **kw)
    ref = Buffer(group, 0, nbytes, low_latency_mode=True, num_qps_per_rank=E // R, backend="reference", **kw)
    assert ours.backend == "cuda"
    return ours, ref


def _device_error(buf) -> str:
    """The buffer's device/proxy error as text ("none" when there is none)."""
    try:
        buf._executor.check_error()
        return "none"
    except Exception as e:  # noqa: BLE001 - a diagnostic
        return f"{type(e).__name__}: {e}"


def _proxy_state(buf) -> str:
    """Proxy path only: transport counters, receiver counters of the four (set, phase) pairs per
    source, and the kernels' rounds words -- what a lost signal leaves behind."""
    import ctypes
    eng = buf._executor._ll
    if eng is None or not hasattr(eng, "proxy") or eng.proxy is None:
        return "(not the proxy path)"
    from uccl_ep.cuda.ll_proxy import NUM_COUNTERS, counter_base
    addr, _ = eng.C.proxy_counters_address(eng.proxy)
    R = eng.R
    vals = (ctypes.c_int64 * (R * NUM_COUNTERS)).from_address(addr)
    parts = [f"transport {dict(eng.proxy.transport_counters())}"]
    for s in (0, 1):
        for ph in (0, 1):
            c = counter_base(s, ph)
            rounds = eng.drv.memcpy_dtoh(eng.dev, eng._rounds(s, ph), 8 * R)
            parts.append(f"set {s} phase {ph}: counters {[vals[j * NUM_COUNTERS + c] for j in range(R)]} "
                         f"rounds {list(memoryview(rounds).cast('q'))}")
    return "; ".join(parts)


def worker_options(rank, world, H, E, T_max, seed):
    """Every option combination vs the reference; returns the number of cases checked."""
    torch.manual_seed(seed + rank)
    group = dist.group.WORLD
    ours, ref = _ll_pair(group, T_max, H, E)
    quiet = dist.new_group(backend="gloo")  # a barrier that makes no CUDA call (see NOTES below)
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    K, R = 8, world
    E_loc = E // R
    cases = 0
    combos = [(fp8, rs, ue, hook, asy) for fp8, rs, ue, hook, asy in itertools.product(
        (False, True), (False, True), (False, True), (False, True), (False, True))
        if (fp8 or not rs) and (rs or not ue) and not (hook and asy)]
    for i, (use_fp8, round_scale, use_ue8m0, hook, async_finish) in enumerate(combos):
        T = T_max if i % 3 else max(1, T_max - 37 - rank)   # fewer tokens than the maximum sometimes
        x = (torch.randn(T, H, generator=gen) * 3).to(torch.bfloat16).to(dev)
        topk_idx, topk_w = _routing(T, E, K, gen, dev)
        stats_o = torch.zeros(E_loc, dtype=torch.int32, device=dev)
        stats_r = torch.zeros(E_loc, dtype=torch.int32, device=dev)
        wait_o = torch.zeros(R, dtype=torch.int64, device=dev)
        kw = dict(use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0)
        # NOTES: the reference runs first, and nothing else runs on the host while an op of ours is
        # in flight: on the proxy path between GPUs of one host (ipc transport) the proxy thread
        # submits the copies through the CUDA driver, and a host thread blocked in the driver
        # behind our kernels (a pageable copy, a collective waiting for the peer) stalls it until
        # the device timeout (docs/troubleshooting.md). Real NIC transports make no CUDA calls.
        # Hence: reference first, then ours, synchronize, and a CPU barrier before the host goes on.
        rx, rc, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T_max, E, cumulative_local_expert_recv_stats=stats_r,
                                                   **kw)
        torch.cuda.synchronize()
        gx, gc, gh, ev, h = ours.low_latency_dispatch(x, topk_idx, T_max, E, cumulative_local_expert_recv_stats=stats_o,
                                                      dispatch_wait_recv_cost_stats=wait_o, async_finish=async_finish,
                                                      return_recv_hook=hook, **kw)
        if hook:
            h()
        if async_finish:
            ev.current_stream_wait()
        torch.cuda.synchronize()
        dist.barrier(group=quiet)
        tag = f"rank {rank} case {i} fp8={use_fp8} rs={round_scale} ue8m0={use_ue8m0} hook={hook} async={async_finish} T={T}"
        try:
            _assert_same_dispatch(tag, (gx, gc, gh), (rx, rc, rh), use_fp8)
        except AssertionError as e:  # say what the device reported, if anything
            raise AssertionError(f"{e}; device error: {_device_error(ours)}") from None
        assert torch.equal(stats_o, stats_r), f"{tag}: cumulative stats differ"
        assert int(wait_o.sum()) > 0, f"{tag}: wait stats not accumulated"
        # Combine with the same expert outputs on both.
        y = (torch.randn(E_loc, R * T_max, H, generator=gen)).to(torch.bfloat16).to(dev)
        for zero_copy, use_out in ((False, False), (True, True), (False, True)):
            poison = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=dev) if use_out else None
            cwait = torch.zeros(R, dtype=torch.int64, device=dev)
            want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
            torch.cuda.synchronize()
            if zero_copy:
                ours.get_next_low_latency_combine_buffer(gh).copy_(y)
            got, cev, ch = ours.low_latency_combine(y, topk_idx, topk_w, gh, zero_copy=zero_copy, out=poison,
                                                    return_recv_hook=hook, async_finish=async_finish,
                                                    combine_wait_recv_cost_stats=cwait)
            if hook:
                ch()
            if async_finish:
                cev.current_stream_wait()
            torch.cuda.synchronize()
            dist.barrier(group=quiet)
            if use_out:
                assert got.data_ptr() == poison.data_ptr(), f"{tag}: out= not used"
            same = torch.equal(got.cpu(), want.cpu())
            any_bad = torch.tensor([0 if same else 1], device=dev)
            dist.all_reduce(any_bad)  # collective: every rank repeats the op when one rank differs
            if int(any_bad.item()):
                bad = (got != want).any(1).nonzero().flatten().tolist()
                error = _device_error(ours)
                print(f"{tag} zero_copy={zero_copy}: {len(bad)} tokens differ; device error: {error}; "
                      f"proxy: {_proxy_state(ours)}", flush=True)
                again = []  # a race or a rule? run the same combine again and compare
                for _ in range(3 if error == "none" else 0):
                    g2, _, ch2 = ours.low_latency_combine(y, topk_idx, topk_w, gh, return_recv_hook=True)
                    ch2()
                    torch.cuda.synchronize()
                    again.append(int((g2 != want).any(1).sum()))
                raise AssertionError(
                    f"{tag} zero_copy={zero_copy}: combine differs (max {(got.float() - want.float()).abs().max().item()})"
                    f" on {len(bad)} of {T} tokens, first {bad[:6]} (topk {topk_idx[bad[:2]].tolist()}); "
                    f"differing tokens when repeated: {again}; device error: {error}")
            assert int(cwait.sum()) > 0
            cases += 1
    ours._executor.check_error()
    return cases


def worker_mask_clean(rank, world, H, E, T_max, seed):
    """Rank masking (shrink APIs) and clean_low_latency_buffer, vs the reference.

    Every rank masks the last rank, which then takes no part in the cuda backend's ops (as a
    failed rank would not); it still joins the reference's collectives, whose results for the
    other ranks ignore it the same way."""
    group = dist.group.WORLD
    ours, ref = _ll_pair(group, T_max, H, E, enable_shrink=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed * 7 + rank)
    victim = world - 1
    ours.clean_low_latency_buffer(T_max, H, E)   # collective: fixes the layout on every rank
    for b in (ours, ref):
        b.low_latency_update_mask_buffer(victim, mask=True)
    for it in range(3):
        if it == 1:
            ours.clean_low_latency_buffer(T_max, H, E)
        x = torch.randn(T_max, H, generator=gen).to(torch.bfloat16).to(dev)
        topk_idx, topk_w = _routing(T_max, E, 8, gen, dev)
        y = torch.randn(E // world, world * T_max, H, generator=gen).to(torch.bfloat16).to(dev)
        want = ref.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)[:3]
        c_want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, want[2])
        if rank == victim:
            continue
        got = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)[:3]
        c_got, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, got[2])
        torch.cuda.synchronize()
        _assert_same_dispatch(f"rank {rank} masked it {it}", got, want, True)
        assert torch.equal(c_got.cpu(), c_want.cpu()), f"rank {rank}: masked combine differs"
    status = torch.zeros(world, dtype=torch.int32, device=dev)
    ours.low_latency_query_mask_buffer(status)
    # the victim masked itself; at its clean_low_latency_buffer it found every other rank leaving it
    # out, and masked them in turn (DeepEP's shrink barrier: a peer that does not answer is masked)
    want = [1] * world if rank == victim else [1 if r == victim else 0 for r in range(world)]
    assert status.tolist() == want, (rank, status.tolist())
    dist.barrier()
    return True


def worker_graph(rank, world, H, E, T_max, seed):
    """Capture dispatch + combine in a CUDA graph; replays with new inputs match the reference."""
    group = dist.group.WORLD
    ours, ref = _ll_pair(group, T_max, H, E)
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed * 11 + rank)
    K, R = 8, world
    x = torch.randn(T_max, H, generator=gen).to(torch.bfloat16).to(dev)
    topk_idx, topk_w = _routing(T_max, E, K, gen, dev)
    y = torch.randn(E // R, R * T_max, H, generator=gen).to(torch.bfloat16).to(dev)
    # Warm up (compiles, fixes the layout) outside the capture.
    (q, s), cnt, h, _, _ = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
    ours.low_latency_combine(y, topk_idx, topk_w, h)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            (gq, gs), gcnt, gh, _, _ = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
            gout, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, gh)
    torch.cuda.synchronize()
    dist.barrier()
    for it in range(3):
        x.copy_(torch.randn(T_max, H, generator=gen).to(torch.bfloat16))
        new_idx, new_w = _routing(T_max, E, K, gen, dev)
        topk_idx.copy_(new_idx)
        topk_w.copy_(new_w)
        y.copy_(torch.randn(E // R, R * T_max, H, generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _assert_matches_reference(f"rank {rank} graph replay {it}", ref, ((gq, gs), gcnt, gh), gout, x, topk_idx,
                                  topk_w, y, T_max, E)
        dist.barrier()
    ours._executor.check_error()
    return True


def worker_input_reuse(rank, world, H, E, T_max, seed):
    """The caller may overwrite an op's input right after the call returns (on the same stream,
    no synchronize): the receive kernel overlaps the send kernel (Tuning.ll_pdl), so what it
    returns must not complete before the send kernel has read the input. NaN poison in x / y
    would reach the peer's outputs if it did."""
    group = dist.group.WORLD
    ours, ref = _ll_pair(group, T_max, H, E)
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed * 13 + rank)
    K, R = 8, world
    for it in range(6):
        x = torch.randn(T_max, H, generator=gen).to(torch.bfloat16).to(dev)
        topk_idx, topk_w = _routing(T_max, E, K, gen, dev)
        y = torch.randn(E // R, R * T_max, H, generator=gen).to(torch.bfloat16).to(dev)
        x_keep, y_keep = x.clone(), y.clone()
        dist.barrier()
        (q, sc), cnt, h, _, _ = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
        x.fill_(float("nan"))
        out, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, h)
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        _assert_matches_reference(f"rank {rank} reuse {it}", ref, ((q, sc), cnt, h), out, x_keep, topk_idx, topk_w,
                                  y_keep, T_max, E)
        dist.barrier()
    ours._executor.check_error()
    return True


def worker_timeout(rank, world, H, E, T_max, seed):
    """A peer that never dispatches: the waiting rank's kernel gives up and the host raises Timeout."""
    from uccl_ep import Buffer
    from uccl_ep.errors import Timeout
    group = dist.group.WORLD
    nbytes = Buffer.get_low_latency_rdma_size_hint(T_max, H, world, E)
    buf = Buffer(group, 0, nbytes, low_latency_mode=True, backend="cuda", gpu_timeout_s=1.0)
    dev = torch.device("cuda", torch.cuda.current_device())
    buf.clean_low_latency_buffer(T_max, H, E)
    outcome = None
    if rank == 0:
        x = torch.randn(T_max, H, device=dev).to(torch.bfloat16)
        topk_idx, _ = _routing(T_max, E, 8, torch.Generator().manual_seed(seed), dev, num_neg=0)
        buf.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
        torch.cuda.synchronize()
        try:
            buf._executor.check_error()
        except Timeout as e:
            outcome = (e.peer, e.phase, str(e))
        assert outcome is not None, "no Timeout after a peer skipped the dispatch"
        assert outcome[0] in range(1, world) and outcome[1] == "ll_dispatch_recv", outcome
        with pytest.raises(Timeout):   # sticky
            buf.low_latency_dispatch(x, topk_idx, T_max, E)
    dist.barrier()
    return outcome


def worker_logfmt(rank, world, H, E, T_max, seed):
    """use_logfmt=True: our combine equals the reference's LogFMT combine bit for bit (same encode,
    decode and sum, refs.logfmt), and is within DeepEP's tolerance (calc_diff < 9e-4 after an FP8
    dispatch) of the BF16 combine and of x * sum(w); eagerly, with a receive hook, and replayed
    from a CUDA graph with new inputs."""
    from uccl_ep.utils import calc_diff
    group = dist.group.WORLD
    ours, ref = _ll_pair(group, T_max, H, E)
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(seed * 13 + rank)
    K, R = 8, world
    topk_idx, topk_w = _routing(T_max, E, K, gen, dev)
    w_sum = topk_w.masked_fill(topk_idx < 0, 0).sum(1, keepdim=True)

    def dequant(recv):
        q, sc = recv
        return (q.float() * sc.repeat_interleave(128, dim=2)).to(torch.bfloat16)

    def check(tag, x, y, got, handle_ref, from_dispatch):
        want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, handle_ref, use_logfmt=True)
        bf16, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, handle_ref)
        torch.cuda.synchronize()
        diff = (got.float() - want.float()).abs().max().item()
        assert torch.equal(got.cpu(), want.cpu()), f"{tag}: LogFMT combine differs from the reference (max {diff})"
        assert not bool(torch.isnan(got).any()), f"{tag}: NaN"
        assert calc_diff(bf16.float(), got.float()) < 9e-4, f"{tag}: {calc_diff(bf16.float(), got.float())} vs BF16"
        if from_dispatch:  # DeepEP's own check: the combined rows against x * sum(w)
            assert calc_diff((x.float() * w_sum), got.float()) < 9e-4, f"{tag}: {calc_diff(x.float() * w_sum, got)}"

    cases = 0
    inputs = {"randn*0.1": (torch.randn(T_max, H, generator=gen) * 0.1).to(torch.bfloat16),
              "4*randn": (torch.randn(T_max, H, generator=gen) * 4).to(torch.bfloat16),  # mostly BF16 fallback
              "rank-128": torch.full((T_max, H), float(rank - 128), dtype=torch.bfloat16)}
    for name, x in inputs.items():
        x = x.to(dev)
        for hook_mode in (False, True):
            recv, _, h, _, hook = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True,
                                                          return_recv_hook=hook_mode)
            if hook_mode:
                hook()
            _, _, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
            y = dequant(recv)  # what an expert returns unchanged: the dispatched rows
            got, _, chook = ours.low_latency_combine(y, topk_idx, topk_w, h, use_logfmt=True,
                                                     return_recv_hook=hook_mode)
            if hook_mode:
                chook()
            check(f"rank {rank} {name} hook={hook_mode}", x, y, got, rh, name != "4*randn")  # DeepEP's inputs
            # mixed rows: small values, zeros, and divisions with a value >= 1 side by side
            y2 = (torch.randn(y.shape, generator=gen) * 0.05).to(torch.bfloat16).to(dev)
            y2[..., :64] = 0
            y2[..., 300] = 3.0
            got2, _, _ = ours.low_latency_combine(y2, topk_idx, topk_w, h, use_logfmt=True)
            check(f"rank {rank} {name} mixed", x, y2, got2, rh, False)
            cases += 2
    # BF16 combine after LogFMT combine on the same buffer still matches the reference bit for bit
    _, _, h, _, _ = ours.low_latency_dispatch(inputs["randn*0.1"].to(dev), topk_idx, T_max, E, use_fp8=True)
    _, _, rh, _, _ = ref.low_latency_dispatch(inputs["randn*0.1"].to(dev), topk_idx, T_max, E, use_fp8=True)
    y = (torch.randn(E // R, R * T_max, H, generator=gen) * 0.1).to(torch.bfloat16).to(dev)
    got, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, h)
    want, _, _ = ref.low_latency_combine(y, topk_idx, topk_w, rh)
    torch.cuda.synchronize()
    assert torch.equal(got.cpu(), want.cpu()), f"rank {rank}: BF16 combine after LogFMT differs"

    # CUDA graph: dispatch + LogFMT combine captured, replayed with new inputs
    x = inputs["randn*0.1"].to(dev)
    y = y.clone()
    _, _, h, _, _ = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
    ours.low_latency_combine(y, topk_idx, topk_w, h, use_logfmt=True)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            _, _, gh, _, _ = ours.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
            gout, _, _ = ours.low_latency_combine(y, topk_idx, topk_w, gh, use_logfmt=True)
    torch.cuda.synchronize()
    dist.barrier()
    for it in range(3):
        x.copy_((torch.randn(T_max, H, generator=gen) * 0.1).to(torch.bfloat16))
        new_idx, new_w = _routing(T_max, E, K, gen, dev)
        topk_idx.copy_(new_idx)
        topk_w.copy_(new_w)
        w_sum = topk_w.masked_fill(topk_idx < 0, 0).sum(1, keepdim=True)
        y.copy_((torch.randn(E // R, R * T_max, H, generator=gen) * 0.1).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _, _, rh, _, _ = ref.low_latency_dispatch(x, topk_idx, T_max, E, use_fp8=True)
        check(f"rank {rank} graph replay {it}", x, y, gout, rh, False)
        dist.barrier()
        cases += 1
    ours._executor.check_error()
    return cases


SMALL = dict(H=2048, E=32, T_max=64, seed=1)
BIG = dict(H=7168, E=288, T_max=128, seed=2)


def _world():
    return min(torch.cuda.device_count(), 8) if torch.cuda.is_available() else 0


@pytest.mark.parametrize("shape", [SMALL, BIG], ids=["small", "deepseek"])
def test_ll_options_match_reference(shape):
    out = run_ranks(worker_options, _world(), *shape.values(), backend="nccl", timeout_s=600)
    assert all(n > 0 for n in out)


def test_ll_mask_and_clean():
    run_ranks(worker_mask_clean, _world(), *SMALL.values(), backend="nccl", timeout_s=300)


def test_ll_cuda_graph_capture():
    run_ranks(worker_graph, _world(), *BIG.values(), backend="nccl", timeout_s=300)


def test_ll_input_overwritten_after_return():
    run_ranks(worker_input_reuse, _world(), *BIG.values(), backend="nccl", timeout_s=300)


@pytest.mark.parametrize("shape", [SMALL, BIG], ids=["small", "deepseek"])
def test_ll_logfmt_combine(shape):
    out = run_ranks(worker_logfmt, _world(), *shape.values(), backend="nccl", timeout_s=600)
    assert all(n > 0 for n in out)


def test_ll_device_wait_timeout():
    out = run_ranks(worker_timeout, _world(), *SMALL.values(), backend="nccl", timeout_s=300)
    print("timeout outcome:", out[0])


if __name__ == "__main__":
    plan = [(worker_options, SMALL)] if sys.argv[1:] == ["small"] else \
        [(worker_options, SMALL), (worker_options, BIG), (worker_graph, BIG), (worker_timeout, SMALL)]
    for fn, shape in plan:
        print(fn.__name__, run_ranks(fn, _world(), *shape.values(), backend="nccl", timeout_s=600))
