"""LogFMT-10 combine (low_latency_combine(use_logfmt=True)): the reference encode/decode
(uccl_ep.refs.logfmt) and the combine of the reference and host backends on 2 CPU ranks."""

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer
from uccl_ep.errors import InvalidArgument, LimitExceeded
from uccl_ep.refs import logfmt
from uccl_ep.utils import calc_diff

from engine_fakes import dispatched, unpack_params as _unpack
from test_ipc_transport_proxy_path import engine  # noqa: F401 - the recording engine fixture

pytestmark = pytest.mark.cpu


def _rows(n, h, seed, scale=0.1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, h, generator=g) * scale).to(torch.bfloat16)


def test_byte_counts_are_deepeps():
    assert logfmt.message_bytes(7168) == 7168 * 10 // 8 + 56 * 4 == 9184
    assert logfmt.max_message_bytes(7168) == 2 * 7168 + 56 * 4


def test_round_trip_error_bound_per_division():
    x = _rows(64, 1024, 1)
    enc = logfmt.encode(x)
    assert bool(enc.cast.all())  # randn * 0.1 in BF16: every |x| < 1 and not all equal
    y = logfmt.decode(enc)
    assert y.dtype == torch.float32 and not bool(torch.isnan(y).any())
    cast, log_amin, step, _, _ = logfmt.division_params(enc.amax, enc.amin)
    xf = x.float().view(64, 8, 128)
    err = (y.view(64, 8, 128) - xf).abs()
    s = step.unsqueeze(2).double()
    # nearest level in linear scale: relative error at most (2^s - 1) / (2^s + 1), plus fp32 ulps
    rel = ((torch.exp2(s) - 1) / (torch.exp2(s) + 1) + 1e-6).float()
    floor_level = torch.exp2(log_amin.double()).float().unsqueeze(2)
    above = xf.abs() >= floor_level
    assert bool((err <= rel * xf.abs())[above].all())
    assert bool((err <= floor_level)[~above].all())  # below the clipped range: 0 or the lowest level
    # signs survive, zeros stay zero
    assert bool(((y.view(64, 8, 128) * xf) >= 0).all())


def test_codes_are_10_bits_and_span_the_range():
    x = _rows(8, 256, 2)
    enc = logfmt.encode(x)
    mag = enc.codes.int() & 0x1FF
    assert int(enc.codes.int().max()) < 1024 and int(enc.codes.int().min()) >= 0
    # the largest magnitude of a cast division gets the top code, the smallest the first level
    per_div = mag.view(8, 2, 128)
    assert bool((per_div.amax(dim=2) == logfmt.MAX_CODE).all())
    assert bool((per_div.amin(dim=2) <= 2).all())


def test_fallback_where_it_does_not_pay():
    h = 6 * 128
    x = _rows(2, h, 3).view(2, 6, 128).clone()
    x[0, 0, 5] = 1.5                 # a value >= 1: BF16
    x[0, 1] = -0.25                  # all magnitudes equal: BF16
    x[0, 2] = 0.0                    # all zero: BF16
    x[0, 3, 7] = float("nan")        # NaN: BF16 (propagates as in the BF16 combine)
    x[0, 4, 9] = float("inf")        # Inf: BF16
    x[0, 5, :64] = 0.0               # zeros among small values: cast, zeros decode to 0
    x = x.view(2, h)
    enc = logfmt.encode(x)
    assert enc.cast[0].tolist() == [False, False, False, False, False, True]
    assert bool(enc.cast[1].all())
    y = logfmt.decode(enc)
    fb = ~enc.cast.repeat_interleave(128, dim=1)
    assert torch.equal(y[fb].view(torch.int32), x.float()[fb].view(torch.int32))  # bit for bit, NaN included
    assert bool((y[0, 5 * 128:5 * 128 + 64] == 0).all())
    assert not bool(torch.isnan(y[:, 5 * 128:]).any()) and not bool(torch.isnan(y[1]).any())


