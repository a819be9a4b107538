"""Normal (HT) mode of the `cuda` backend through the CPU proxy, against `uccl_ep.refs`, on 2+ GPUs of
one host acting as nodes (UCCL_EP_RANKS_PER_NODE=1 / ranks_per_node=1): GPU -> FIFO -> proxy ->
ipc transport (peer copy into the receiver's NVL buffer, then the immediate) -> receiving proxy ->
counter -> kernel (core/kernels/ht/proxy/*.cu, uccl_ep/cuda/ht_proxy.py).

With 4 GPUs also 2 nodes x 2 ranks (ranks_per_node=2: each token crosses to a node once, its rail
rank forwards it inside the node, combine reduces inside the node first; combine inputs on a 1/16
grid so the fp32 sums are exact in both orders). Every option combination is compared bitwise with
the reference run on the same group: layout
(num_tokens_per_rdma_rank included), BF16 and FP8 rows (column-major scales), local top-k ids and
weights, the expert list (alignment 2), every item of DeepEP's 10-tuple internode handle (6-tuple
when UCCL_EP_FORCE_PROXY runs one node through the proxy), num_worst_tokens padding, cached
dispatch, combine (fp32 in rank order) with 0, 1 and 2 biases and combined weights; routing:
uniform with -1 entries, everything to one rank, a rank with zero tokens; configs: DeepEP's table
and a small one whose 8-slot rings force wrap-around and credit waits. Then: previous_event /
async_finish, CUDA-graph capture of cached dispatch + combine, the traffic really crossing the
ipc transport, and a peer that skips an op (bounded device wait -> Timeout naming it).

Skewed routing with num_worst_tokens is in every case. The test runs the reference first and lets
every op finish on every rank before comparing, and reports device errors first: the reference's
collectives between our in-flight ops would stall the ipc stand-in's driver copies.
Run: bash tools/lab/run_device.sh build internode
"""

from __future__ import annotations

import os
import struct
import sys

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from multirank import run_ranks  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

# CUDA_MODULE_LOADING=EAGER: see uccl_ep.cuda.ll_proxy.warn_lazy_module_loading.
EAGER_ENV = {"CUDA_MODULE_LOADING": "EAGER"}
FORCED_ENV = {"UCCL_EP_FORCE_PROXY": "1", **EAGER_ENV}


def _world():
    return min(torch.cuda.device_count(), 8) if torch.cuda.is_available() else 0


