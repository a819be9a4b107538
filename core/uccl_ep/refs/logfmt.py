"""LogFMT-10: the combine format of ``low_latency_combine(use_logfmt=True)`` (DeepEP V1's).

A BF16 row is cut into divisions of 128 channels. Per division, with amax / amin the largest and
smallest |x| (BF16 values, so exact):

- ``log_amax = log2(amax)``; ``log_amin = max(log2(amin), log_amax - 32)`` (a zero or a tiny value
  does not stretch the range past 32 octaves);
- the division is **cast** when ``log_amax < 0`` (every |x| < 1) and ``log_amin < log_amax``
  (the magnitudes are not all equal); anything else (a value >= 1, all equal, all zero, a NaN or an
  Inf) is sent as BF16 unchanged -- the fallback;
- cast: ``step = (log_amax - log_amin) / 510``; each value becomes a sign bit and a 9-bit code
  ``c``: 0 stands for zero, ``c >= 1`` for ``2 ** (log_amin + (c - 1) * step)``. The encoder picks
  the level nearest in linear (not log) scale: ``c = floor(max(log2|x| / step + bias, 0))`` with
  ``bias = 2 - log2((1 + 2 ** step) / 2) / step - log_amin / step``, capped at 511. 16 codes take
  160 bits, so a cast division travels as 160 bytes plus its (amax, amin) pair (4 bytes).

The receiver decodes to fp32 (no BF16 rounding) and sums ``acc + value * w`` as the BF16 combine
does. Every step below is one IEEE-rounded fp32 operation in a fixed order, the order the kernels
use (``kernels/include/uccl_ep/device/logfmt.cuh``).

NOTES: ``log2`` / ``exp2``: on a GPU, torch's fp32 functions, which are the vendor's ``log2f`` /
``exp2f`` the kernels call, so the reference and the kernels on one GPU agree bit for bit; on the
CPU, fp64 rounded to fp32 (the correctly rounded value), because torch's CPU fp32 functions differ by
an ulp between their vector and scalar paths, i.e. by a value's position in a tensor, and a code is a
floor of one. So the CPU backends agree bit for bit with each other, and with a GPU up to an ulp of
these functions (a code one level off, rarely). DeepEP evaluates both with the hardware
approximations (``lg2.approx`` / ``ex2.approx``), so its codes may differ from these by one level;
the error bound and the tolerance are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DIVISION", "MAX_CODE", "LogfmtRows", "division_params", "encode", "decode", "round_trip",
           "message_bytes", "max_message_bytes"]

#: channels per division (one (amax, amin) pair each)
DIVISION = 128
#: the largest 9-bit magnitude code
MAX_CODE = 511
_LEVELS = 510.0  # steps between code 1 (log_amin) and code 511 (log_amax)
_MIN_CLIP = 32.0  # octaves below log_amax that log_amin may reach


def message_bytes(hidden: int) -> int:
    """Bytes of a row whose divisions are all cast: DeepEP's byte count for LogFMT combine
    bandwidth (10 bits per value plus 4 bytes per 128 channels)."""
    return hidden * 10 // 8 + hidden // DIVISION * 4


def max_message_bytes(hidden: int) -> int:
    """Bytes a row may take (every division falls back to BF16): 2H + H/32, DeepEP's combine slot."""
    return 2 * hidden + hidden // DIVISION * 4


@dataclass(frozen=True)
class LogfmtRows:
    """Encoded rows [N, H]: ``codes`` int16 (bit 9 the sign, bits 0-8 the code; 0 where the
    division falls back), ``amax`` / ``amin`` BF16 [N, H/128], ``cast`` bool [N, H/128], and
    ``raw`` BF16 [N, H] holding the fallback divisions' values (zero in cast divisions)."""
    codes: torch.Tensor
    amax: torch.Tensor
    amin: torch.Tensor
    cast: torch.Tensor
    raw: torch.Tensor


