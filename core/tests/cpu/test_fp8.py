"""DeepEP's per-128-channel FP8 cast, checked against hand-computed values."""

import math

import pytest
import torch

from uccl_ep.refs.fp8 import pack_ue8m0, per_token_cast_back, per_token_cast_to_fp8, unpack_ue8m0

pytestmark = pytest.mark.cpu


def test_scale_is_amax_over_448_per_block():
    x = torch.zeros(1, 256)
    x[0, 5] = -3.5          # block 0 amax 3.5
    x[0, 200] = 0.25        # block 1 amax 0.25
    q, s = per_token_cast_to_fp8(x)
    inv448 = torch.tensor(1 / 448, dtype=torch.float32)
    assert torch.equal(s[0], torch.tensor([3.5, 0.25]) * inv448)
    # the amax element maps to exactly +-448 (the top of e4m3)
    assert q[0, 5].float().item() == -448.0 and q[0, 200].float().item() == 448.0
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32


def test_amax_floor():
    q, s = per_token_cast_to_fp8(torch.zeros(2, 128))
    assert torch.allclose(s, torch.full((2, 1), 1e-4 / 448))
    assert torch.count_nonzero(q.float()) == 0


def test_round_scale_is_power_of_two_ceil():
    x = torch.zeros(1, 128)
    x[0, 0] = 100.0  # 100/448 = 0.2232 -> 2^ceil(log2) = 0.25
    x[0, 1] = 96.0
    q, s = per_token_cast_to_fp8(x, round_scale=True)
    assert s.item() == 0.25
    assert q[0, 1].float().item() == 384.0  # 96 / 0.25, exact in e4m3
    assert q[0, 0].float().item() == 384.0  # 400 is a tie between 384 and 416: round to even
    x[0, 0] = 448.0 * 0.5  # exactly a power of two: no rounding up
    _, s = per_token_cast_to_fp8(x, round_scale=True)
    assert s.item() == 0.5


def test_cast_back_relative_error_fresh_inputs():
    x = torch.randn(64, 1024) * torch.rand(64, 1) * 10
    for rs in (False, True):
        q, s = per_token_cast_to_fp8(x, round_scale=rs)
        back = per_token_cast_back(q, s)
        rel = ((back - x).abs() / x.abs().clamp_min(1e-3)).median().item()
        assert rel < 0.07, rel


def test_ue8m0_pack_unpack_by_hand():
    scales = torch.tensor([[2.0 ** -3, 2.0 ** 0, 2.0 ** 5, 2.0 ** -127 * 2]], dtype=torch.float32)
    packed = pack_ue8m0(scales)
    assert packed.dtype == torch.int32 and packed.shape == (1, 1)
    expect = (124) | (127 << 8) | (132 << 16) | (1 << 24)
    assert packed.item() == expect
    assert torch.equal(unpack_ue8m0(packed), scales)
    # high byte >= 128 wraps into a negative int32
    big = torch.tensor([[1.0, 1.0, 1.0, 2.0 ** 10]])
    assert pack_ue8m0(big).item() == (127 | 127 << 8 | 127 << 16 | 137 << 24) - (1 << 32)
    assert torch.equal(unpack_ue8m0(pack_ue8m0(big)), big)


def test_cast_back_accepts_packed_scales():
    x = torch.randn(4, 512)
    q, s = per_token_cast_to_fp8(x, round_scale=True)
    assert torch.equal(per_token_cast_back(q, pack_ue8m0(s)), per_token_cast_back(q, s))
    assert math.isfinite(per_token_cast_back(q, s).sum().item())