def test_tiny_values_below_the_clip_decode_to_zero_or_the_lowest_level():
    x = torch.full((1, 128), 0.5, dtype=torch.float32)
    x[0, 1] = 0.25
    x[0, 2] = 2.0 ** -40             # more than 32 octaves below amax
    enc = logfmt.encode(x.to(torch.bfloat16))
    assert bool(enc.cast.all())
    y = logfmt.decode(enc)
    assert float(y[0, 2]) in (0.0, float(2.0 ** (torch.log2(torch.tensor(0.5)) - 32)))
    assert float(y[0, 0]) == 0.5 and float(y[0, 1]) == pytest.approx(0.25, rel=0.03)


def test_round_trip_is_row_independent_and_deterministic():
    x = _rows(33, 512, 4)
    whole = logfmt.round_trip(x)
    parts = torch.cat([logfmt.round_trip(x[i:i + 1]) for i in range(33)])
    assert torch.equal(whole.view(torch.int32), parts.view(torch.int32))
    assert logfmt.round_trip(x[:0]).shape == (0, 512)


def _worker(rank, world, backend):
    T, H, E, K = 12, 512, 4 * world, 3
    g = torch.Generator().manual_seed(100 + rank)
    rdma = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    buf = Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=E // world, backend=backend)
    topk = (torch.randn(T, E, generator=g).abs() + 1).topk(K, dim=-1).indices.sort(dim=-1).values
    topk[3, 1] = -1
    w = torch.randn(T, K, generator=g).abs()
    out = {}
    for name, x in (("const", torch.full((T, H), 0.0, dtype=torch.bfloat16).add_(-0.37)),  # DeepEP's (rank-128) rows, scaled below 1
                    ("rand", (torch.randn(T, H, generator=g) * 0.1).to(torch.bfloat16)),
                    ("big", (torch.randn(T, H, generator=g) * 4).to(torch.bfloat16))):  # mostly BF16 fallback
        for use_fp8 in (True, False):
            recv, _, handle, _, _ = buf.low_latency_dispatch(x, topk, T, E, use_fp8=use_fp8)
            y = (recv[0].float() * recv[1].repeat_interleave(128, dim=2)).to(torch.bfloat16) if use_fp8 else recv
            bf16, _, _ = buf.low_latency_combine(y, topk, w, handle)
            lf, _, _ = buf.low_latency_combine(y, topk, w, handle, use_logfmt=True)
            assert lf.dtype == torch.bfloat16 and lf.shape == (T, H) and not bool(torch.isnan(lf).any())
            # DeepEP's test: calc_diff(x * sum(w), combined) < 9e-4 with FP8 dispatch, for LogFMT too
            expect = x.float() * w.masked_fill(topk < 0, 0).sum(1, keepdim=True)
            if use_fp8:
                assert calc_diff(expect, lf) < 9e-4, (name, calc_diff(expect, lf))
            assert calc_diff(bf16.float(), lf) < 9e-4, (name, calc_diff(bf16.float(), lf))
            if name == "rand":
                assert not torch.equal(bf16, lf)  # the rows did go through LogFMT
            out[(name, use_fp8)] = lf
    # zero_copy with LogFMT is refused, as DeepEP does
    recv, _, handle, _, _ = buf.low_latency_dispatch(_rows(T, H, 9), topk, T, E, use_fp8=False)
    with pytest.raises(InvalidArgument, match="zero_copy"):
        buf.low_latency_combine(recv, topk, w, handle, use_logfmt=True, zero_copy=True)
    return {k: v.view(torch.int16).tolist() for k, v in out.items()}


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_logfmt_combine_within_deepeps_tolerance(backend):
    run_ranks(_worker, 2, backend)


def test_host_logfmt_combine_equals_the_reference_bit_for_bit():
    ref = run_ranks(_worker, 2, "reference")
    host = run_ranks(_worker, 2, "host")
    assert ref == host


_SHAPES = [(T, H, R, E) for T in (1, 3, 16, 128) for H in (128, 384, 640, 2048, 7168) for R in (2, 4, 8)
           for E in (R, 3 * R, 64, 288) if E % R == 0]