def _magnitudes(x: torch.Tensor) -> torch.Tensor:
    """|x| as BF16 (sign bit cleared, NaN kept), [N, D, 128]."""
    n, h = x.shape
    bits = x.contiguous().view(torch.int16) & 0x7FFF
    return bits.view(torch.bfloat16).view(n, h // DIVISION, DIVISION)


def _log2(t: torch.Tensor) -> torch.Tensor:
    return torch.log2(t) if t.is_cuda else torch.log2(t.double()).float()


def _exp2(t: torch.Tensor) -> torch.Tensor:
    return torch.exp2(t) if t.is_cuda else torch.exp2(t.double()).float()


def division_params(amax: torch.Tensor, amin: torch.Tensor):
    """(cast, log_amin, step, step_inv, bias) per division from BF16 amax / amin (the receiver
    recomputes the same from the pair it gets). fp32, one rounding per op, in the kernels' order."""
    a_max, a_min = amax.float(), amin.float()
    log_amax = _log2(a_max)
    log_amin = torch.maximum(_log2(a_min), log_amax - _MIN_CLIP)
    cast = (log_amax < 0) & (log_amin < log_amax)  # NaN compares False: fallback
    # NOTES: tensor / tensor, not / scalar: torch turns a division by a scalar into a multiplication
    # by its reciprocal, which is not the IEEE quotient the kernels compute
    step = (log_amax - log_amin) / torch.full_like(log_amax, _LEVELS)
    step_inv = torch.ones_like(step) / step
    # the level boundary sits where the linear midpoint of two neighbouring levels is
    half = _log2((_exp2(step) + 1.0) * 0.5)
    bias = (2.0 - half * step_inv) - log_amin * step_inv
    return cast, log_amin, step, step_inv, bias


def encode(x: torch.Tensor) -> LogfmtRows:
    """Encode BF16 rows [N, H] (H a multiple of 128)."""
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] % DIVISION != 0:
        raise ValueError(f"logfmt.encode wants BF16 [N, H] with H a multiple of {DIVISION}, got "
                         f"{x.dtype} {tuple(x.shape)}")
    n, h = x.shape
    mag = _magnitudes(x)
    # max / min of the magnitude bit patterns: for non-negative BF16 the integer order is the
    # float order, and a NaN (0x7f81..) ranks above every number, so it forces the fallback
    mbits = mag.view(torch.int16)
    amax = mbits.amax(dim=2).view(torch.bfloat16)
    amin = mbits.amin(dim=2).view(torch.bfloat16)
    cast, _, _, step_inv, bias = division_params(amax, amin)
    u = _log2(mag.float()) * step_inv.unsqueeze(2) + bias.unsqueeze(2)
    code = torch.floor(torch.clamp_min(u, 0.0)).clamp_max(MAX_CODE).to(torch.int16)
    sign = (x.contiguous().view(torch.int16).view(n, h // DIVISION, DIVISION) < 0).to(torch.int16)
    code = (code | (sign << 9)) * cast.unsqueeze(2).to(torch.int16)
    raw = torch.where(cast.unsqueeze(2), torch.zeros((), dtype=x.dtype, device=x.device),
                      x.view(n, h // DIVISION, DIVISION))
    return LogfmtRows(code.view(n, h), amax, amin, cast, raw.reshape(n, h))


def decode(rows: LogfmtRows) -> torch.Tensor:
    """fp32 [N, H]: cast divisions decoded, fallback divisions their BF16 values."""
    n, h = rows.codes.shape
    cast, log_amin, step, _, _ = division_params(rows.amax, rows.amin)
    codes = rows.codes.view(n, h // DIVISION, DIVISION).to(torch.int32)
    mag_code = codes & MAX_CODE
    level = (mag_code - 1).float() * step.unsqueeze(2) + log_amin.unsqueeze(2)
    mag = torch.where(mag_code == 0, torch.zeros((), device=codes.device), _exp2(level))
    value = torch.where((codes >> 9) & 1 == 1, -mag, mag)
    raw = rows.raw.view(n, h // DIVISION, DIVISION).float()
    return torch.where(cast.unsqueeze(2), value, raw).view(n, h)


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """What the receiver of BF16 rows ``x`` [N, H] sums after LogFMT combine: decode(encode(x))."""
    if x.shape[0] == 0:
        return x.float()
    return decode(encode(x))