def _routing(kind, T, E, K, R, gen, dev):
    if kind == "skewed":   # every token to experts of rank 0 only
        idx = torch.stack([torch.randperm(E // R, generator=gen)[:K] for _ in range(T)]) if T else \
            torch.zeros(0, K, dtype=torch.int64)
    else:
        idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(K, dim=-1).indices
        if T:
            idx[torch.rand(T, K, generator=gen) < 0.05] = -1
    return idx.to(dev), torch.rand(T, K, generator=gen).to(dev)


def _eq(tag, a, b):
    if a is None or b is None:
        assert a is None and b is None, f"{tag}: one side is None"
        return
    a, b = a.cpu(), b.cpu()
    if a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert a.shape == b.shape and a.dtype == b.dtype, f"{tag}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    assert torch.equal(a, b), f"{tag}: differs"


def _pair(group, world, H, mode):
    from uccl_ep import Buffer, Config, Tuning
    configs = [Buffer.get_dispatch_config(world), Config(8, 4, 32, 2, 8)]
    nvl = max(c.get_nvl_buffer_size_hint(H * 2, world) for c in configs)
    kw = {"forced": {}, "rpn1": {"ranks_per_node": 1}, "rpn2": {"ranks_per_node": 2},
          "rpn2proxy": {"ranks_per_node": 2}, "rpn2bf16": {"ranks_per_node": 2}}[mode]
    # rpn2bf16: the nodes' partials cross in BF16 (Tuning.ht_partials_bf16); the combine inputs below
    # (a 1/16 grid, two ranks per node) keep each partial exact in BF16, so still bitwise
    tuning = Tuning(ht_partials_bf16=True) if mode == "rpn2bf16" else None
    ours = Buffer(group, nvl, 0, backend="cuda", tuning=tuning, **kw)
    ref = Buffer(group, nvl, 0, backend="reference", **kw)
    assert ours.backend == "cuda" and ours.topology == ref.topology
    return ours, ref, configs


def _no_device_error(tag, buf):
    """Fails with the device's own error (Timeout naming peer and phase, ...) before any output is
    compared: a timed-out kernel leaves rows that merely look wrong."""
    try:
        buf._executor.check_error()
    except Exception as e:  # noqa: BLE001 - reported with the case
        raise AssertionError(f"{tag}: device error {type(e).__name__}: {e}") from None


def _check_handle(tag, got, want, worst, n):
    assert len(got) == len(want), f"{tag}: handle of {len(got)} items vs {len(want)}"
    for k, (a, b) in enumerate(zip(got, want)):
        if worst and len(got) == 10 and k == 9:  # DeepEP sizes send_nvl_head by num_worst_tokens
            nr = b.shape[0]  # tokens this rank received as its node's forwarder
            _eq(f"{tag} handle[9] padding", a[nr:], torch.full_like(a[nr:], -1))
            a = a[:nr]
        _eq(f"{tag} handle[{k}]", a, b)


def worker(rank, world, H, T, E, seed, mode):
    from uccl_ep.refs.fp8 import per_token_cast_to_fp8
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    ours, ref, configs = _pair(group, world, H, mode)
    quiet = dist.new_group(backend="gloo")

    def settle():
        # NOTES: every op of ours ends on every rank before the host does other CUDA work, and the
        # reference runs before ours: through the ipc stand-in the proxy thread copies with the CUDA
        # driver, and a host thread blocked in the driver behind our kernels (a collective of the
        # reference waiting for the peer, a pageable copy) stalls it until the device timeout, which
        # shows up as wrong rows (docs/troubleshooting.md). The barrier makes no CUDA call (gloo).
        torch.cuda.synchronize()
        dist.barrier(group=quiet)

    gen = torch.Generator().manual_seed(seed * 100 + rank)
    K, checked = 8, 0
    for ci, config in enumerate(configs):
        for kind in ("uniform", "skewed", "empty"):
            n_tok = 0 if (kind == "empty" and rank == world - 1) else T
            x = torch.randn(n_tok, H, generator=gen).to(torch.bfloat16).to(dev)
            idx, w = _routing(kind, n_tok, E, K, world, gen, dev)
            lay_r = ref.get_dispatch_layout(idx, E)
            settle()
            lay_o = ours.get_dispatch_layout(idx, E)
            settle()
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
                        kw = dict(num_tokens_per_rank=lay_o[0], num_tokens_per_rdma_rank=lay_o[1],
                                  is_token_in_rank=lay_o[3], num_tokens_per_expert=lay_o[2], config=config,
                                  num_worst_tokens=worst, expert_alignment=2)
                        if with_topk:
                            kw.update(topk_idx=idx, topk_weights=w)
                        gr = ref.dispatch(xin, **kw)
                        settle()
                        prev = ours.capture()
                        go = ours.dispatch(xin, previous_event=prev, async_finish=True, allocate_on_comm_stream=True,
                                           **kw)
                        go[5].current_stream_wait()
                        settle()
                        _no_device_error(tag + " dispatch", ours)
                        n = gr[4].plan.num_recv
                        cut = (lambda t: t[:n]) if worst else (lambda t: t)  # noqa: E731
                        if label == "fp8":
                            _eq(tag + " recv_x", cut(go[0][0]), cut(gr[0][0]))
                            _eq(tag + " scales", cut(go[0][1]), cut(gr[0][1]))
                        else:
                            _eq(tag + " recv_x", cut(go[0]), cut(gr[0]))
                        _eq(tag + " topk_idx", go[1], gr[1])   # -1 padding past n included
                        _eq(tag + " topk_w", go[2], gr[2])
                        assert go[3] == gr[3], f"{tag}: expert list {go[3]} != {gr[3]}"
                        _check_handle(tag, go[4], gr[4], worst, n)
                        c_r = ref.dispatch(xin, handle=gr[4], config=config)
                        settle()
                        c_o = ours.dispatch(xin, handle=go[4], config=config)
                        settle()
                        _no_device_error(tag + " cached dispatch", ours)
                        _eq(tag + " cached", cut(c_o[0][0] if label == "fp8" else c_o[0]),
                            cut(c_r[0][0] if label == "fp8" else c_r[0]))
                        if label != "bf16":
                            continue
                        y = go[0]
                        yw = go[2] if with_topk else None
                        b0 = torch.randn(n_tok, H, generator=gen).to(torch.bfloat16).to(dev)
                        b1 = torch.randn(n_tok, H, generator=gen).to(torch.bfloat16).to(dev)
                        if mode.startswith("rpn2"):
                            # NOTES: the node-first fp32 reduce differs from the reference's flat order
                            # unless the sums are exact: values on a 1/16 grid (dispatch weights are
                            # exact already: one non-zero rank per slot).
                            y = (torch.randint(-64, 64, tuple(y.shape), generator=gen) / 16).to(torch.bfloat16).to(dev)
                            b0 = (torch.randint(-64, 64, (n_tok, H), generator=gen) / 16).to(torch.bfloat16).to(dev)
                            b1 = torch.ones(n_tok, H, dtype=torch.bfloat16, device=dev)
                        for nb, bias in enumerate((None, b0, (b0, b1))):
                            cr = ref.combine(y, gr[4], topk_weights=yw, bias=bias, config=config)
                            settle()
                            co = ours.combine(y, go[4], topk_weights=yw, bias=bias, config=config)
                            settle()
                            _no_device_error(tag + f" combine bias={nb}", ours)
                            _eq(tag + f" combine bias={nb}", co[0], cr[0])
                            _eq(tag + f" combined weights bias={nb}", co[1], cr[1])
                        checked += 1
    ours._executor.check_error()
    eng = ours._executor._ht
    counters = eng.transport_counters()
    kind = eng.proxy.transport_name.split(":")[-1]  # ipc:kernel (the kernels' copy role) or ipc:cuda
    out = (checked, eng.proxy.transport_name, int(counters.get(f"ipc_{kind}_copies", 0)), eng.mates is not None)
    dist.barrier()
    return out


def worker_graph(rank, world, H, T, E, seed, mode):
    """Cached dispatch + combine captured in one CUDA graph; replays match eager calls."""
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    ours, _, configs = _pair(group, world, H, mode)
    gen = torch.Generator().manual_seed(seed * 7 + rank)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
    idx, w = _routing("uniform", T, E, 8, world, gen, dev)
    lay = ours.get_dispatch_layout(idx, E)
    recv, _, rw, _, handle, _ = ours.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=lay[0],
                                              num_tokens_per_rdma_rank=lay[1], is_token_in_rank=lay[3],
                                              num_tokens_per_expert=lay[2], config=configs[0])
    eager_x = ours.dispatch(x, handle=handle, config=configs[0])[0]
    eager_c = ours.combine(recv, handle, topk_weights=rw, config=configs[0])[0]
    torch.cuda.synchronize()
    dist.barrier()
    # back to back, no host sync: same-geometry ops skip the start-of-op handshake (a peer may still
    # be in the previous op while this rank's Writes land)
    outs = []
    for i in range(6):
        outs.append(ours.dispatch(x, handle=handle, config=configs[0])[0] if i % 3 < 2 else
                    ours.combine(recv, handle, topk_weights=rw, config=configs[0])[0])
    torch.cuda.synchronize()
    for i, o in enumerate(outs):
        _eq(f"rank {rank} back-to-back op {i}", o, eager_x if i % 3 < 2 else eager_c)
    dist.barrier()
    if mode == "rpn1":
        # the device's count of handshakes and exchanges (HTProxyState.op): three cached dispatches
        # in a row after a combine of another message size handshake once, not three times
        eng = ours._executor._ht

        def ops_started():
            torch.cuda.synchronize()
            return struct.unpack("<I", eng.drv.memcpy_dtoh(eng.dev, eng.state.ptr, 4))[0]
        before = ops_started()
        for _ in range(3):
            ours.dispatch(x, handle=handle, config=configs[0])
        assert ops_started() - before == 1, (before, ops_started())
        dist.barrier()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        gx = ours.dispatch(x, handle=handle, config=configs[0])[0]
        gc = ours.combine(recv, handle, topk_weights=rw, config=configs[0])[0]
    torch.cuda.synchronize()
    dist.barrier()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        _eq(f"rank {rank} graph cached dispatch", gx, eager_x)
        _eq(f"rank {rank} graph combine", gc, eager_c)
    ours._executor.check_error()
    dist.barrier()
    return True


def worker_timeout(rank, world, H, T, E, seed, mode):
    """A peer that skips a cached dispatch: the waiting rank's kernel gives up, the host raises Timeout."""
    from uccl_ep import Buffer
    from uccl_ep.errors import Timeout
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    cfg = Buffer.get_dispatch_config(world)
    buf = Buffer(group, cfg.get_nvl_buffer_size_hint(H * 2, world), 0, backend="cuda",
                 ranks_per_node=2 if mode == "rpn2" else 1, gpu_timeout_s=1.0)
    x = torch.randn(T, H, device=dev).to(torch.bfloat16)
    idx, w = _routing("uniform", T, E, 8, world, torch.Generator().manual_seed(seed + rank), dev)
    lay = buf.get_dispatch_layout(idx, E)
    handle = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=lay[0],
                          num_tokens_per_rdma_rank=lay[1], is_token_in_rank=lay[3], num_tokens_per_expert=lay[2])[4]
    torch.cuda.synchronize()
    dist.barrier()
    outcome = None
    if rank == 0:
        buf.dispatch(x, handle=handle)
        torch.cuda.synchronize()
        try:
            buf._executor.check_error()
        except Timeout as e:
            outcome = (e.peer, e.phase)
        assert outcome is not None, "no Timeout after a peer skipped the op"
        assert outcome[0] in range(1, world) and outcome[1].startswith("ht_"), outcome
        with pytest.raises(Timeout):   # sticky
            buf.dispatch(x, handle=handle)
    dist.barrier()
    return outcome


SMALL = dict(H=2048, T=512, E=64, seed=1)
BIG = dict(H=7168, T=4096, E=256, seed=2)


@pytest.mark.parametrize("copy", ["kernel", "cuda"])
@pytest.mark.parametrize("mode", ["rpn1", "forced", "rpn2", "rpn2proxy", "rpn2bf16"])
@pytest.mark.parametrize("shape", [SMALL, BIG], ids=["small", "deepseek"])
def test_ht_internode_matches_reference(shape, mode, copy):
    """Every option against the reference, the Writes copied by the kernels' copy role (UCCL_EP_IPC_COPY=
    kernel, the default) or by the proxy through the driver (cuda). rpn2: 2 nodes x 2 ranks, the node
    mates' hop (dispatch hop 2, combine hop A) over NVLink; rpn2proxy: the same through the proxy
    (UCCL_EP_FORCE_PROXY); rpn2bf16: rpn2 with the nodes' partials in BF16 (Tuning.ht_partials_bf16)."""
    if mode.startswith("rpn2") and _world() < 4:
        pytest.skip("2 nodes x 2 ranks (per-node dedup, forwarding) needs 4 GPUs")
    world = _world() // 2 * 2 if mode.startswith("rpn2") else _world()
    env = dict(FORCED_ENV if mode in ("forced", "rpn2proxy") else EAGER_ENV, UCCL_EP_IPC_COPY=copy)
    out = run_ranks(worker, world, *shape.values(), mode, backend="nccl", timeout_s=900, env=env)
    for checked, transport, copies, mates in out:
        assert checked > 0 and transport == f"ipc:{copy}" and copies > 0
        assert mates == (mode in ("rpn2", "rpn2bf16")), (mode, mates)


@pytest.mark.parametrize("mode", ["rpn1", "rpn2"])
def test_ht_internode_cuda_graph(mode):
    if mode == "rpn2" and _world() < 4:
        pytest.skip("needs 4 GPUs")
    run_ranks(worker_graph, _world() // 2 * 2, *SMALL.values(), mode, backend="nccl", timeout_s=300, env=EAGER_ENV)


@pytest.mark.parametrize("mode", ["rpn1", "rpn2"])
def test_ht_internode_device_wait_timeout(mode):
    """rpn2: the waits on the node mate's NVLink words (hop 2) and on the other node's proxy counters
    both end in a Timeout naming a peer."""
    if mode == "rpn2" and _world() < 4:
        pytest.skip("needs 4 GPUs")
    world = _world() // 2 * 2 if mode == "rpn2" else _world()
    out = run_ranks(worker_timeout, world, *SMALL.values(), mode, backend="nccl", timeout_s=300, env=EAGER_ENV)
    print("timeout outcome:", out[0])


if __name__ == "__main__":
    shape = SMALL if sys.argv[1:] == ["small"] else BIG
    print(run_ranks(worker, _world(), *shape.values(), "rpn1", backend="nccl", timeout_s=900, env=EAGER_ENV))