def test_nvlink_layout_has_room_for_logfmt_within_deepeps_hint():
    from uccl_ep.cuda.ll import _Layout
    for T, H, R, E in _SHAPES:
        lay = _Layout.make(T, H, E, R)
        assert 2 * lay.set_bytes <= Buffer.get_low_latency_rdma_size_hint(T, H, R, E), (T, H, R, E)
        assert lay.meta_off >= lay.flag_off + E * T * 8  # past the row flags
        assert lay.recv_off + lay.meta_off + E * T * H // 32 <= lay.sig_off  # before the signals
        assert E * T * 2 * H <= lay.flag_off  # a LogFMT row stays in its BF16 row's room


def test_proxy_layout_has_room_for_logfmt_within_deepeps_hint():
    from uccl_ep.cuda.ll_proxy import ProxyLayout
    for T, H, R, E in _SHAPES:
        hint = Buffer.get_low_latency_rdma_size_hint(T, H, R, E)
        bf16_only, lay = ProxyLayout.make(T, H, E, R), ProxyLayout.make(T, H, E, R, budget=hint)
        if 2 * bf16_only.set_bytes > hint:
            continue  # a tiny shape the proxy path refuses in BF16 too (LimitExceeded at set-up)
        assert 2 * lay.set_bytes <= hint, (T, H, R, E)
        e_loc = E // R
        for K in (1, 8, e_loc):
            assert lay.combine_region(K).region_bytes == T * min(K, e_loc) * 2 * H  # BF16 as before
            need = T * min(K, e_loc) * (2 * H + H // 32)
            try:
                assert lay.combine_region(K, True).region_bytes >= need
            except LimitExceeded:  # only where the hint leaves no room for 16-byte aligned regions
                assert 4 * R * ((need + 15) // 16 * 16) > hint, (T, H, R, E, K)


def test_proxy_logfmt_combine_below_the_hint_is_a_typed_error():
    from uccl_ep.cuda.ll_proxy import ProxyLayout
    lay = ProxyLayout.make(16, 7168, 8, 2)  # no room beyond the BF16 layout
    lay.combine_region(4)
    with pytest.raises(LimitExceeded, match="num_rdma_bytes"):
        lay.combine_region(4, True)


def _device_code_on_host(x: torch.Tensor, tmp_path, layout: int) -> tuple[torch.Tensor, bool]:
    """Run device/logfmt.cuh's per-lane code on the CPU (data/logfmt_host/logfmt_host.cc): the rows
    decoded, and whether a division fell back."""
    import shutil
    import struct
    import subprocess
    from pathlib import Path

    from uccl_ep.cuda import jit
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    here = Path(__file__).parent / "data" / "logfmt_host"
    exe = tmp_path / "logfmt_host"
    subprocess.run([cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-Wno-unknown-pragmas", f"-I{here}",
                    f"-I{jit.include_dir()}", str(here / "logfmt_host.cc"), "-o", str(exe)], check=True, timeout=120)
    n, h = x.shape
    blob = struct.pack("<III", n, h, layout) + x.contiguous().view(torch.int16).numpy().tobytes()
    out = subprocess.run([str(exe)], input=blob, capture_output=True, check=True, timeout=60).stdout
    assert len(out) == 4 * n * h + 1
    return torch.frombuffer(bytearray(out[:-1]), dtype=torch.float32).view(n, h), out[-1] == 1


@pytest.mark.parametrize("layout", [0, 1], ids=["nvlink-slots", "proxy-region"])
def test_device_encode_decode_equals_the_reference_bit_for_bit(tmp_path, layout):
    """The kernels' per-lane encode (extremes, levels, codes, lane-pair words, parts A / B, meta
    words) and decode, run on the CPU, give refs.logfmt's round trip bit for bit: the bit layout and
    the float ops agree, in the NVLink row slots and in a proxy region -- there also when the
    region's Write stops after the meta words because every division was cast."""
    g = torch.Generator().manual_seed(7)
    rows = [(torch.randn(40, 1024, generator=g) * 0.1),
            (torch.randn(8, 1024, generator=g) * 0.3).clamp(-0.99, 0.99),
            torch.rand(8, 1024, generator=g) * 1e-3 - 5e-4]
    mixed = (torch.randn(8, 1024, generator=g) * 0.05)
    mixed[:, :64] = 0
    mixed[:, 300] = 3.0
    mixed[1, 600] = float("nan")
    mixed[2, 700] = 2.0 ** -40
    mixed[3, 896:] = -0.125
    for x, any_fallback in ((torch.cat([mixed] + rows).to(torch.bfloat16), True),
                            (torch.cat(rows).to(torch.bfloat16), False)):
        got, fell_back = _device_code_on_host(x, tmp_path, layout)
        assert fell_back == any_fallback
        want = logfmt.round_trip(x)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_proxy_engine_launches_the_logfmt_build_with_its_regions(engine):
    """The proxy path's host side (recording fakes, test_ipc_transport_proxy_path): use_logfmt
    launches the -DUCCL_EP_LL_LOGFMT=1 kernels, with regions of 2H + H/32 bytes per row, and stages
    this rank's own rows (they are encoded) instead of leaving them in y."""
    eng, T, H, E, R = engine.eng, engine.T, engine.H, engine.E, engine.R
    assert all(k.defines[-1] == "UCCL_EP_LL_LOGFMT=1" for k in eng._k_logfmt.values())
    assert all("UCCL_EP_LL_LOGFMT=1" not in k.defines for k in eng._k.values())
    own = []
    for k in eng._k_logfmt.values():
        k.log = own
    topk, w, handle, y = dispatched(engine, 12)
    _, finish = eng.combine(y, topk, w, handle, set(), None, None, False, recv_follows=True, use_logfmt=True)
    finish(follows_send=True)
    assert [name for name, *_ in own] == ["ll_combine_proxy_send", "ll_combine_proxy_recv"]
    c, cr = _unpack("LLProxyCombineParams", own[0][3]), _unpack("LLProxyCombineRecvParams", own[1][3])
    region = eng.layout.combine_region(4, True).region_bytes
    assert c["region_bytes"] == cr["region_bytes"] == region >= T * min(4, E // R) * (2 * H + H // 32)
    assert c["own_in_y"] == 0 and c["zero_copy"] == 0 and cr["zero_copy"] == 0 and cr["send_area"] == c["send_area"]
    n = len(engine.launches)
    eng.combine(y, topk, w, handle, set(), None, None, False, recv_follows=True)[1](follows_send=True)
    assert len(own) == 2 and len(engine.launches) == n + 3  # BF16: the usual kernels (and the copy kernel)


def test_a_refused_logfmt_combine_leaves_the_engine_as_it_was(engine, monkeypatch):
    """A LogFMT combine whose regions do not fit the buffer is refused before anything changes: the
    buffer set does not flip and nothing is launched, so the next ops stay in step with the peers."""
    from uccl_ep.cuda.ll_proxy import ProxyLayout
    eng = engine.eng
    topk, w, handle, y = dispatched(engine, 13)
    fits = ProxyLayout.combine_region

    def no_room_for_logfmt(self, num_topk, logfmt=False):
        if logfmt:
            raise LimitExceeded("num_rdma_bytes", "bytes of a combine area", 2, 1)
        return fits(self, num_topk, logfmt)
    monkeypatch.setattr(ProxyLayout, "combine_region", no_room_for_logfmt)
    idx, launches = eng.idx, len(engine.launches)
    with pytest.raises(LimitExceeded, match="num_rdma_bytes"):
        eng.combine(y, topk, w, handle, set(), None, None, False, recv_follows=True, use_logfmt=True)
    assert eng.idx == idx and len(engine.launches) == launches
    eng.combine(y, topk, w, handle, set(), None, None, False, recv_follows=True)[1](follows_send=True)
    assert eng.idx == idx ^ 1
