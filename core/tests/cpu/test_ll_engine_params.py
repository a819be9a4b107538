"""The NVLink low-latency engine's kernel parameters (uccl_ep/cuda/ll.py), call after call: every field
of the four structs against the layout's formulas, while the token count, the flags and the buffer set
change between calls (the engine resolves the fixed fields once per layout: runtime.ParamTemplate)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine_fakes import FakeKernel, FakeMem, unpack_params
from uccl_ep.cuda import ll
from uccl_ep.cuda.engine_context import EngineContext
from uccl_ep.tuning import Tuning

pytestmark = pytest.mark.cpu

R, RANK, E, H, NUM_MAX, K = 2, 1, 8, 256, 6, 3
E_LOC = E // R


class _Drv:
    ATTR_SM_COUNT = 16

    def device_attribute(self, dev, attr):
        return 20

    def memcpy_htod(self, dev, ptr, blob):
        pass

    def memset_d8(self, dev, ptr, value, nbytes, stream):
        pass

    def synchronize(self, dev):
        pass


class _Kernel(FakeKernel):
    """The proxy path's fake kernel, each launch logged with the kernel's -D build too."""

    def launch(self, *args, **kwargs):
        super().launch(*args, **kwargs)
        name, *rest = self.log[-1]
        self.log[-1] = (name, self.defines, *rest)


@pytest.fixture
def engine(monkeypatch):
    launches = []
    monkeypatch.setattr(ll, "load_kernel", lambda dev, src, name, defines=(): _Kernel(launches, name, defines))
    monkeypatch.setattr(ll, "DeviceMemory", FakeMem)
    monkeypatch.setattr(ll, "device_arch", lambda dev: "sm_90a")
    monkeypatch.setattr(ll, "current_stream", lambda device=None: 0x77)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    mem = FakeMem(0, 1 << 24)
    ctx = SimpleNamespace(num_ranks=R, rank=RANK, enable_shrink=True, tuning=Tuning())
    ec = EngineContext(ctx=ctx, device=0, drv=_Drv(), timeout_ns=4321, errors=None, error_dev_ptr=0xE000,
                       mask_ptr=0xD000, ll_mem=mem, ll_peer_base=[mem.ptr, 1 << 44])
    return ll.LowLatencyEngine(ec), launches


def _ptr(t):
    return t.data_ptr() if t is not None else 0


def test_every_field_of_every_call(engine):
    eng, launches = engine
    g = torch.Generator().manual_seed(5)
    # (tokens, use_fp8, round_scale, use_ue8m0, stats tensors given, combine: zero_copy, logfmt, out given)
    calls = [(6, True, False, False, False, False, False, False), (2, False, False, False, True, True, False, True),
             (1, True, True, True, True, False, True, False), (5, True, False, False, False, False, False, True),
             (0, False, False, False, False, False, False, False), (6, True, True, False, True, True, False, False)]
    for T, fp8, round_scale, ue8m0, stats, zero_copy, logfmt, give_out in calls:
        x = torch.randn(T, H, generator=g).bfloat16()
        topk = torch.rand(T, E, generator=g).topk(K, dim=1).indices
        w = torch.rand(T, K, generator=g)
        cum = torch.zeros(E_LOC, dtype=torch.int32) if stats else None
        wait = torch.zeros(R, dtype=torch.int64) if stats else None
        s = eng.idx
        recv, count, handle, finish = eng.dispatch(None, x, topk, NUM_MAX, E, fp8, round_scale, ue8m0, set(), cum, wait)
        finish(True)
        lay = eng.layout
        (send_name, _, grid, block, send, smem, _), (recv_name, _, rgrid, rblock, rparams, _, pdl) = launches[-2:]
        assert (send_name, grid, block, smem) == ("ll_dispatch_send", max(T, 1), 512, 8 * E)
        assert (recv_name, rgrid, rblock, pdl) == ("ll_dispatch_recv", E_LOC, 256, True)
        work = eng.work.ptr
        assert unpack_params("LLDispatchParams", send) == dict(
            x=x.data_ptr(), topk_idx=topk.data_ptr(), peer_recv=work + 64 + 2 * s * 8 * R,
            peer_signal=work + 64 + (2 * s + 1) * 8 * R, seq=work + 4 * s, flag_off=lay.flag_off, num_tokens=T,
            num_max=NUM_MAX, hidden=H, num_topk=K, num_experts=E, num_ranks=R, rank=RANK, use_fp8=fp8,
            round_scale=round_scale, msg_bytes=2 * H, mask=0xD000, error=0xE000)
        recv_x, scales = recv if fp8 else (recv, None)
        src_info, layout_range = handle[0], handle[1]
        assert unpack_params("LLDispatchRecvParams", rparams) == dict(
            recv_area=eng.mem.ptr + s * lay.set_bytes + lay.recv_off, signal=eng.mem.ptr + lay.dispatch_signal_off(s),
            seq=work + 4 * s, done=work + 8 + 4 * s, flag_off=lay.flag_off, recv_x=recv_x.data_ptr(),
            recv_scales=_ptr(scales), recv_count=count.data_ptr(), src_info=src_info.data_ptr(),
            layout_range=layout_range.data_ptr(), cumulative_stats=_ptr(cum), wait_stats=_ptr(wait), error=0xE000,
            num_max=NUM_MAX, hidden=H, num_local_experts=E_LOC, num_ranks=R, rank=RANK, use_fp8=fp8,
            use_ue8m0=ue8m0, msg_bytes=2 * H, timeout_ns=4321, mask=0xD000, shrink=1)

        y = torch.randn(E_LOC, R * NUM_MAX, H, generator=g).bfloat16()
        out = torch.empty(T, H, dtype=torch.bfloat16) if give_out else None
        c_wait = torch.zeros(R, dtype=torch.int64) if stats else None
        s = eng.idx
        result, finish = eng.combine(y, topk, w, handle, set(), out, c_wait, zero_copy, use_logfmt=logfmt)
        finish(True)
        assert out is None or result is out
        (send_name, defines, grid, block, send, smem, _), (recv_name, rdefines, rgrid, rblock, rparams, _, _) = \
            launches[-2:]
        assert (send_name, grid, block, smem) == ("ll_combine_send", 2 * 20, 256, 4 * (2 * E + 1 + 2 * 256))
        assert (recv_name, rgrid, rblock) == ("ll_combine_recv", max(T, 1), eng.combine_recv_threads)
        assert defines == rdefines == (ll._LOGFMT if logfmt else ())
        y_ptr = eng.mem.ptr + s * lay.set_bytes + lay.send_off if zero_copy else y.data_ptr()
        assert unpack_params("LLCombineParams", send) == dict(
            y=y_ptr, src_info=src_info.data_ptr(), layout_range=layout_range.data_ptr(),
            peer_recv=work + 64 + 2 * s * 8 * R, seq=work + 4 * s, flag_off=lay.flag_off, num_max=NUM_MAX, hidden=H,
            num_local_experts=E_LOC, num_ranks=R, rank=RANK, mask=0xD000, meta_off=lay.meta_off)
        assert unpack_params("LLCombineRecvParams", rparams) == dict(
            recv_area=eng.mem.ptr + s * lay.set_bytes + lay.recv_off, seq=work + 4 * s, flag_off=lay.flag_off,
            done=work + 8 + 4 * s, topk_idx=topk.data_ptr(), topk_weights=w.data_ptr(), out=result.data_ptr(),
            wait_stats=_ptr(c_wait), error=0xE000, num_tokens=T, num_max=NUM_MAX, hidden=H, num_topk=K,
            num_local_experts=E_LOC, rank=RANK, timeout_ns=4321, meta_off=lay.meta_off, mask=0xD000, shrink=1)


def test_a_new_layout_drops_the_fixedunpack_params(engine):
    """A call of another (num_max, hidden, experts) lays the buffer out again: the next call's fields
    are the new layout's, not the cached ones of the old."""
    eng, launches = engine
    x, topk = torch.randn(2, H).bfloat16(), torch.tensor([[0, 1, 2], [5, 6, 7]])
    for num_max in (NUM_MAX, 2 * NUM_MAX, NUM_MAX):
        _, _, _, finish = eng.dispatch(None, x, topk, num_max, E, False, False, False, set(), None, None)
        finish()
        lay = eng.layout
        assert lay.num_max == num_max
        d = unpack_params("LLDispatchParams", launches[-2][4])
        r = unpack_params("LLDispatchRecvParams", launches[-1][4])
        assert d["num_max"] == r["num_max"] == num_max and d["flag_off"] == lay.flag_off
        s = eng.idx ^ 1  # the set this call used
        assert d["peer_recv"] == eng.work.ptr + 64 + 2 * s * 8 * R
        assert r["recv_area"] == eng.mem.ptr + s * lay.set_bytes + lay.recv_off
