"""Host-side orchestration of the CUDA executor's proxy path (uccl_ep/cuda/ll_proxy.py) on CPU,
with the driver, device memory and kernel launches replaced by recording fakes and real proxies
(loop transport) in this process: which host memory is registered for the device, the FifoLayout
table the kernels push through, every kernel parameter struct packed from the header's own field
list, buffer-set alternation and counter bases, and the layout against DeepEP's size hint.

What this cannot show: that the kernels and the CUDA copy engine work. That is
core/tests/gpu/test_cuda_ll_proxy.py, on a GPU machine (compiled here, not yet run there).
"""

import struct
from types import SimpleNamespace

import pytest
import torch

from engine_fakes import DEV, FakeDrv, FakeKernel, FakeMem, dispatched, unpack_params as _unpack
from test_proxy import make_group, stop_all
from uccl_ep.config import low_latency_rdma_size_hint
from uccl_ep.cuda import gpu_transport, ll, ll_proxy, proxy_session
from uccl_ep.cuda.engine_context import EngineContext  # noqa: E402
from uccl_ep.cuda.ll_proxy import (CHUNK_BYTES, NUM_COUNTERS, ProxyLayout, ProxyLowLatencyEngine, counter_base,
                                     fifo_table_entry, write_chunk_bytes)
from uccl_ep.proxy import native
from uccl_ep.topology import Topology
from uccl_ep.tuning import Tuning

pytestmark = pytest.mark.cpu

