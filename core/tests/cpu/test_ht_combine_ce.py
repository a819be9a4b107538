"""The copy-engine HT combine (Tuning.ht_combine_ce; uccl_ep/cuda/ht_ce.py, ht/nvlink/combine_ce.cu)
on CPU: the staging layout constants against kernel_abi.h (compiled), the per-handle decision and
sizes, the copy list a rank issues (checked by replaying it on host memory: every peer's region
ends up holding exactly its tokens' rows, in its token order, and a flag per chunk after the chunk),
the executor's agreement check, and the engine's dispatch-time decision with recording fakes.
What it cannot show: the copy engines and the sum kernel on a GPU (core/tests/gpu/test_cuda_ht.py
[small-ce] / [deepseek-ce])."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from uccl_ep.cuda import ht_ce, jit
from uccl_ep.errors import InvalidArgument
from uccl_ep.tuning import Tuning

pytestmark = pytest.mark.cpu


def test_layout_constants_match_the_header(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    lines_slot = [f"static_assert(uccl_ep::ce_region_slot({a}, {b}) == {ht_ce.region_slot(a, b)}, \"slot\");"
                  for a in range(4) for b in range(4) if a != b]
    checks = {"kCEMaxChunks": ht_ce.MAX_CHUNKS, "kCEFlagsOffset": ht_ce.FLAGS_OFF, "kCEFreedOffset": ht_ce.FREED_OFF,
              "kCEEpochOffset": ht_ce.EPOCH_OFF, "kCEEpochSrcOffset": ht_ce.EPOCH_SRC_OFF,
              "kCEDoneOffset": ht_ce.DONE_OFF, "kCEDataOffset": ht_ce.DATA_OFF, "kCEDFlagsOffset": ht_ce.D_FLAGS_OFF,
              "kCEDFreedOffset": ht_ce.D_FREED_OFF, "kCEDEpochOffset": ht_ce.D_EPOCH_OFF,
              "kCEDEpochSrcOffset": ht_ce.D_EPOCH_SRC_OFF, "kCEDCountOffset": ht_ce.D_COUNT_OFF}
    lines = ['#include "uccl_ep/kernel_abi.h"'] + [
        f"static_assert(uccl_ep::{k} == {v}ull, \"{k}\");" for k, v in checks.items()]
    lines.append("static_assert(uccl_ep::kCEDoneOffset + 8 <= uccl_ep::kCEDFlagsOffset, \"combine header\");")
    lines.append("static_assert(uccl_ep::kCEDFlagsOffset + 8 * 8 * uccl_ep::kCEMaxChunks <= uccl_ep::kCEDFreedOffset, \"d\");")
    lines.append("static_assert(uccl_ep::kCEDEpochSrcOffset + 8 <= uccl_ep::kCEDCountOffset, \"d\");")
    lines.append("static_assert(uccl_ep::kCEDCountOffset + 4 * 8 * uccl_ep::kCEMaxChunks <= uccl_ep::kCEDataOffset, \"d\");")
    lines.append("static_assert(sizeof(uccl_ep::HTCEWaitParams) == 64, \"ce_chain passes 64 bytes\");")
    lines += lines_slot
    src = tmp_path / "ce.cc"
    src.write_text("\n".join(lines) + "\n")
    res = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", f"-I{jit.include_dir()}", str(src)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_sizes():
    counts = [[10, 7, 3], [4, 0, 9], [0, 12, 5]]
    assert ht_ce.staging_rows_needed(counts) == 12  # the diagonal (own rows) never crosses
    assert ht_ce.staging_rows_needed([[5]]) == 0
    assert ht_ce.region_bytes(512, 7168, 8) % 4096 == 0
    assert ht_ce.region_bytes(512, 7168, 8) >= 512 * 7168 * 2 + 512 * 8 * 4
    # ~chunk_bytes (here 4 MiB) chunks, never more than MAX_CHUNKS of them per region
    mib4 = 4 << 20
    assert ht_ce.chunk_rows(4096, 7168, chunk_bytes=mib4) == (4 << 20) // (7168 * 2)
    big = 1 << 20
    assert -(-big // ht_ce.chunk_rows(big, 7168, chunk_bytes=mib4)) <= ht_ce.MAX_CHUNKS
    assert ht_ce.chunk_rows(1, 1 << 30, chunk_bytes=mib4) == 1


@pytest.mark.parametrize("R,rank", [(2, 0), (2, 1), (4, 2), (4, 1)])
def test_copy_list_returns_each_sources_rows_in_order(R, rank):
    """Replay the copies on host memory: peer j's region for `rank` holds rank's x rows from j (its
    tokens, in order) and their weights; each chunk's flag copy follows that chunk's rows and
    all the weights."""
    H, K = 16, 3
    g = torch.Generator().manual_seed(R * 10 + rank)
    recv_counts = [int(v) for v in torch.randint(0, 40, (R,), generator=g)]
    recv_counts[(rank + 1) % R] = 0 if R > 2 else recv_counts[(rank + 1) % R]  # a peer with no rows
    rows = sum(recv_counts)
    x = torch.randn(rows, H, generator=g).bfloat16()
    w = torch.rand(rows, K, generator=g)
    cap = max(recv_counts) + 5
    region = ht_ce.region_bytes(cap, H, K)
    chunk = 7
    stages = [torch.zeros(ht_ce.DATA_OFF + (R - 1) * region, dtype=torch.uint8) for _ in range(R)]
    epoch_src = torch.tensor([41], dtype=torch.int64)
    bases = [int(s.data_ptr()) for s in stages]
    copies = ht_ce.copy_list(rank, recv_counts, x.data_ptr(), w.data_ptr(), H, K, bases, region, cap, chunk,
                             epoch_src.data_ptr())
    assert set(copies) == {j for j in range(R) if j != rank and recv_counts[j] > 0}
    import ctypes
    start = 0
    for j in range(R):
        n = recv_counts[j]
        if j in copies:
            landed = 0
            rows_here, weights_here = set(), set()
            for dst, src, nbytes in copies[j]:
                off = dst - bases[j] - ht_ce.DATA_OFF - ht_ce.region_slot(rank, j) * region
                if nbytes == 8 and src == epoch_src.data_ptr():
                    k = (dst - bases[j] - ht_ce.FLAGS_OFF) // 8 - rank * ht_ce.MAX_CHUNKS
                    chunk_rows_k = set(range(k * chunk, min(n, (k + 1) * chunk)))
                    assert chunk_rows_k <= rows_here, "a flag before its chunk's rows"
                    assert chunk_rows_k <= weights_here, "a flag before its chunk's weights"
                elif off < cap * H * 2:
                    r0 = off // (H * 2)
                    rows_here |= set(range(r0, r0 + nbytes // (H * 2)))
                    landed += nbytes // (H * 2)
                else:
                    r0 = (off - cap * H * 2) // (K * 4)
                    weights_here |= set(range(r0, r0 + nbytes // (K * 4)))
                ctypes.memmove(dst, src, nbytes)
            assert landed == n
            reg = stages[j][ht_ce.DATA_OFF + ht_ce.region_slot(rank, j) * region:][:region]
            got = reg[:n * H * 2].view(torch.bfloat16).view(n, H)
            assert torch.equal(got, x[start:start + n])
            gw = reg[cap * H * 2:cap * H * 2 + n * K * 4].view(torch.float32).view(n, K)
            assert torch.equal(gw, w[start:start + n])
            flags = stages[j][:ht_ce.FREED_OFF].view(torch.int64).view(8, ht_ce.MAX_CHUNKS)[rank]
            nchunks = -(-n // chunk)
            assert flags[:nchunks].eq(41).all() and flags[nchunks:].eq(0).all()
        for other in range(R):  # nothing lands in another source's region
            if other not in (rank, j):
                assert stages[j][ht_ce.DATA_OFF + ht_ce.region_slot(other, j) * region:][:region].eq(0).all()
        start += n


def test_ranks_must_agree():
    same = ht_ce.shared_settings(Tuning())
    assert same == (True, 2048, 24, "auto", 8192, "")
    ht_ce.check_same_settings([same, ht_ce.shared_settings(Tuning())])
    with pytest.raises(InvalidArgument, match="tuning.ht_combine_ce.*rank 1: False/2048/24/auto/8192/"):
        ht_ce.check_same_settings([same, ht_ce.shared_settings(Tuning(ht_combine_ce=False))])
    with pytest.raises(InvalidArgument, match="rank 0: True/2048/24/1/8192/"):
        ht_ce.check_same_settings([ht_ce.shared_settings(Tuning(ht_dispatch_ce="1")), same])
    with pytest.raises(InvalidArgument, match="tuning.ht_ce_chunk_kb.*rank 1: True/2048/24/auto/1024/"):
        ht_ce.check_same_settings([same, ht_ce.shared_settings(Tuning(ht_ce_chunk_kb=1024))])
    with pytest.raises(InvalidArgument, match="tuning.ht_ce_min_mb.*rank 1: True/2048/0/auto/8192/"):
        ht_ce.check_same_settings([same, ht_ce.shared_settings(Tuning(ht_ce_min_mb=0))])


class _EngineContext:
    """The fields of cuda/engine_context.EngineContext that CopyEngineOps reads, recording its calls."""

    def __init__(self, R, rank, log, tuning):
        from types import SimpleNamespace
        self.drv = SimpleNamespace(memset_d8=lambda *a: log.append("memset"), synchronize=lambda *a: None,
                                   memcpy_htod=lambda dev, ptr, blob: log.append(("peers", blob)))
        self.ctx = SimpleNamespace(group=None, tuning=tuning)
        self.host_barrier = lambda: log.append("barrier")


class _Mem:
    n = 0

    def __init__(self, dev, nbytes):
        _Mem.n += 1
        self.ptr, self.nbytes, self.freed = 0x1000000 * _Mem.n, nbytes, False

    def ipc_handle(self):
        return b"h%d" % self.ptr

    def open_peer(self, h):
        return 0x7000000

    def free(self):
        self.freed = True


def _ops_with_fake_device(monkeypatch, log, peer_handle=b"peer", R=2, **tuning):
    """A CopyEngineOps over fake device memory and a fake handle exchange (the peer answers
    `peer_handle`); Tuning(ht_combine_ce=True, ht_ce_min_mb=0, **tuning): any size takes the copy engines
    unless a test says otherwise."""
    from types import SimpleNamespace
    tuning = Tuning(**{"ht_combine_ce": True, "ht_ce_min_mb": 0, **tuning})
    monkeypatch.setattr(ht_ce, "DeviceMemory", _Mem)
    monkeypatch.setattr(ht_ce.CopyEngineOps, "_kernels", lambda self: {})  # no device to load them on
    monkeypatch.setattr(ht_ce.CopyEngineOps, "_warm_copy_path", lambda self: log.append("warm copies"))
    monkeypatch.setattr(ht_ce.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(ht_ce.dist, "all_gather_object", lambda out, obj, group=None: out.__setitem__(
        slice(None), [obj, peer_handle]))
    eng = SimpleNamespace(ec=_EngineContext(R, 0, log, tuning), dev=0, R=R, rank=0, combine_block=512)
    return eng, ht_ce.CopyEngineOps(eng)


def test_prepare_grows_collectively_and_decides_alike(monkeypatch):
    """The decision and growth come from the counts alone (the same on every rank): growth is a
    collective (barrier, handle exchange, barrier) only when the counts outgrow the buffer; a
    buffer over Tuning.ht_combine_ce_max_mb keeps the ring combine without a collective."""
    log = []
    eng, ce = _ops_with_fake_device(monkeypatch, log, ht_combine_ce_max_mb=64)
    assert ce.enabled
    assert ce.prepare([[100, 900], [1000, 50]], 2048, 8, 24)
    assert ce.cap == 1024 and log.count("barrier") == 2 and ce.peer_stage[1] == 0x7000000
    # the peers' copy path is warmed while nothing is queued, before the closing barrier
    assert log.index("warm copies") < len(log) - 1 and log[-1] == "barrier"
    log.clear()
    assert ce.prepare([[100, 1024], [3, 50]], 2048, 8, 24) and log == []  # fits: no collective
    old = ce.mem
    assert ce.prepare([[0, 1500], [3, 0]], 2048, 8, 24) and ce.cap == 1536 and old.freed
    log.clear()
    assert not ce.prepare([[0, 5000], [3, 0]], 7168, 8, 24) and log == []  # 5120 x 14 KiB > 64 MiB
    eng.ec.ctx.tuning = Tuning(ht_combine_ce=False)
    assert not ht_ce.CopyEngineOps(eng).prepare([[0, 1], [1, 0]], 2048, 8, 24)


def test_small_ops_keep_the_rings(monkeypatch):
    """Tuning.ht_ce_min_mb: an op whose largest rank-to-rank share of rows is under it takes the ring
    kernels, decided from the counts alone (every rank alike) and without a collective; at or over it
    the copy engines; 0 takes them at any size."""
    log = []
    eng, ce = _ops_with_fake_device(monkeypatch, log, ht_ce_min_mb=24)
    rows = (24 << 20) // (4096 * 2)  # 3072 rows of hidden 4096 make 24 MiB
    assert not ce.prepare([[0, rows - 1], [rows - 1, 0]], 4096, 6, 24) and log == [] and ce.mem is None
    assert not ce.prepare([[0, 10], [rows - 1, 0]], 4096, 6, 24) and log == []
    assert ce.prepare([[0, 10], [rows, 0]], 4096, 6, 24) and log.count("barrier") == 2  # either direction
    eng.ec.ctx.tuning = Tuning(ht_combine_ce=True, ht_ce_min_mb=0)
    assert ht_ce.CopyEngineOps(eng).prepare([[0, 1], [1, 0]], 4096, 6, 24)
    assert Tuning().ht_ce_min_mb == 24
    with pytest.raises(InvalidArgument, match="tuning.ht_ce_min_mb"):
        Tuning(ht_ce_min_mb=-1)


@pytest.mark.parametrize("mode", ["auto", "1", "0"])
def test_dispatch_by_copy_engines_is_chosen_by_the_configs_sm_count(monkeypatch, mode):
    """Tuning.ht_dispatch_ce=auto: calls whose Config has <= 12 SMs dispatch by copy engines (the
    staging buffer grows by the dispatch regions once, collectively, and keeps them); calls with more
    SMs keep the ring dispatch. 1: every call; 0: none (no dispatch regions at all)."""
    from types import SimpleNamespace
    log = []
    _, ce = _ops_with_fake_device(monkeypatch, log, ht_dispatch_ce=mode)
    counts = [[100, 900], [1000, 50]]
    assert ce.prepare(counts, 2048, 8, 24)
    assert (ce.d_region > 0) == (mode == "1")
    plan = SimpleNamespace(ce=True, recv_counts=[100, 1000])
    log.clear()
    assert ce.prepare(counts, 2048, 8, 12)
    assert (log.count("barrier") == 2) == (mode == "auto")  # auto: grown by the dispatch regions now
    assert (ce.d_region > 0) == (mode != "0")
    log.clear()
    assert ce.prepare(counts, 2048, 8, 24) and log == []  # kept: no collective
    for sms, expect in ((12, mode != "0"), (8, mode != "0"), (13, mode == "1"), (24, mode == "1")):
        lay = ce.dispatch_layout_for(plan, 2048 * 2, 0, 8, sms)
        assert (lay is not None) == expect, (sms, mode)
    # auto at EP > 2: the ring dispatch (not yet measured there)
    assert _ops_with_fake_device(monkeypatch, log, R=4, ht_dispatch_ce=mode)[1].wants_dispatch(8) == (mode == "1")


def test_dispatch_layout_and_receive_chain():
    """The receiving side of the copy-engine dispatch: per source j, for each chunk a bounded wait
    on j's flag (its HTCEWaitParams words) then the chunk's copy into recv_x at the source's run,
    then the metadata columns, and always (even with nothing from j) the freed word at j."""
    lay = ht_ce.dispatch_layout(100, 7168, 56, 8)
    assert lay["scales_off"] >= 100 * 7168 and lay["topk_off"] >= lay["scales_off"] + 100 * 56 * 4
    assert lay["src_off"] >= lay["weights_off"] + 100 * 8 * 4 and lay["bytes"] % 4096 == 0
    assert all(v % 16 == 0 for v in lay.values())
    R, rank, hb = 3, 1, 64
    counts = [5, 7, 0]
    stage, peers = 1 << 40, [1 << 41, 1 << 40, 1 << 42]
    outs = {"recv_x": 1 << 30, "recv_scales": 0, "recv_topk_idx": 1 << 31, "recv_topk_weights": 1 << 32,
            "recv_src_idx": 1 << 33}
    chains = ht_ce.receive_chain(rank, counts, stage, peers, 4096, 1 << 20, lay, 2, hb, 0, 8, outs, 99, 123)
    assert sorted(chains) == [0, 2]
    chunks0, tail0 = chains[0]
    assert [c[0][10] for c in chunks0] == [0, 1, 2]  # 5 rows in chunks of 2: (wait, copy) each
    for k, (w, cp) in enumerate(chunks0):
        assert w[0] == 1 and cp[0] == 0
        assert w[4] == stage + ht_ce.D_FLAGS_OFF + 8 * (0 * ht_ce.MAX_CHUNKS + k)
        assert w[5:10] == (stage, 99, ht_ce.D_EPOCH_OFF, rank, 0) and w[11] == 123
    region = stage + 4096 + ht_ce.region_slot(0, rank) * (1 << 20)
    assert chunks0[0][1][1:4] == (outs["recv_x"], region, 2 * hb)  # source 0's run starts at row 0
    assert chunks0[2][1][1:4] == (outs["recv_x"] + 4 * hb, region + 4 * hb, hb)
    meta = {s[1]: s for s in tail0[:-1]}
    assert meta[outs["recv_topk_idx"]][2:4] == (region + lay["topk_off"], 5 * 8 * 8)
    assert meta[outs["recv_src_idx"]][2:4] == (region + lay["src_off"], 5 * 4)
    freed = lambda j: (0, peers[j] + ht_ce.D_FREED_OFF + 8 * rank, stage + ht_ce.D_EPOCH_SRC_OFF, 8) + (0,) * 8  # noqa: E731
    assert tail0[-1] == freed(0)  # last: the region is free again
    assert chains[2] == ([], [freed(2)])  # nothing from rank 2: only the freed word


def test_a_rank_out_of_memory_turns_the_path_off_everywhere(monkeypatch):
    """One rank failing to allocate its staging buffer: every rank learns it from the exchange
    (the failure travels instead of a handle), drops the copy-engine path and keeps the ring
    kernels, with a warning naming the rank and the size."""
    log = []
    _, ce = _ops_with_fake_device(monkeypatch, log, peer_handle="OutOfMemoryError: cuMemAlloc failed")
    with pytest.warns(RuntimeWarning, match="rank 1 could not allocate"):
        assert not ce.prepare([[0, 10], [10, 0]], 2048, 8, 24)
    assert not ce.enabled and ce.mem is None
    assert not ce.prepare([[0, 10], [10, 0]], 2048, 8, 24)  # stays off, no further collective


def test_packed_steps_are_cached_by_key_and_dropped_with_the_buffer(monkeypatch):
    """Back-to-back calls on the same tensors reuse the packed copy steps (built once per key, at
    most 16 keys kept, oldest out first); re-establishing the staging buffer drops them all (they
    encode the peers' mappings)."""
    log = []
    _, ce = _ops_with_fake_device(monkeypatch, log)
    built = []

    def build(tag):
        return lambda: built.append(tag) or f"steps-{tag}"
    assert ce._packed(("d", 1), build(1)) == "steps-1"
    assert ce._packed(("d", 1), build(1)) == "steps-1" and built == [1]
    for key in range(2, 18):
        ce._packed(("d", key), build(key))
    assert len(ce._pack_cache) == 16 and ("d", 1) not in ce._pack_cache
    assert ce.prepare([[100, 900], [1000, 50]], 2048, 8, 24)  # (re)establishes the buffer
    assert ce._pack_cache == {}

