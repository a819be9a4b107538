"""FP8 e4m3 per-128-channel casting exactly as DeepEP's low-latency dispatch kernel does it.

Bitwise contract (the kernels of uccl_ep implement the same float32 arithmetic):
- amax = max(|x|) over each 128-channel block of a token, floored at 1e-4;
- plain:       scale = 448 / amax,          scale_inv = amax * fp32(1/448);
- round_scale: e = ceil(log2(amax * fp32(1/448))) taken from the float's bits,
               scale = 2**-e, scale_inv = 2**e;
- q = e4m3(saturate(x * scale)), round-to-nearest-even;
- UE8M0: the exponent byte of scale_inv (bits 23..30), four consecutive blocks packed in one
  int32, lowest block in the lowest byte.
"""

from __future__ import annotations

import torch

def _dense(t: torch.Tensor) -> torch.Tensor:
    """A copy with standard strides (``contiguous()`` keeps odd strides of size-1 dims, which
    dtype-changing views reject)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


__all__ = [
    "FP8_MAX",
    "FP8_AMAX_FLOOR",
    "per_token_cast_to_fp8",
    "per_token_cast_back",
    "pack_ue8m0",
    "unpack_ue8m0",
]

FP8_MAX = 448.0
FP8_AMAX_FLOOR = 1e-4
_INV_FP8_MAX = torch.tensor(1.0 / 448.0, dtype=torch.float32)  # the fp32 constant the kernels use


def _ceil_log2_bits(v: torch.Tensor) -> torch.Tensor:
    """ceil(log2(v)) for positive normal fp32 ``v``, from the IEEE bits (as the kernels do)."""
    bits = _dense(v).view(torch.int32)
    exp = (bits >> 23) & 0xFF
    mantissa = bits & ((1 << 23) - 1)
    return exp - 127 + (mantissa != 0).to(torch.int32)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    return ((e + 127).to(torch.int32) << 23).view(torch.float32)


def per_token_cast_to_fp8(x: torch.Tensor, round_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast ``x`` [T, H] (H % 128 == 0) to (e4m3 [T, H], scale_inv fp32 [T, H/128]), row-major."""
    t, h = x.shape
    blocks = x.float().view(t, h // 128, 128)
    amax = blocks.abs().amax(dim=-1).clamp_min(FP8_AMAX_FLOOR)
    if round_scale:
        e = _ceil_log2_bits(amax * _INV_FP8_MAX.to(amax.device))
        scale = _pow2(-e)
        scale_inv = _pow2(e)
    else:
        scale = FP8_MAX / amax
        scale_inv = amax * _INV_FP8_MAX.to(amax.device)
    q = (blocks * scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(t, h), scale_inv


def pack_ue8m0(scale_inv: torch.Tensor) -> torch.Tensor:
    """Pack power-of-two fp32 scales [..., H/128] into int32 [..., H/512] of UE8M0 bytes."""
    *lead, nb = scale_inv.shape
    if nb % 4 != 0:
        raise ValueError(f"UE8M0 packing needs H/128 divisible by 4, got {nb}")
    exp_bytes = ((_dense(scale_inv).view(torch.int32) >> 23) & 0xFF).to(torch.int32)
    exp_bytes = exp_bytes.view(*lead, nb // 4, 4)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=scale_inv.device)
    packed = (exp_bytes.to(torch.int64) << shifts).sum(dim=-1)
    # Reinterpret the unsigned 32-bit pattern as int32 (two's complement).
    packed = torch.where(packed >= (1 << 31), packed - (1 << 32), packed)
    return packed.to(torch.int32)


def unpack_ue8m0(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0`: int32 [..., H/512] -> fp32 scales [..., H/128]."""
    *lead, n = packed.shape
    b = _dense(packed).view(torch.uint8).view(*lead, n * 4).to(torch.int32)
    return (b << 23).view(torch.float32)


def per_token_cast_back(x_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantize (e4m3 [T, H], scales [T, H/128] fp32 or [T, H/512] int32 UE8M0) to fp32."""
    if scales.dtype == torch.int32:
        scales = unpack_ue8m0(scales)
    t, h = x_fp8.shape
    return (x_fp8.float().view(t, h // 128, 128) * scales.float().unsqueeze(-1)).view(t, h)