C = native()
@pytest.fixture
def engine(monkeypatch, request):
    R, rank = 2, 0
    # param: the copy engine, or (copy engine, Tuning.ll_pdl, device arch[, Tuning.ll_proxy_parts])
    param = request.param if hasattr(request, "param") else "kernel"
    copy, pdl, arch, parts = (param + (1,))[:4] if isinstance(param, tuple) else (param, True, "sm_90a", 1)
    tuning = Tuning(ll_proxy_parts=parts, ll_pdl=pdl)
    monkeypatch.setenv("UCCL_EP_IPC_COPY", copy)
    # real ipc proxies over host regions; with "kernel" their endpoints queue copies in rings
    proxies = make_group(R, "ipc", num_counters=NUM_COUNTERS, region_bytes=1 << 16,
                         ipc_copy="kernel" if copy == "kernel" else "")
    asked, launches = {}, []
    monkeypatch.setattr("uccl_ep.proxy.start_proxy", lambda group, **kw: asked.update(kw) or proxies[rank])
    monkeypatch.setattr(ll_proxy, "DeviceMemory", FakeMem)
    monkeypatch.setattr(proxy_session, "DeviceMemory", FakeMem)
    monkeypatch.setattr(ll_proxy, "load_kernel", lambda dev, src, name, defines=(): FakeKernel(launches, name, defines))
    monkeypatch.setattr(ll_proxy, "device_arch", lambda dev: arch)
    for mod in (ll, ll_proxy):  # the receive launch is the LL engine's (_dispatch_end)
        monkeypatch.setattr(mod, "current_stream", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    T, H, E = 16, 512, 8
    nbytes = low_latency_rdma_size_hint(T, H, R, E)
    ctx = SimpleNamespace(num_ranks=R, rank=rank, options={"num_proxy_threads": 2}, group=None, timeout_s=10.0,
                          topology=Topology(R, 1), enable_shrink=False, tuning=tuning)
    ex = EngineContext(ctx=ctx, device=0, drv=FakeDrv(), ll_mem=FakeMem(0, nbytes), error_dev_ptr=0xE000, errors=None,
                       timeout_ns=123, multi_host=False, mask_ptr=0xD000)
    session = _open_session(ex)
    eng = ProxyLowLatencyEngine(ex, session)
    yield SimpleNamespace(eng=eng, ex=ex, asked=asked, launches=launches, proxy=proxies[rank], T=T, H=H, E=E, R=R,
                          session=session)
    eng.close()
    session.close()
    stop_all(proxies)


def _open_session(ex):
    """The executor's proxy session over the LL buffer alone (proxy_session.open_for)."""
    return proxy_session.GpuProxySession(ex, ex.ll_mem, gpu_transport.choose(ex.multi_host))


def test_proxy_is_started_on_the_ll_buffer_over_ipc(engine):
    a = engine.asked
    assert a["transport"] == "ipc" and a["external_region"] == engine.ex.ll_mem.ptr
    assert a["region_bytes"] == engine.ex.ll_mem.nbytes and a["num_counters"] == NUM_COUNTERS
    assert a["ranks_per_node"] == 1 and a["num_threads"] == 2


def test_fifos_and_counters_are_registered_and_tabled(engine):
    eng, drv, p = engine.eng, engine.ex.drv, engine.proxy
    covered = lambda lo, hi: any(b <= lo and hi <= b + n for b, n in drv.registered)  # noqa: E731
    blob = eng.fifo_table_bytes()
    assert len(blob) == p.num_fifos * C.FIFO_LAYOUT_BYTES
    for f in range(p.num_fifos):
        lay = C.proxy_fifo_layout(p, f)
        assert covered(lay["slots"], lay["slots_end"])
        for k in ("tail", "completed", "status"):
            assert covered(lay[k], lay[k] + 8), k
        got = fifo_table_entry(blob, f, C.FIFO_LAYOUT_BYTES)
        for k in ("slots", "tail", "completed", "status"):
            assert got[k] == lay[k] + DEV, k    # host memory, through its device mapping
        # producer words in device memory, a cache line each
        assert got["head"] == eng.fifo_words.ptr + 128 * f and got["tail_cache"] == got["head"] + 64
        assert (got["capacity"], got["capacity_log2"]) == (lay["capacity"], lay["capacity_log2"])
    addr, nbytes = C.proxy_counters_address(p)
    assert covered(addr, addr + nbytes) and eng.counters_dev == addr + DEV
    assert nbytes == engine.R * NUM_COUNTERS * 8


def test_kernel_parameters_and_set_alternation(engine):
    eng, T, H, E, R = engine.eng, engine.T, engine.H, engine.E, engine.R
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, H, generator=g).bfloat16()
    topk = torch.rand(T, E, generator=g).topk(4, dim=1).indices
    w = torch.rand(T, 4, generator=g)
    log = engine.launches
    for it in range(2):
        # the second op as a Buffer in shrink mode would make it (a Buffer's shrink mode is fixed for its
        # life: the engine resolves it once per layout, so its parameter templates are dropped here)
        engine.ex.ctx.enable_shrink = bool(it)
        eng._template_cache.clear()
        out = eng.dispatch(None, x, topk, T, E, True, False, False, {1} if it else set(), None, None)
        handle, finish = out[2], out[3]
        lay = eng.layout
        s = 0  # dispatch on set 0, combine on set 1, every iteration
        name, grid, _, params, smem, _ = log[-2]
        d = _unpack("LLProxyDispatchParams", params)
        _assert_copy_launch(eng, log[-1], d)
        assert name == "ll_dispatch_proxy_send" and grid == T and smem == 12 * E
        assert d["fifos"] == eng.fifo_table.ptr and d["num_fifos"] == engine.proxy.num_fifos
        assert d["send_area"] == engine.ex.ll_mem.ptr + lay.send(s) and d["send_off"] == lay.send(s)
        assert d["recv_off"] == lay.recv(s) and d["counter"] == counter_base(s, 0)
        # the mask: the executor's device words (read by the kernels when they run), whatever the host set
        # says, in shrink mode; none (0: nothing read, nothing masked) otherwise
        shrink = bool(engine.ex.ctx.enable_shrink)
        assert d["payload_bytes"] == ProxyLayout.payload_bytes(H, True)
        assert d["mask"] == (engine.ex.mask_ptr if shrink else 0)
        # packed regions: one per peer, room for every token's selections of the peer's experts
        slots = T * min(4, E // R)
        # token | row << 16 per slot; a row per token (kernel_abi.h)
        assert d["max_slots"] == slots and d["counts_bytes"] >= 4 * (E // R) and d["idx_bytes"] >= 4 * slots
        assert d["region_bytes"] >= 16 + d["counts_bytes"] + d["idx_bytes"] + T * d["payload_bytes"]
        assert R * d["region_bytes"] <= lay.set_bytes // 2 and d["region_bytes"] % 16 == 0
        assert d["chunk_bytes"] == lay.chunk_bytes == write_chunk_bytes() <= CHUNK_BYTES < 1 << 24
        assert d["chunk_bytes"] % 16 == 0
        assert d["signal_total"] == lay.signal_total >= -(-d["region_bytes"] // CHUNK_BYTES) + 2
        finish()
        name, grid, _, params, _, _ = log[-1]
        r = _unpack("LLProxyDispatchRecvParams", params)
        assert name == "ll_dispatch_proxy_recv" and grid == E // R
        assert r["counters"] == eng.counters_dev and r["num_counters"] == NUM_COUNTERS
        assert r["counter"] == counter_base(s, 0) and r["recv_area"] == engine.ex.ll_mem.ptr + lay.recv(s)
        assert all(r[k] == d[k] for k in ("region_bytes", "counts_bytes", "idx_bytes", "payload_bytes", "max_slots",
                                          "signal_total"))
        assert r["status"] == eng.status_dev and r["timeout_ns"] == 123
        assert r["mask"] == d["mask"] and r["shrink"] == int(shrink)
        # the rank's own region: read in the send area; its counter is the receiver's device word
        assert r["send_area"] == d["send_area"] and d["self_counter"] == r["counter_cache"] + 8 * engine.ex.ctx.rank
        y = torch.zeros(E // R, R * T, H, dtype=torch.bfloat16)
        _, cfinish = eng.combine(y, topk, w, handle, set(), None, None, False)
        c = _unpack("LLProxyCombineParams", log[-2][3])
        _assert_copy_launch(eng, log[-1], c)
        assert c["counter"] == counter_base(1 - s, 1) and c["send_off"] == lay.send(1 - s)
        assert c["y"] == y.data_ptr() != c["send_area"] and c["zero_copy"] == 0
        assert c["row_split"] == 4  # Tuning.ll_stage_split's default
        assert c["region_bytes"] == T * min(4, E // R) * 2 * H and R * c["region_bytes"] <= lay.set_bytes // 2
        assert c["signal_total"] == lay.signal_total >= E // R + 2  # zero copy: E_loc writes + fenced
        cfinish()
        cr = _unpack("LLProxyCombineRecvParams", log[-1][3])
        assert log[-1][1] == T and cr["counter"] == counter_base(1 - s, 1) and cr["num_experts"] == E
        assert cr["region_bytes"] == c["region_bytes"] and cr["signal_total"] == c["signal_total"]
        assert cr["send_area"] == c["send_area"] and cr["zero_copy"] == 0 and cr["layout_range"] == handle[1].data_ptr()
        assert c["self_counter"] == cr["counter_cache"] + 8 * engine.ex.ctx.rank
        # the four (set, phase) pairs use disjoint rounds words
        assert len({r["rounds"], cr["rounds"], eng._rounds(1, 0), eng._rounds(0, 1)}) == 4
        # ... and disjoint counter caches and reader locks, inside the work area (zeroed by clean())
        words = [eng._counter_words(a, b) for a in (0, 1) for b in (0, 1)]
        assert {r["counter_cache"], cr["counter_cache"]} <= {w["counter_cache"] for w in words}
        assert r["counter_lock"] == eng._counter_words(s, 0)["counter_lock"] != cr["counter_lock"]
        spans = sorted([(w["counter_cache"], 8 * R) for w in words] + [(w["counter_lock"], 4 * R) for w in words] +
                       [(eng._rounds(a, b), 8 * R) for a in (0, 1) for b in (0, 1)] +
                       [(eng._finish(False), 4 * E), (eng._finish(True), 4 * E)])
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert spans[0][0] >= eng.work.ptr + 16 and spans[-1][0] + spans[-1][1] <= eng.work.ptr + eng.work.nbytes


def _assert_copy_launch(eng, launch, send):
    """The copy kernel follows the send kernel and reads the byte counters the send kernel adds to."""
    name, grid, block, params, _, programmatic = launch
    assert name == "ll_proxy_dma" and block == ll_proxy._DMA_BLOCK
    # plain stream order after its send kernel (ll_proxy._launch_copies)
    assert programmatic is False
    k = _unpack("LLProxyDmaParams", params)
    n = eng.num_proxy_threads
    assert grid == n * k["blocks_per_ring"] and k["num_rings"] == n == send["num_proxy_threads"]
    assert k["pushed"] == send["dma_pushed"] == eng.dma_pushed != 0
    # only the copy kernel, after the send kernel, reads the staged bytes: no system fence before the
    # pushes (OpRoute, device/proxy_ll.cuh)
    assert send["push_fence"] == 0
    assert k["status"] == eng.status_dev and k["error"] == eng.ec.error_dev_ptr and k["timeout_ns"] == 123
    # state, finish counters and the descriptor mirror follow the ring table and the byte counters,
    # without overlap (DmaConsumer 128 B, finish u32 and mirror 32 B per ring slot)
    cap = eng.proxy.copy_rings()[0]["capacity"]
    assert k["rings"] + 8 * n == k["pushed"] and k["pushed"] + 8 * n == k["state"]
    assert k["state"] + 128 * n == k["finish"] and k["finish"] + 4 * n * cap == k["mirror"]
    assert k["mirror"] + 32 * n * cap == eng.dma_mem.ptr + eng.dma_mem.nbytes


@pytest.mark.parametrize("engine,recv_pdl", [(("kernel", True, "sm_90a"), True), (("kernel", False, "sm_90a"), False),
                                             (("kernel", True, "sm_80"), False)],
                         indirect=["engine"], ids=["default", "pdl-off", "default-sm80"])
def test_copy_kernel_follows_its_send_kernel_in_stream_order(engine, recv_pdl):
    """The copy kernel follows its send kernel in plain stream order. The receive kernel after it
    starts by programmatic launch (Tuning.ll_pdl, sm_90+) when it follows the copy kernel directly;
    behind a receive hook, in plain stream order."""
    eng, T, E = engine.eng, engine.T, engine.E
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, engine.H, generator=g).bfloat16()
    topk = torch.rand(T, E, generator=g).topk(4, dim=1).indices
    out = eng.dispatch(None, x, topk, T, E, True, False, False, set(), None, None)
    name, *_, programmatic = engine.launches[-1]
    assert name == "ll_proxy_dma" and programmatic is False
    out[3]()
    name, *_, programmatic = engine.launches[-1]
    assert name == "ll_dispatch_proxy_recv" and programmatic is False
    assert eng.recv_pdl is recv_pdl
    out[3](True)  # the receive phase right after the send phase
    name, *_, programmatic = engine.launches[-1]
    assert name == "ll_dispatch_proxy_recv" and programmatic is recv_pdl


@pytest.mark.parametrize("engine", [("kernel", True, "sm_90a", 3)], indirect=True)
def test_proxy_parts_setting_reaches_send_kernels_and_layout(engine):
    """Tuning.ll_proxy_parts (an experiment): the send kernels are compiled with UCCL_EP_LL_PARTS
    (device/proxy_ll.cuh push_region), the receive kernels are not, and the counters' growth per op
    leaves room for a fenced Atomic and one more Write per part."""
    eng, T, E, R = engine.eng, engine.T, engine.E, engine.R
    assert eng.parts == 3
    defines = {k.name: k.defines for k in eng._k.values()}
    assert defines["ll_dispatch_proxy_send"] == defines["ll_combine_proxy_send"] == ("UCCL_EP_LL_PARTS=3",)
    assert defines["ll_dispatch_proxy_recv"] == defines["ll_combine_proxy_recv"] == ()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(T, engine.H, generator=g).bfloat16()
    topk = torch.rand(T, E, generator=g).topk(4, dim=1).indices
    eng.dispatch(None, x, topk, T, E, True, False, False, set(), None, None)
    one = ProxyLayout.make(T, engine.H, E, R, write_chunk_bytes())
    assert eng.layout.parts == 3 and eng.layout.signal_total == one.signal_total + 4
    d = _unpack("LLProxyDispatchParams", engine.launches[-2][3])
    assert d["signal_total"] == eng.layout.signal_total


def test_ranks_must_share_the_settings_of_the_counters_growth():
    """Tuning.ll_proxy_parts and .proxy_write_kb set signal_total: the executor gathers every rank's
    values and refuses differing ones by name, on every rank alike, instead of letting the receive
    kernels wait for a growth their peers never send; an invalid value never gets as far as a Tuning."""
    from uccl_ep.errors import InvalidArgument
    mine = ll_proxy.shared_settings(Tuning(ll_proxy_parts=2, proxy_write_kb=1024))
    assert mine == (2, 1024)
    ll_proxy.check_same_shared_settings([mine, mine, mine])
    with pytest.raises(InvalidArgument, match=r"tuning.ll_proxy_parts.*rank 1: 4/1024"):
        ll_proxy.check_same_shared_settings([mine, (4, 1024)])
    with pytest.raises(InvalidArgument, match="tuning.ll_proxy_parts"):
        Tuning(ll_proxy_parts=9)  # above its maximum


def test_signal_total_covers_every_part():
    """Per op and peer a region of W Writes spread over P parts adds at most W + P - 1 Writes' worth of
    fenced values plus P: signal_total (the counter's growth) stays above it, and is unchanged for P = 1."""
    for parts in (1, 2, 4, 8):
        lay = ProxyLayout.make(128, 7168, 288, 2, 1 << 20, parts)
        most_writes = -(-(lay.set_bytes // 2) // lay.chunk_bytes) + parts - 1
        assert lay.signal_total >= most_writes + parts
        assert lay.signal_total - 2 * parts == ProxyLayout.make(128, 7168, 288, 2, 1 << 20).signal_total - 2


@pytest.mark.parametrize("switch", [True, False])
def test_own_rows_stay_in_y_when_the_receive_follows(engine, switch):
    """Tuning.ll_own_rows_in_y (default on): combine without a receive hook (recv_follows)
    stages no rows for this rank (own_in_y) and the receive kernel reads them in y as in zero copy;
    behind a hook, or with the switch off, they are staged in the send area as before."""
    eng = engine.eng
    eng.own_rows_in_y = switch
    topk, w, handle, y = dispatched(engine, 11)
    for follows in (True, False):
        _, finish = eng.combine(y, topk, w, handle, set(), None, None, False, recv_follows=follows)
        c = _unpack("LLProxyCombineParams", engine.launches[-2][3])
        finish(follows_send=follows)
        cr = _unpack("LLProxyCombineRecvParams", engine.launches[-1][3])
        in_y = follows and switch
        assert c["own_in_y"] == int(in_y) and c["zero_copy"] == 0 and c["y"] == y.data_ptr()
        assert cr["zero_copy"] == int(in_y) and cr["layout_range"] == handle[1].data_ptr()
        assert cr["send_area"] == (y.data_ptr() if in_y else c["send_area"])


def test_copy_rings_are_registered_and_tabled(engine):
    eng, drv = engine.eng, engine.ex.drv
    rings = engine.proxy.copy_rings()
    assert engine.asked["ipc_copy"] == "kernel" and engine.proxy.transport_name == "ipc:kernel"
    assert len(rings) == eng.num_proxy_threads == 2
    table = struct.unpack("<2Q", drv.h2d[eng.dma_mem.ptr])
    for r, dev in zip(rings, table):
        assert any(b <= r["memory"] and r["memory"] + r["memory_bytes"] <= b + n for b, n in drv.registered)
        assert dev == r["memory"] + DEV and r["capacity"] == 8192
        # dma_ring.h: header + descriptors, in whole pages of their own (the runtime registers them)
        assert r["memory"] % 4096 == 0 and r["memory_bytes"] % 4096 == 0
        assert r["memory_bytes"] >= 64 + 32 * r["capacity"]


@pytest.mark.filterwarnings("ignore:.*CUDA_MODULE_LOADING:RuntimeWarning")
@pytest.mark.parametrize("engine", ["cuda"], indirect=True)
def test_cuda_copies_have_no_rings_and_no_copy_kernel(engine):
    eng = engine.eng
    assert engine.asked["ipc_copy"] == "" and not eng.copy_kernel and eng.dma_mem is None
    assert all(r is None for r in engine.proxy.copy_rings())
    x = torch.zeros(engine.T, engine.H).bfloat16()
    topk = torch.arange(4).repeat(engine.T, 1)
    eng.dispatch(None, x, topk, engine.T, engine.E, False, False, False, set(), None, None)
    assert engine.launches[-1][0] == "ll_dispatch_proxy_send"
    d = _unpack("LLProxyDispatchParams", engine.launches[-1][3])
    # the proxy's driver copies may read the staged bytes while the send kernel runs: fenced pushes
    assert d["dma_pushed"] == 0 and d["push_fence"] == 1


class _StopSpy:
    """The proxy, with its stop() noted in a log (to see what was released before it)."""

    def __init__(self, proxy, log):
        self._proxy, self._log = proxy, log

    def stop(self):
        self._log.append("stop")
        self._proxy.stop()

    def __getattr__(self, name):
        return getattr(self._proxy, name)


def test_close_unregisters_everything(engine):
    eng, drv, session = engine.eng, engine.ex.drv, engine.session
    bases = [b for b, _ in drv.registered]
    rings = [r["memory"] for r in engine.proxy.copy_rings()]
    session.proxy = _StopSpy(session.proxy, drv.unregistered)
    eng.close()  # the engine frees its own memory only: the proxy runs on
    assert drv.unregistered == [] and eng.proxy is None and not session.closed
    session.close()
    stopped = drv.unregistered.index("stop")
    drv.unregistered.remove("stop")
    assert sorted(drv.unregistered) == sorted(bases)
    # the copy rings (freed with their endpoints when the proxy stops) are unregistered before it
    assert len(rings) == 2 and sorted(drv.unregistered[:stopped]) == sorted(rings)
    eng.close()  # idempotent
    session.close()
    assert drv.unregistered.count(rings[0]) == 1  # once


def test_copy_kernel_timeout_names_the_proxy_thread():
    """A copy kernel that waited for its own proxy's descriptors raises Timeout naming this rank's
    proxy thread, not a peer (the device error word: code 1, phase 11, peer -1, expert = ring)."""
    from uccl_ep.cuda.executor import CudaExecutor
    from uccl_ep.errors import Timeout
    words = [1, 11, 3, -1, 2, 1_500_000]
    errors = SimpleNamespace(int32=lambda i: words[i], int32_array=lambda i, n: words[i:i + n])
    ex = SimpleNamespace(_failure=None, errors=errors, _ht=None, _ll=None, device=0)
    with pytest.raises(Timeout, match="copy ring of proxy thread 2") as info:
        CudaExecutor.check_error(ex)
    assert "ll_proxy_copy" in str(info.value) and "rank 3" in str(info.value) and "CPU proxy" in str(info.value)
    with pytest.raises(Timeout):  # sticky
        CudaExecutor.check_error(ex)


@pytest.mark.parametrize("T", [3, 8, 64, 128, 256])
@pytest.mark.parametrize("H", [128, 512, 2048, 7168])
def test_layout_fits_deepep_size_hint(T, H):
    for R, E in ((2, 2), (2, 32), (4, 64), (8, 256), (2, 288)):
        lay = ProxyLayout.make(T, H, E, R)
        assert 2 * lay.set_bytes <= low_latency_rdma_size_hint(T, H, R, E), (T, H, R, E)
        assert lay.set_bytes % 128 == 0 and lay.recv_off == lay.set_bytes // 2
        assert lay.recv_off >= E * T * 2 * H  # the zero-copy combine input: every local expert's rows
        for K in (1, 4, 8, 9):  # the packed regions of every top-k fit one area (send or recv)
            for fp8 in (False, True):
                assert R * lay.dispatch_region(K, fp8).region_bytes <= lay.set_bytes // 2, (T, H, R, E, K, fp8)
            assert R * lay.combine_region(K).region_bytes <= lay.set_bytes // 2, (T, H, R, E, K)


def test_write_size_setting():
    """Tuning.proxy_write_kb sets the largest Write; the counter growth per op follows it, and a
    size that would need more Writes per op than an Atomic can count is refused up front."""
    from uccl_ep.errors import InvalidArgument
    t = Tuning(proxy_write_kb=64)
    assert write_chunk_bytes(t) == 64 * 1024
    lay = ProxyLayout.make(128, 7168, 288, 2, write_chunk_bytes(t))
    assert lay.signal_total == -(-(lay.set_bytes // 2) // (64 * 1024)) + 2 > 144 + 2
    for bad in (0, 16384):
        with pytest.raises(InvalidArgument, match="tuning.proxy_write_kb"):
            Tuning(proxy_write_kb=bad)


def test_write_size_too_small_for_the_layout_is_refused(engine):
    """More Writes per (op, peer) than an Atomic's 15 bits can count: a typed error naming the
    setting, before any kernel runs."""
    from uccl_ep.errors import LimitExceeded
    eng = engine.eng
    eng.mem = FakeMem(0, 1 << 30)  # room for the big layout below, so only the Write count can fail
    eng.tuning = Tuning(proxy_write_kb=1)
    with pytest.raises(LimitExceeded, match="tuning.proxy_write_kb"):
        eng.ensure_layout(512, 7168, 8)
    eng.tuning = Tuning(proxy_write_kb=4096)
    lay = eng.ensure_layout(512, 7168, 8)
    assert lay.chunk_bytes == 4096 * 1024 and lay.signal_total <= (1 << 15) - 1


def test_forced_routes(monkeypatch):
    for name in ("UCCL_EP_FORCE_PROXY", "UCCL_EP_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)   # both ranks on this host
    ctx = SimpleNamespace(low_latency_mode=True, allow_nvlink_for_low_latency_mode=False, num_ranks=2)
    assert ll_proxy.proxy_forced(ctx)              # DeepEP's flag: LL through the network path
    ctx.allow_nvlink_for_low_latency_mode = True
    assert not ll_proxy.proxy_forced(ctx)
    monkeypatch.setenv("UCCL_EP_FORCE_PROXY", "1")
    assert ll_proxy.proxy_forced(ctx)
    assert ll_proxy.unavailable_reason(ctx) is None
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "fabric")   # no provider here registers GPU memory
    assert "FI_HMEM" in ll_proxy.unavailable_reason(ctx)
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "ipc")
    ctx.num_ranks = 65
    assert "at most 64" in ll_proxy.unavailable_reason(ctx)


def test_gpu_transport_choice(monkeypatch):
    """ipc on one host; between hosts only fabric with GPU memory (FI_HMEM), and only when asked for;
    transports that cannot reach GPU memory are refused with the reason."""
    from uccl_ep.cuda import gpu_transport
    from uccl_ep.errors import Unsupported
    monkeypatch.delenv("UCCL_EP_TRANSPORT", raising=False)
    assert gpu_transport.choose(False) == "ipc"
    with pytest.raises(Unsupported, match="UCCL_EP_TRANSPORT=fabric"):   # auto never picks an unproven path
        gpu_transport.choose(True)
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "ipc")
    assert gpu_transport.choose(False) == "ipc"
    assert "one host only" in gpu_transport.unavailable_reason(True)
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "loop")
    assert "cannot move GPU memory" in gpu_transport.unavailable_reason(False)
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "fabric")
    why = gpu_transport.unavailable_reason(True)     # the real probe: tcp;ofi_rxm has no FI_HMEM
    assert "FI_HMEM" in why and "tcp;ofi_rxm" in why
    monkeypatch.setattr(gpu_transport, "_probe_fabric", lambda: None)   # a GPUDirect-capable NIC
    assert gpu_transport.choose(True) == gpu_transport.choose(False) == "ipc+fabric"
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "ipc+fabric")
    assert gpu_transport.choose(True) == "ipc+fabric"


def test_fabric_probe_reports_host_and_gpu_regions():
    """The native probe behind the choice and `uccl-ep doctor`: tcp;ofi_rxm opens for host memory and
    refuses GPU memory with what it answered."""
    name, why = C.fabric_probe("tcp;ofi_rxm", "", -1)
    assert name == "fabric:tcp;ofi_rxm" and why == ""
    name, why = C.fabric_probe("tcp;ofi_rxm", "", 3)
    assert name == "" and "GPU 3" in why and "FI_HMEM" in why


def test_ll_engine_between_hosts_uses_fabric(monkeypatch):
    """Ranks on several hosts: the LL proxy engine starts its proxy on the fabric transport (and does
    not warn about lazy module loading, an ipc-only hazard)."""
    import warnings
    from uccl_ep.cuda import gpu_transport
    R = 2
    proxies = make_group(R, "loop", num_counters=NUM_COUNTERS, region_bytes=1 << 16)
    asked = {}
    monkeypatch.setattr("uccl_ep.proxy.start_proxy", lambda group, **kw: asked.update(kw) or proxies[0])
    monkeypatch.setattr(ll_proxy, "DeviceMemory", FakeMem)
    monkeypatch.setattr(proxy_session, "DeviceMemory", FakeMem)
    monkeypatch.setattr(ll_proxy, "load_kernel", lambda dev, src, name, defines=(): FakeKernel([], name, defines))
    monkeypatch.setattr(proxy_session, "_LOADING_WARNED", False)
    monkeypatch.setattr(gpu_transport, "_probe_fabric", lambda: None)
    monkeypatch.setenv("UCCL_EP_TRANSPORT", "fabric")
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    ctx = SimpleNamespace(num_ranks=R, rank=0, options={"num_proxy_threads": 2}, group=None, timeout_s=10.0,
                          topology=Topology(R, 1), enable_shrink=False, tuning=Tuning())
    ex = EngineContext(ctx=ctx, device=0, drv=FakeDrv(), ll_mem=FakeMem(0, 1 << 16), error_dev_ptr=0xE000, errors=None,
                       timeout_ns=123, multi_host=True, mask_ptr=0xD000)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            session = _open_session(ex)
            eng = ProxyLowLatencyEngine(ex, session)
        assert asked["transport"] == "ipc+fabric" and asked["external_region"] == ex.ll_mem.ptr
        eng.close()
        session.close()
    finally:
        stop_all(proxies)


def test_paths_of_a_group_on_several_hosts(monkeypatch):
    """The cuda executor's routing from every rank's (host, GPU): one node keeps NVLink paths unless
    the proxy is forced; several nodes put every path on the proxy kernels (LL: hybrid, per peer in
    test_ll_hybrid_paths.py) and need nodes inside hosts."""
    from uccl_ep.cuda.executor import plan_paths
    from uccl_ep.errors import Unsupported
    for name in ("UCCL_EP_FORCE_PROXY", "UCCL_EP_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    ctx = lambda R, G, nvlink=True: SimpleNamespace(topology=Topology(R, G), low_latency_mode=True,  # noqa: E731
                                                   allow_nvlink_for_low_latency_mode=nvlink, num_ranks=R)
    one_host = [("a", d) for d in range(4)]
    assert plan_paths(ctx(4, 4), one_host) == (False, False, False)        # NVLink kernels
    assert plan_paths(ctx(4, 4, nvlink=False), one_host) == (False, False, True)
    assert plan_paths(ctx(4, 2), one_host) == (False, True, True)          # GPUs as 2 nodes (LL hybrid)
    two_hosts = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert plan_paths(ctx(4, 2), two_hosts) == (True, True, True)          # LL through the proxy too
    assert plan_paths(ctx(4, 1), two_hosts) == (True, True, True)
    with pytest.raises(Unsupported, match="must share a host"):
        plan_paths(ctx(4, 4), two_hosts)                                    # one "node" over two hosts
    with pytest.raises(Unsupported, match="must share a host"):
        plan_paths(ctx(4, 2), [("a", 0), ("b", 0), ("a", 1), ("b", 1)])     # interleaved hosts
    with pytest.raises(Unsupported, match="distinct GPU"):
        plan_paths(ctx(4, 2), [("a", 0), ("a", 0), ("b", 0), ("b", 1)])


def test_multi_host_guess_prefers_the_launcher(monkeypatch):
    from uccl_ep.cuda.gpu_transport import multi_host_guess
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)     # one GPU visible per process
    ctx = SimpleNamespace(num_ranks=8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")                    # torchrun: all 8 ranks on this host
    assert not multi_host_guess(ctx)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert multi_host_guess(ctx)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert multi_host_guess(ctx)                                   # no launcher: GPUs this process sees
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert not multi_host_guess(ctx)


def test_copy_kernel_diagnostics_are_summed_over_rings(engine):
    """transport_counters() adds each ring's DmaConsumer diagnostic words (dma_ring.h) to the proxy's
    counters under copy_kernel_* names; the other words (ring positions, locks) stay out."""
    eng = engine.eng
    n, per = eng.num_proxy_threads, ll_proxy._DMA_CONSUMER_BYTES // 8
    words = [0] * (per * n)
    for r in range(n):
        for w in range(per):
            words[r * per + w] = 1000 * (r + 1) + w  # every word distinct
    eng.ec.drv.memcpy_htod(eng.dev, eng.dma_mem.ptr + 16 * n, struct.pack(f"<{per * n}Q", *words))
    got = eng.transport_counters()
    for key, w in ll_proxy._DMA_CONSUMER_DIAG_WORDS.items():
        assert got[f"copy_kernel_{key}"] == sum(1000 * (r + 1) + w for r in range(n)), key
    assert not any(k.startswith("copy_kernel_") and k[len("copy_kernel_"):] not in ll_proxy._DMA_CONSUMER_DIAG_WORDS
                   for k in got)
    assert "ipc_post_to_deliver_ns" in got  # the proxy's own counters come along
