"""One proxy session per Buffer (uccl_ep/proxy/session.py, uccl_ep/cuda/proxy_session.py).

1. The cuda executor's session on CPU, with the driver, device memory and kernels replaced by the
   recording fakes of test_ht_internode_proxy_path.py and real ipc proxies in this process: the
   low-latency and the normal-mode proxy engines on one session (one proxy started, one FIFO table,
   one region with the NVL buffer first), disjoint counter ranges (the low-latency clean keeps
   normal mode's counters), the copy rings handed from one engine's copy kernel to the other's on
   the stream, and close(): engines free their own memory, the session stops the proxy and
   unregisters every page once.
2. The host executor, in processes: a Buffer used in both modes, in turns, bit for bit against the
   reference, bootstraps one proxy per rank and starts its threads once.

What this cannot show: the kernels consuming the handed-over rings. That is
core/tests/gpu/test_cuda_proxy_session.py, on a GPU machine.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multirank import run_ranks  # noqa: E402
from test_ht_internode_proxy_path import FakeDrv, HostMem, RecordingKernel  # noqa: E402
from test_proxy import make_group, stop_all  # noqa: E402
from uccl_ep.config import Config, low_latency_rdma_size_hint  # noqa: E402
from uccl_ep.cuda import ht, ht_proxy, ll_proxy, proxy_session  # noqa: E402
from uccl_ep.cuda import ll as ll_engine  # noqa: E402
from uccl_ep.cuda.engine_context import EngineContext  # noqa: E402
from uccl_ep.cuda.proxy_session import LL_COUNTER_BASE, NUM_COUNTERS  # noqa: E402
from uccl_ep.proxy import native  # noqa: E402
from uccl_ep.topology import Topology  # noqa: E402
from uccl_ep.tuning import Tuning  # noqa: E402

pytestmark = pytest.mark.cpu
C = native()


class Handover:
    """copy_ring_handover (transport/copy_ring.cu) run on host memory, as its comment says it works."""

    def __init__(self, log):
        self.log, self.name = log, "copy_ring_handover"

    def launch(self, grid, block, params, stream, smem=0, cooperative=False, programmatic=False):
        from ht_proxy_emulator import unpack
        p = unpack("CopyRingHandoverParams", params)
        self.log.append((self.name, grid, block, params))
        for g in range(p["num_rings"]):
            own = p["own"] + 8 * g * p["own_stride"]
            at = _u64(p["other"] + 8 * g * p["other_stride"])
            if at > _u64(own):
                for k in (p["word0"], p["word1"], p["word2"]):
                    if k >= 0:
                        _set_u64(own + 8 * k, at)


class Kernel(RecordingKernel):
    def launch(self, grid, block, params, stream, smem=0, cooperative=False, programmatic=False):
        self.log.append((self.name, grid, block, params))


def _u64(addr: int) -> int:
    return ctypes.c_uint64.from_address(addr).value


def _set_u64(addr: int, value: int) -> None:
    ctypes.c_uint64.from_address(addr).value = value


@pytest.fixture
def both(monkeypatch):
    """Rank 0 of 2: a session over one region (NVL buffer, then LL buffer) and both engines on it."""
    monkeypatch.setenv("UCCL_EP_IPC_COPY", "kernel")
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    monkeypatch.delenv("UCCL_EP_TRANSPORT", raising=False)
    R, rank = 2, 0
    proxies = make_group(R, "ipc", num_counters=NUM_COUNTERS, region_bytes=1 << 20, ipc_copy="kernel")
    started, log = [], []
    import uccl_ep.proxy
    monkeypatch.setattr(uccl_ep.proxy, "start_proxy", lambda group, **kw: started.append(kw) or proxies[rank])
    for mod in (ll_proxy, proxy_session, ht_proxy):
        monkeypatch.setattr(mod, "DeviceMemory", HostMem)
    monkeypatch.setattr(ht_proxy, "MappedHostMemory", HostMem)
    monkeypatch.setattr(ll_proxy, "load_kernel", lambda dev, src, name, defines=(): Kernel(log, name))
    monkeypatch.setattr(ht_proxy, "load_kernel", lambda dev, src, name: Kernel(log, name))
    monkeypatch.setattr(proxy_session, "load_kernel", lambda dev, src, name: Handover(log))
    for mod in (ll_engine, ll_proxy, ht_proxy, ht):
        monkeypatch.setattr(mod, "current_stream", lambda device=None: 0)
    monkeypatch.setattr(ll_proxy, "device_arch", lambda dev: "sm_90a")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    T, H, E = 16, 256, 8
    ll_bytes = low_latency_rdma_size_hint(T, H, R, E)
    region, nvl, ll = proxy_session.shared_region(0, (4 << 20) + 100, ll_bytes)
    ctx = SimpleNamespace(num_ranks=R, rank=rank, options={"num_proxy_threads": 2}, group=None, timeout_s=10.0,
                          topology=Topology(R, 1), enable_shrink=False, tuning=Tuning())
    err = HostMem(0, 64)
    ex = EngineContext(ctx=ctx, device=0, drv=FakeDrv(), region=region, nvl_mem=nvl, ll_mem=ll, error_dev_ptr=err.ptr,
                       errors=err, timeout_ns=123, multi_host=False, mask_ptr=0xD000, owner=object())
    session = proxy_session.open_for(ex, True, True)
    ll_eng = ll_proxy.ProxyLowLatencyEngine(ex, session)
    ht_eng = ht_proxy.ProxyNormalEngine(ex, session)
    yield SimpleNamespace(ex=ex, session=session, ll=ll_eng, ht=ht_eng, started=started, log=log, T=T, H=H, E=E,
                          R=R, proxy=proxies[rank])
    ll_eng.close()
    ht_eng.close()
    session.close()
    stop_all(proxies)


def _ll_dispatch(b):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b.T, b.H, generator=g).bfloat16()
    topk = torch.rand(b.T, b.E, generator=g).topk(4, dim=1).indices
    out = b.ll.dispatch(None, x, topk, b.T, b.E, False, False, False, set(), None, None)
    send = [e for e in b.log if e[0] == "ll_dispatch_proxy_send"][-1]
    return proxy_path_params("LLProxyDispatchParams", send[3])


def proxy_path_params(name, params):
    from ht_proxy_emulator import unpack
    return unpack(name, params)


def test_one_proxy_for_both_engines(both):
    s, ex = both.session, both.ex
    assert len(both.started) == 1  # one bootstrap for the Buffer
    kw = both.started[0]
    assert kw["external_region"] == ex.region.ptr and kw["region_bytes"] == ex.region.nbytes
    assert kw["num_counters"] == NUM_COUNTERS and kw["ipc_copy"] == "kernel"
    # the NVL buffer starts the region (normal mode addresses it from its base), the LL buffer above it
    assert ex.nvl_mem.ptr == ex.region.ptr and ex.ll_mem.ptr == ex.region.ptr + ex.ll_mem.offset
    assert ex.ll_mem.offset >= ex.nvl_mem.nbytes and ex.ll_mem.offset % 4096 == 0
    assert ex.region.nbytes == ex.ll_mem.offset + ex.ll_mem.nbytes
    for eng in (both.ll, both.ht):
        assert eng.proxy is s.proxy and eng.fifo_table is s.fifo_table and eng.fifo_words is s.fifo_words
        assert eng.counters_dev == s.counters_dev and eng.status_dev == s.status_dev
    d = _ll_dispatch(both)
    lay = both.ll.layout
    # the LL Writes' offsets are the region's; its counters are the session's LL range
    assert d["send_off"] == ex.ll_mem.offset + lay.send(0) and d["recv_off"] == ex.ll_mem.offset + lay.recv(0)
    assert d["send_area"] == ex.ll_mem.ptr + lay.send(0)
    assert LL_COUNTER_BASE <= d["counter"] < NUM_COUNTERS
    assert d["fifos"] == s.fifo_table.ptr
    # normal mode: counters from 0 in the session's array, the region from its base
    words = both.ht.proxy_words()
    assert words["region"] == s.region_dev and words["fifos"] == s.fifo_table.ptr
    assert both.ht.ring(64, 2, Config(4, 4, 32, 2, 8), "test")["num_counters"] == NUM_COUNTERS
    assert ht_proxy.plan.NUM_COUNTERS <= LL_COUNTER_BASE


def test_low_latency_clean_keeps_normal_mode_counters(both):
    addr, nbytes = C.proxy_counters_address(both.session.proxy)
    assert nbytes == both.R * NUM_COUNTERS * 8
    counters = (ctypes.c_int64 * (both.R * NUM_COUNTERS)).from_address(addr)
    ht_counters = (3, ht_proxy.plan.HEAD_BASE + 3, ht_proxy.plan.META_COUNTER0)
    ll_counter = ll_proxy.counter_base(1, 1)
    for src in range(both.R):
        for c in ht_counters:
            counters[src * NUM_COUNTERS + c] = 7 + c
        counters[src * NUM_COUNTERS + ll_counter] = 5
    both.ll.ensure_layout(both.T, both.H, both.E)  # a new layout cleans: counters of the LL range to 0
    for src in range(both.R):
        assert [counters[src * NUM_COUNTERS + c] for c in ht_counters] == [7 + c for c in ht_counters]
        assert counters[src * NUM_COUNTERS + ll_counter] == 0


def test_copy_rings_change_hands_on_the_stream(both):
    n, log = both.session.num_proxy_threads, both.log
    ll_state = [both.ll.dma_mem.ptr + 16 * n + 128 * g for g in range(n)]
    ht_state = [both.ht.dma_ctx + both.ht.dma_offsets["state"] + 128 * g for g in range(n)]
    names = lambda: [e[0] for e in log]  # noqa: E731
    _ll_dispatch(both)  # the hand-over precedes the send and copy kernels on the stream; nothing to take yet
    assert names()[-3:] == ["copy_ring_handover", "ll_dispatch_proxy_send", "ll_proxy_dma"]
    assert all(_u64(a) == 0 for a in ll_state)
    for g in range(n):  # where the LL copy kernel left each ring
        for off in (0, 16, 56):  # DmaConsumer base_idx, done, fetched
            _set_u64(ll_state[g] + off, 5 + g)
        _set_u64(ll_state[g] + 8, 1000 + g)  # its byte count stays its own
    del log[:]
    grid, role = both.ht.role(4, 512)  # a normal-mode launch with the copy role takes the rings over
    assert names() == ["copy_ring_handover"] and role["dma_blocks"] > 0
    assert [_u64(a) for a in ht_state] == [5 + g for g in range(n)]
    assert [_u64(a + 8) for a in ht_state] == [0] * n  # HtDmaRing.base_bytes: normal mode's own
    for g in range(n):
        _set_u64(ht_state[g], 9 + g)  # normal mode consumed more
    both.ht.role(4, 512)  # the rings are normal mode's already: nothing changes
    assert [_u64(a) for a in ht_state] == [9 + g for g in range(n)]
    assert [_u64(a) for a in ll_state] == [5 + g for g in range(n)]
    _ll_dispatch(both)  # the LL copy kernel's launch takes them back: position, done, fetched
    for g in range(n):
        assert [_u64(ll_state[g] + off) for off in (0, 16, 56)] == [9 + g] * 3
        assert _u64(ll_state[g] + 8) == 1000 + g
        _set_u64(ll_state[g], 12 + g)
    _ll_dispatch(both)  # LL ahead: the normal-mode position (behind) changes nothing
    assert [_u64(a) for a in ll_state] == [12 + g for g in range(n)]


def test_close_stops_once_and_releases_everything_once(both):
    s, drv = both.session, both.ex.drv
    registered = sorted(b for b, _ in drv.registered)
    stops = []
    real = s.proxy

    class Spy:
        def stop(self):
            stops.append(1)
            real.stop()

        def __getattr__(self, name):
            return getattr(real, name)

    s.proxy = Spy()
    both.ll.close()
    both.ht.close()
    assert drv.unregistered == [] and not s.closed and not stops  # engines free only their own memory
    s.close()
    s.close()
    assert stops == [1] and sorted(drv.unregistered) == registered
    both.ll.close()  # idempotent
    both.ht.close()


# --------------------------------------------------------------------------------------------------
# 2. the host executor: one session, both modes
# --------------------------------------------------------------------------------------------------
def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _both_modes_worker(rank, world, seed):
    import uccl_ep.proxy
    from test_host_executor import LL_CASES, _diff, _ht_inputs, _ht_run, _ll_run
    from uccl_ep import Buffer
    real, started = uccl_ep.proxy.start_proxy, []
    uccl_ep.proxy.start_proxy = lambda *a, **k: started.append(1) or real(*a, **k)
    torch.set_num_threads(1)  # no intra-op pool growing under the count
    T, H, E, K = 24, 256, 4 * world, 4
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    before = _threads()
    host = Buffer(dist.group.WORLD, 64 << 20, hint, low_latency_mode=True, num_qps_per_rank=E // world,
                  backend="host", explicitly_destroy=True)
    built = _threads()
    ref = Buffer(dist.group.WORLD, 64 << 20, hint, low_latency_mode=True, num_qps_per_rank=E // world,
                 backend="reference", explicitly_destroy=True)

    def ht_inputs(i):
        return _ht_inputs("random", rank, world, seed + i)

    def ll_inputs(i):
        g = torch.Generator().manual_seed(seed * 10 + i + rank)
        n = int(torch.randint(1, T + 1, (1,), generator=g))
        x = torch.randn(n, H, generator=g).bfloat16()
        return x, torch.rand(n, E, generator=g).topk(K, dim=1).indices, torch.rand(n, K, generator=g)

    # the reference once in both modes first: whatever torch or gloo starts lazily is there before counting
    x, topk, w, E_ht = ht_inputs(9)
    _ht_run(ref, "random", x, topk, w, E_ht, world, seed, rank)
    _ll_run(ref, LL_CASES[0], *ll_inputs(9), T, E, rank, world)
    steady = _threads()
    diffs, threads = [], []
    for i in range(2):  # normal mode, then low-latency mode, twice
        x, topk, w, E_ht = ht_inputs(i)
        a = _ht_run(host, "random", x, topk, w, E_ht, world, seed + i, rank)
        b = _ht_run(ref, "random", x, topk, w, E_ht, world, seed + i, rank)
        for k in a:
            _diff(a[k], b[k], f"ht{i}.{k}", diffs)
        threads.append(_threads())
        c = LL_CASES[1 - i]  # fp8, then bf16
        a = _ll_run(host, c, *ll_inputs(i), T, E, rank, world)
        b = _ll_run(ref, c, *ll_inputs(i), T, E, rank, world)
        for k in a:
            _diff(a[k], b[k], f"ll{i}.{k}", diffs)
        threads.append(_threads())
    session = host._executor.session
    same_proxy = host._executor.proxy is session.proxy
    host.destroy()
    ref.destroy()
    return dict(started=len(started), diffs=diffs, before=before, built=built, steady=steady, threads=threads,
                same_proxy=same_proxy, closed=session.closed)


def test_host_executor_one_session_for_both_modes():
    for r in run_ranks(_both_modes_worker, 2, 3, timeout_s=300):
        assert r["diffs"] == [], r["diffs"][:5]
        assert r["started"] == 1 and r["same_proxy"] and r["closed"]
        assert r["built"] > r["before"]  # the proxy's threads, started with the Buffer ...
        assert r["threads"] == [r["steady"]] * len(r["threads"]), (r["steady"], r["threads"])  # ... and only then


def test_region_views_carry_their_offset_in_ipc_handles(monkeypatch):
    """The LL buffer inside the shared region, as a hybrid rank's node peers map it: the region's
    handle with the view's offset (the NVL buffer first, page-aligned LL buffer above it)."""
    class Mem:
        def __init__(self, device, nbytes):
            self.device, self.nbytes, self.ptr, self.opened = device, nbytes, 0x10000, []

        def ipc_handle(self):
            return b"H" * 64

        def open_peer(self, handle):
            self.opened.append(handle)
            return 0x900000

    monkeypatch.setattr(proxy_session, "DeviceMemory", Mem)
    region, nvl, ll = proxy_session.shared_region(0, 5000, 3000)
    assert (nvl.ptr, nvl.nbytes) == (region.ptr, 5000) and (ll.ptr, ll.nbytes) == (region.ptr + 8192, 3000)
    assert region.nbytes == 8192 + 3000
    assert ll.open_peer(ll.ipc_handle()) == 0x900000 + 8192 and region.opened == [b"H" * 64]


def test_a_wait_on_a_peer_the_session_marked_dead_is_a_peer_failure():
    """Shrink mode excludes every peer in the session (a dead peer no longer fails the proxy), so a
    normal-mode kernel's timed-out wait on a peer the proxy marked dead reads as PeerFailure; on a
    live peer it stays a Timeout."""
    from uccl_ep.cuda.executor import CudaExecutor
    from uccl_ep.errors import PeerFailure, Timeout
    for dead, kind in ((True, PeerFailure), (False, Timeout)):
        ex = CudaExecutor.__new__(CudaExecutor)
        ex._failure, ex.ctx = None, SimpleNamespace(num_ranks=2, rank=0)
        ex.errors = SimpleNamespace(int32=lambda i: 1, int32_array=lambda i, n: [1, 5, 0, 1, 3, 2_000_000])
        ex.session = SimpleNamespace(closed=False, proxy=SimpleNamespace(peer_dead=lambda j: dead and j == 1))
        with pytest.raises(kind) as err:
            ex.check_error()
        assert err.value.peer == 1 and "ht_dispatch_recv" in str(err.value)
