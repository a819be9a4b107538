// BF16 and FP8 e4m3 conversions and DeepEP's per-128-channel FP8 scaling, bit-exact with
// uccl_ep.refs.fp8 (the reference): every operation is one IEEE-rounded fp32 op, no contraction.
//
// NOTES: bf16 travels as raw 16-bit patterns (no vendor bf16 type), so the same code compiles
// with nvcc and hipcc. e4m3 uses the hardware conversion on CUDA (round-to-nearest-even,
// saturating) and an exact software conversion elsewhere.
#pragma once

#include "uccl_ep/device/arch.cuh"

namespace uccl_ep::dev {

constexpr float kFp8Max = 448.0f;
constexpr float kFp8AmaxFloor = 1e-4f;
constexpr float kInvFp8Max = 1.0f / 448.0f;  // the fp32 constant the reference uses

UCCL_DEVICE float bf16_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// Round-to-nearest-even fp32 -> bf16 bits (NaN stays NaN).
UCCL_DEVICE uint32_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

// Exact software fp32 -> e4m3fn (RNE, saturate to +-448); used where no hardware cvt exists.
UCCL_DEVICE uint32_t float_to_e4m3_soft(float f) {
  uint32_t u = __float_as_uint(f);
  uint32_t sign = (u >> 24) & 0x80u;
  float a = fabsf(f);
  if (a != a) return sign | 0x7fu;
  if (a >= 448.0f) return sign | 0x7eu;  // SATFINITE
  int e = int((__float_as_uint(a) >> 23) & 0xff) - 127;
  if (e < -6) return sign | uint32_t(rintf(a * 512.0f));  // subnormals: m * 2^-9, RNE (8 -> min normal)
  uint32_t mant = __float_as_uint(a) & 0x7fffffu;
  uint32_t keep = mant >> 20, rest = mant & 0xfffffu;
  uint32_t half = 0x80000u;
  if (rest > half || (rest == half && (keep & 1u))) keep += 1;
  uint32_t exp = uint32_t(e + 7);
  if (keep == 8) { keep = 0; exp += 1; }
  uint32_t out = (exp << 3) | keep;
  if (out > 0x7eu) out = 0x7eu;
  return sign | out;
}

// Two fp32 -> two e4m3 bytes (low byte = a).
UCCL_DEVICE uint32_t float2_to_e4m3x2(float a, float b) {
#if UCCL_EP_HAS_HW_E4M3X2
  return hw_float2_to_e4m3x2(a, b);
#else
  return float_to_e4m3_soft(a) | (float_to_e4m3_soft(b) << 8);
#endif
}

// ceil(log2(v)) for positive normal v, from the IEEE bits (as the reference does).
UCCL_DEVICE int ceil_log2_bits(float v) {
  uint32_t bits = __float_as_uint(v);
  int e = int((bits >> 23) & 0xff) - 127;
  return e + ((bits & 0x7fffffu) != 0 ? 1 : 0);
}

UCCL_DEVICE float pow2_bits(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }

// DeepEP's scale for one 128-channel block: q = e4m3(x * scale), stored scale_inv.
UCCL_DEVICE void fp8_block_scales(float amax, bool round_scale, float* scale, float* scale_inv) {
  amax = fmaxf(amax, kFp8AmaxFloor);
  if (round_scale) {
    int e = ceil_log2_bits(__fmul_rn(amax, kInvFp8Max));
    *scale = pow2_bits(-e);
    *scale_inv = pow2_bits(e);
  } else {
    // NOTES: the reference computes 448 / amax as torch does for a scalar / tensor:
    // reciprocal(amax) * 448, two roundings.
    *scale = __fmul_rn(__frcp_rn(amax), kFp8Max);
    *scale_inv = __fmul_rn(amax, kInvFp8Max);
  }
}

// 8 bf16 (one 16-byte load) -> 8 floats: one shift or mask each.
UCCL_DEVICE void unpack_bf16x8(const Vec16& v, float* out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(v.w[i] << 16);
    out[2 * i + 1] = __uint_as_float(v.w[i] & 0xffff0000u);
  }
}

// Two floats -> packed bf16 pair (lo in the low half), round to nearest even.
//
// NOTES: sm_80+ converts a pair in one instruction (cvt.rn.bf16x2.f32); the software rounding
// costs ~6 instructions per element, and a combine receiver warp is issue-bound on this math
// (UCCL_EP_HT_PROF: most of its cycles are in the sum). Results are identical except the
// payload of NaN (hardware: canonical 0x7fff, as torch's CUDA kernels produce; software: quieted
// input payload, as torch's CPU conversion produces).
UCCL_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
#if UCCL_EP_HAS_HW_BF16X2
  return hw_pack_bf16x2(lo, hi);
#else
  return float_to_bf16(lo) | (float_to_bf16(hi) << 16);
#endif
}

UCCL_DEVICE Vec16 pack_bf16x8(const float* in) {
  Vec16 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.w[i] = pack_bf16x2(in[2 * i], in[2 * i + 1]);
  return v;
}

// 16 floats * scale, clamped to +-448 -> 16 e4m3 bytes.
UCCL_DEVICE Vec16 quantize16(const float* x, float scale) {
  Vec16 q;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = fminf(fmaxf(__fmul_rn(x[4 * i + j], scale), -kFp8Max), kFp8Max);
    q.w[i] = float2_to_e4m3x2(v[0], v[1]) | (float2_to_e4m3x2(v[2], v[3]) << 16);
  }
  return q;
}

}  // namespace uccl_ep::dev
