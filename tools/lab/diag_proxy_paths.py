"""Diagnostics for the two proxy paths of the cuda backend (not a test: prints what differs and how).

  ll   LL through the proxy (allow_nvlink_for_low_latency_mode=False): dispatch FP8, dispatch BF16,
       combine -- in lock step (sync + barrier between ops) and back to back (as the bench runs
       them) -- each op compared with the reference; per expert and source what differs.
  ht   HT internode through the proxy (ranks_per_node=1): a few dispatch/combine cases, each output
       compared with the reference; mismatching rows mapped to the reference row they equal.

Run (repo root, 2+ GPUs): python tools/lab/diag_proxy_paths.py ll|ht
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402


def _say(rank, *a):
    print(f"[r{rank}]", *a, flush=True)


def _err(buf):
    try:
        buf._executor.check_error()
        return "none"
    except Exception as e:  # noqa: BLE001 - diagnostics
        return f"{type(e).__name__}: {e}"


def _dump(rank, tag, buf):
    """Fires while an op is still running: the proxy's counters and every Python thread's stack."""
    import faulthandler
    eng = getattr(buf._executor, "_ht", None)
    if eng is None:
        _say(rank, tag, "still running after 4 s (no engine yet)")
    else:
        _say(rank, tag, "still running after 4 s: commands", int(eng.proxy.commands_posted), eng.transport_counters())
    faulthandler.dump_traceback(all_threads=True)
    sys.stderr.flush()


def _row_map(got, want, limit=24):
    """Which rows differ, and for each the index of an equal reference row (or -1 / 'zero')."""
    g = got.reshape(got.shape[0], -1).cpu()
    w = want.reshape(want.shape[0], -1).cpu()
    if g.element_size() == 1:
        g, w = g.view(torch.uint8), w.view(torch.uint8)
    bad = [i for i in range(min(len(g), len(w))) if not torch.equal(g[i], w[i])]
    index = {}
    for i in range(len(w)):
        index.setdefault(bytes(w[i].contiguous().view(torch.uint8).numpy()[:64].tobytes()), i)
    out = []
    for i in bad[:limit]:
        key = bytes(g[i].contiguous().view(torch.uint8).numpy()[:64].tobytes())
        zero = bool((g[i] == 0).all())
        out.append((i, "zero" if zero else index.get(key, -1)))
    return len(bad), len(g), out


# ---- LL ----------------------------------------------------------------------------------------------
def _bench_routing(T, E, K, gen, dev):
    scores = torch.randn(T, E, generator=gen).abs() + 1
    return (scores.topk(K, dim=-1, sorted=False).indices.to(dev), torch.rand(T, K, generator=gen).to(dev))


def ll_worker(rank, world, T, H, E, K, seed, cold=False):
    """cold: like the bench -- a 0-byte probe Buffer first, and the very first ops back to back."""
    from uccl_ep import Buffer
    dev = torch.device("cuda", torch.cuda.current_device())
    group = dist.group.WORLD
    probe = Buffer(group, 0, 0, backend="cuda") if cold else None  # noqa: F841 - kept alive like the bench's
    nbytes = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    buf = Buffer(group, 0, nbytes, low_latency_mode=True, backend="cuda", allow_nvlink_for_low_latency_mode=False)
    ref = Buffer(group, 0, nbytes, low_latency_mode=True, backend="reference")
    gen = torch.Generator().manual_seed(seed + rank)
    report = []
    pattern = (False, False, True, False) if cold else (True, False, False, True, False, False, False)
    for rnd, lockstep in enumerate(pattern):
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
        idx, w = _bench_routing(T, E, K, gen, dev)
        y = (torch.randn(E // world, world * T, H, generator=gen)).to(torch.bfloat16).to(dev)
        torch.cuda.synchronize()
        dist.barrier()

        def step():
            if lockstep:
                torch.cuda.synchronize()
                dist.barrier()
        ll = getattr(buf._executor, "_ll", None)
        set0 = ll.idx if ll is not None else 0
        (q, s), c8, h8, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)
        step()
        xb, cb, hb, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
        step()
        got, _, _ = buf.low_latency_combine(y, idx, w, hb)
        torch.cuda.synchronize()
        err = _err(buf)
        (rq, rs), rc8, rh8, _, _ = ref.low_latency_dispatch(x, idx, T, E, use_fp8=True)
        rb, rcb, rhb, _, _ = ref.low_latency_dispatch(x, idx, T, E, use_fp8=False)
        want, _, _ = ref.low_latency_combine(y, idx, w, rhb)
        torch.cuda.synchronize()
        res = {"round": rnd, "lockstep": lockstep, "first_set": set0, "error": err}
        for name, cnt, rcnt, hd, rhd, xs, rxs in (("fp8", c8, rc8, h8, rh8, q, rq), ("bf16", cb, rcb, hb, rhb, xb, rb)):
            bad_e = [(e, int(a), int(b)) for e, (a, b) in enumerate(zip(cnt.tolist(), rcnt.tolist())) if a != b]
            lr, rlr = hd[1].cpu(), rhd[1].cpu()
            bad_lr = []
            for e in range(lr.shape[0]):
                for j in range(lr.shape[1]):
                    if int(lr[e, j]) != int(rlr[e, j]):
                        bad_lr.append((e, j, int(lr[e, j]) >> 32, int(lr[e, j]) & 0xffffffff,
                                       int(rlr[e, j]) >> 32, int(rlr[e, j]) & 0xffffffff))
            rows_bad = 0
            for e in range(cnt.shape[0]):
                n = int(rcnt[e])
                if int(cnt[e]) == n:
                    a, b = xs[e, :n].cpu(), rxs[e, :n].cpu()
                    if a.element_size() == 1:
                        a, b = a.view(torch.uint8), b.view(torch.uint8)
                    rows_bad += int((a != b).reshape(n, -1).any(1).sum()) if n else 0
            res[name] = dict(bad_counts=bad_e[:8], n_bad_counts=len(bad_e), bad_layout=bad_lr[:8],
                             n_bad_layout=len(bad_lr), rows_bad=rows_bad)
        diff = (got.float() - want.float()).abs()
        bad_rows = diff.reshape(T, -1).amax(1) > 0
        res["combine"] = dict(rows_bad=int(bad_rows.sum()), first=bad_rows.nonzero().flatten()[:10].tolist(),
                              zero_rows=int((got.float().abs().amax(1) == 0).sum()))
        _say(rank, res)
        report.append(res)
        dist.barrier()
    return report


# ---- HT internode ------------------------------------------------------------------------------------
def ht_worker(rank, world, H, T, E, seed):
    from uccl_ep import Buffer, Config
    dev = torch.device("cuda", torch.cuda.current_device())
    group = dist.group.WORLD
    configs = [Buffer.get_dispatch_config(world), Config(8, 4, 32, 2, 8)]
    nvl = max(c.get_nvl_buffer_size_hint(H * 2, world) for c in configs)
    ours = Buffer(group, nvl, 0, backend="cuda", ranks_per_node=1)
    ref = Buffer(group, nvl, 0, backend="reference", ranks_per_node=1)
    _say(rank, "topology", ours.topology, "engine", type(ours._executor._ht).__name__)
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    K = 8
    for ci, cfg in enumerate(configs):
        for asy in (False, True):
            x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
            idx = (torch.randn(T, E, generator=gen).abs() + 1).topk(K, dim=-1).indices.to(dev)
            w = torch.rand(T, K, generator=gen).to(dev)
            lay = ours.get_dispatch_layout(idx, E)
            kw = dict(num_tokens_per_rank=lay[0], num_tokens_per_rdma_rank=lay[1], is_token_in_rank=lay[3],
                      num_tokens_per_expert=lay[2], config=cfg, topk_idx=idx, topk_weights=w)
            tag = f"cfg {ci} async={asy}"
            watch = threading.Timer(4.0, _dump, args=(rank, tag, ours))
            watch.start()
            try:
                if asy:
                    go = ours.dispatch(x, previous_event=ours.capture(), async_finish=True,
                                       allocate_on_comm_stream=True, **kw)
                    go[5].current_stream_wait()
                else:
                    go = ours.dispatch(x, **kw)
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                _say(rank, tag, "dispatch raised", traceback.format_exc()[-800:])
                return False
            watch.cancel()
            eng = getattr(ours._executor, "_ht", None)
            _say(rank, tag, "error word:", _err(ours))
            if eng is not None:
                _say(rank, tag, "after: commands", int(eng.proxy.commands_posted), eng.transport_counters())
            gr = ref.dispatch(x, **kw)
            torch.cuda.synchronize()
            _say(rank, tag, "recv rows", go[0].shape[0], "ref", gr[0].shape[0])
            nb, n, rows = _row_map(go[0], gr[0])
            _say(rank, tag, f"recv_x: {nb}/{n} rows differ; first (row, equal ref row): {rows}")
            for name, a, b in (("topk_idx", go[1], gr[1]), ("topk_w", go[2], gr[2])):
                nb2, _, rows2 = _row_map(a, b, 8)
                _say(rank, tag, f"{name}: {nb2} rows differ {rows2}")
            _say(rank, tag, "experts", go[3], gr[3])
            for k, (a, b) in enumerate(zip(go[4], gr[4])):
                if isinstance(a, torch.Tensor):
                    same = a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
                    if not same:
                        _say(rank, tag, f"handle[{k}] differs: shape {tuple(a.shape)} vs {tuple(b.shape)}\n"
                             f"  got  {a.flatten()[:24].tolist()}\n  want {b.flatten()[:24].tolist()}")
            try:
                co = ours.combine(go[0], go[4], topk_weights=go[2], config=cfg)
                torch.cuda.synchronize()
                cr = ref.combine(gr[0], gr[4], topk_weights=gr[2], config=cfg)
                torch.cuda.synchronize()
                nb3, n3, rows3 = _row_map(co[0], cr[0], 12)
                _say(rank, tag, f"combine: {nb3}/{n3} rows differ {rows3}; error word {_err(ours)}")
            except Exception:  # noqa: BLE001
                _say(rank, tag, "combine raised", traceback.format_exc()[-800:])
            dist.barrier()
    return True


if __name__ == "__main__":
    world = min(torch.cuda.device_count(), 8)
    what = sys.argv[1] if len(sys.argv) > 1 else "ll"
    os.environ.setdefault("UCCL_EP_GPU_TIMEOUT_S", "15")
    try:
        if what == "ll":
            T = int(sys.argv[2]) if len(sys.argv) > 2 else 128
            cold = "cold" in sys.argv[3:]
            run_ranks(ll_worker, world, T, 7168, 288, 8, 5, cold, backend="nccl", timeout_s=240)
        else:
            run_ranks(ht_worker, world, 2048, 512, 64, 1, backend="nccl", timeout_s=240)
    except Exception:  # noqa: BLE001
        print(traceback.format_exc()[-3000:], flush=True)
