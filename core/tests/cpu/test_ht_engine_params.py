"""The NVLink normal-mode engine's ring kernel parameters (uccl_ep/cuda/ht.py), call after call: every
field of HTNotifyParams, HTDispatchParams and HTCombineParams against the call's tensors and the engine's state, while
the shapes, the scales and the tensors change between calls (the engine packs them through
runtime.ParamCache: fixed values key a template, pointers are packed per call)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine_fakes import FakeKernel, FakeMem, unpack_params
from uccl_ep.cuda import ht, runtime

pytestmark = pytest.mark.cpu

R, RANK, G, GC, C, SLOTS, SLOT_BYTES = 2, 1, 16, 12, 6, 128, 1 << 14


class _Handle(tuple):
    plan: SimpleNamespace


class _Counts:
    """The mapped host page the notify kernel fills: its flag reads as the engine's current tag, the
    receive count as ROWS, the per-source and per-expert counts as 1, 2, ..."""

    dev_ptr = 0x5000_0000
    ROWS = 37

    def __init__(self, eng_of):
        self._eng_of = eng_of

    def int32(self, i):
        assert i == ht._HOST_OFF_INTS
        return self._eng_of().host_tag

    def int32_array(self, start, n):
        assert start == ht._HOST_OFF_INTS + 1
        return [self.ROWS] + list(range(1, n))


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(ht, "current_stream", lambda *a: 0x5150)
    log: list = []
    eng = ht.NormalEngine.__new__(ht.NormalEngine)
    eng.__dict__.update(
        R=R, rank=RANK, G=G, Gc=GC, block=R * G * 32, combine_block=R * GC * 32, combine_smem=0,
        peers=FakeMem(0, 8 * R), work=FakeMem(0, 4096), geometry=(C, SLOTS),
        slot_bytes=SLOT_BYTES, _num_experts=0, host_tag=7,
        ce=SimpleNamespace(enabled=False, dispatch_layout_for=lambda *a: None),
        ec=SimpleNamespace(error_dev_ptr=0x6000_0000, timeout_ns=123_456_789, check_error=lambda: None,
                           owner=None, ctx=SimpleNamespace(timeout_s=5.0), errors=_Counts(eng_of=lambda: eng)),
        _k={n: FakeKernel(log, n) for n in ("ht_notify", "ht_dispatch", "ht_combine")},
        _notify_params=runtime.ParamCache("HTNotifyParams", ht.NOTIFY_POINTERS, ht.NOTIFY_FIXED),
        _dispatch_params=runtime.ParamCache("HTDispatchParams", ht.DISPATCH_POINTERS, ht.DISPATCH_FIXED),
        _combine_params=runtime.ParamCache("HTCombineParams", ht.COMBINE_POINTERS, ht.COMBINE_FIXED))
    eng.log = log
    assert (eng._sent, eng._consumed) == (eng.work.ptr, eng.work.ptr + 64 * ht._MAX_CHANNELS)
    return eng


def _ptr(t):
    return t.data_ptr() if t is not None else 0


@pytest.mark.parametrize("seed", range(4))
def test_dispatch_and_combine_params_follow_each_call(engine, seed):
    gen = torch.Generator().manual_seed(seed)
    for call in range(6):
        T = int(torch.randint(1, 40, (1,), generator=gen))
        H = 128 * int(torch.randint(1, 4, (1,), generator=gen))
        fp8 = bool(call % 2)
        K = int(torch.randint(0, 5, (1,), generator=gen)) if call % 3 else 0
        rows = int(torch.randint(T, 3 * T + 1, (1,), generator=gen))
        x = torch.empty(T, H, dtype=torch.uint8 if fp8 else torch.bfloat16)
        scales = torch.empty(H // 128, T).t() if fp8 else None  # column-major, as DeepEP's tests pass them
        idx = torch.empty(T, K, dtype=torch.int64) if K else None
        w = torch.empty(T, K) if K else None
        in_rank = torch.empty(T, R, dtype=torch.bool)
        outs = (torch.empty(rows, H, dtype=x.dtype), torch.empty(rows, H // 128) if fp8 else None,
                torch.empty(rows, K, dtype=torch.int64) if K else None, torch.empty(rows, K) if K else None,
                torch.empty(rows, dtype=torch.int32) if call % 2 == 0 else None,
                torch.empty(T, R, dtype=torch.int32) if call % 2 == 0 else None)
        mats = (torch.empty(R, R, dtype=torch.int32), torch.empty(R, C, dtype=torch.int32))
        engine._num_experts = 8 * (call + 1)
        engine._launch_dispatch(x, scales, idx, w, in_rank, outs, mats, C, rows)
        name, grid, block, params, _, _ = engine.log[-1]
        assert (name, grid, block) == ("ht_dispatch", 2 * C, R * G * 32)
        assert unpack_params("HTDispatchParams", params) == dict(
            x=x.data_ptr(), x_scales=_ptr(scales), topk_idx=_ptr(idx), topk_weights=_ptr(w),
            is_token_in_rank=in_rank.data_ptr(), peer_buf=engine.peers.ptr, sent=engine._sent,
            consumed=engine._consumed, recv_x=outs[0].data_ptr(), recv_scales=_ptr(outs[1]),
            recv_topk_idx=_ptr(outs[2]), recv_topk_weights=_ptr(outs[3]), recv_src_idx=_ptr(outs[4]),
            send_head=_ptr(outs[5]), rank_prefix=mats[0].data_ptr(), recv_channel_prefix=mats[1].data_ptr(),
            error=0x6000_0000, num_tokens=T, hidden_bytes=H * x.element_size(),
            num_scales=H // 128 if fp8 else 0, scale_stride_token=1 if fp8 else 0, scale_stride_col=T if fp8 else 0,
            num_topk=K, num_experts=8 * (call + 1), num_ranks=R, rank=RANK, num_channels=C, ring_slots=SLOTS,
            slot_bytes=SLOT_BYTES, warps_per_peer=G, num_rows=rows, timeout_ns=123_456_789)

        y = torch.empty(rows, H, dtype=torch.bfloat16)
        handle = _Handle((torch.empty(R, R, dtype=torch.int32), torch.empty(R, C, dtype=torch.int32),
                          torch.empty(R, C, dtype=torch.int32), None, in_rank, torch.empty(T, R, dtype=torch.int32)))
        handle.plan = SimpleNamespace(num_tokens=T, num_rows=rows, num_channels=C)
        wy = torch.empty(rows, K) if K else None
        biases = (torch.empty(T, H, dtype=torch.bfloat16), None) if call % 2 else (None, None)
        out, out_w = engine.combine(y, handle, wy, biases, SimpleNamespace(num_max_nvl_chunked_recv_tokens=SLOTS))
        name, grid, block, params, _, _ = engine.log[-1]
        assert (name, grid, block) == ("ht_combine", 2 * C, R * GC * 32)
        assert unpack_params("HTCombineParams", params) == dict(
            x=y.data_ptr(), topk_weights=_ptr(wy), bias0=_ptr(biases[0]), bias1=0, out=out.data_ptr(),
            out_weights=_ptr(out_w), is_token_in_rank=in_rank.data_ptr(), send_head=handle[5].data_ptr(),
            peer_buf=engine.peers.ptr, sent=engine._sent, consumed=engine._consumed,
            rank_prefix=handle[0].data_ptr(), recv_channel_prefix=handle[2].data_ptr(), error=0x6000_0000,
            num_tokens=T, hidden=H, num_topk=K, num_ranks=R, rank=RANK, num_channels=C, ring_slots=SLOTS,
            slot_bytes=SLOT_BYTES, warps_per_peer=GC, timeout_ns=123_456_789)


def test_fresh_dispatch_notify_params_follow_each_call(engine):
    """The notify kernel's parameters (tag, counts' outputs, routing inputs) of fresh dispatches with
    changing shapes, and the dispatch that follows it sized by the counts the page reports."""
    gen = torch.Generator().manual_seed(3)
    for call in range(5):
        T, E, K = 8 + call, 8 * (call + 1), 1 + call % 3
        x = torch.empty(T, 256, dtype=torch.bfloat16)
        idx, w = torch.zeros(T, K, dtype=torch.int64), torch.empty(T, K)
        in_rank, ntpe = torch.empty(T, R, dtype=torch.bool), torch.zeros(E, dtype=torch.int32)
        config = SimpleNamespace(num_channels=C, num_max_nvl_chunked_recv_tokens=SLOTS, num_sms=2 * C)
        recv_x, _, recv_idx, _, per_expert, handle = engine.dispatch(x, None, idx, w, None, in_rank, ntpe, 1 + call,
                                                                     0, config)
        (n_name, _, n_block, n_params, _, _), (d_name, _, _, d_params, _, _) = engine.log[-2:]
        assert (n_name, n_block, d_name) == ("ht_notify", 512, "ht_dispatch")
        notify = unpack_params("HTNotifyParams", n_params)
        assert notify == dict(
            is_token_in_rank=in_rank.data_ptr(), num_tokens_per_expert=ntpe.data_ptr(), peer_buf=engine.peers.ptr,
            seq=engine._seq, rank_prefix=handle[0].data_ptr(), channel_prefix=handle[1].data_ptr(),
            recv_channel_prefix=handle[2].data_ptr(), host=_Counts.dev_ptr + 4 * ht._HOST_OFF_INTS,
            error=0x6000_0000, host_tag=engine.host_tag, num_tokens=T, num_ranks=R, rank=RANK, num_channels=C,
            num_experts=E, expert_alignment=1 + call, num_worst_tokens=0, timeout_ns=123_456_789)
        assert recv_x.shape == (_Counts.ROWS, 256) and recv_idx.shape == (_Counts.ROWS, K)
        assert per_expert == list(range(1 + R, 1 + R + E // R))
        dispatch = unpack_params("HTDispatchParams", d_params)
        assert (dispatch["send_head"], dispatch["num_rows"], dispatch["num_topk"]) == (
            handle[5].data_ptr(), _Counts.ROWS, K)
