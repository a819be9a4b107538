// LogFMT-10, the format of low_latency_combine(use_logfmt=True): encode and decode of 128-channel
// divisions, bit-exact with uccl_ep.refs.logfmt (the format and its numerics are described there).
//
// A message for a row of H channels: its divisions' payloads and one meta word per division,
// amax | amin << 16 (BF16 bits of the largest / smallest |x|), from which the receiver recomputes
// the cast decision and the levels. 16 lanes take a division, 8 channels (16 bytes of BF16, 80 bits
// of codes) each; channel i of a cast division is bits [10i, 10i + 10) of its 160 bytes of codes
// (bit 9 the sign, bits 0-8 the code). A division's payload is two parts: part A (160 bytes: the
// codes, or the first 160 BF16 bytes of a fallback division) and part B (the last 96 BF16 bytes of
// a fallback division, unused when cast), at dst_a + d * a_stride and dst_b + d * b_stride. The
// NVLink kernels use the BF16 row's own places (a_stride = b_stride = 256, dst_b = dst_a + 160); the
// proxy path packs a region's parts A, then the meta words, then parts B, so a region whose
// divisions are all cast goes as 164 bytes per division, DeepEP's count.
//
// NOTES: divisions sit at fixed offsets, not packed by their cast decisions: a receiver finds any
// channel without a prefix sum over the row.
// NOTES: log2 / exp2 are the vendor's fp32 log2f / exp2f (libdevice, OCML), the functions torch's
// own GPU kernels call, so the reference run on the same GPU gives the same codes and values; DeepEP
// uses the approximate instructions instead. fp64 would be the same on every device (correctly
// rounded) but costs an fp64 exp2 per value in the receiver, several microseconds per op.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/numeric.cuh"

namespace uccl_ep::dev {

constexpr int kLogfmtLanes = 16;          // lanes per division (8 channels each)
constexpr int kLogfmtDivBytes = 256;      // BF16 bytes of a division
constexpr int kLogfmtPartA = 160;         // bytes of a division's part A (its codes)
constexpr int kLogfmtPartB = 96;          // bytes of a fallback division's part B
constexpr int kLogfmtStageWords = 40;     // 160 bytes of codes: a 16-lane group's staging words
constexpr uint32_t kLogfmtMaxCode = 511;  // 9-bit magnitude codes

#if UCCL_EP_LOGFMT_HOST_MATH  // tests/cpu/data/logfmt_host: the reference's CPU math (fp64, rounded)
UCCL_DEVICE float logfmt_log2(float x) { return static_cast<float>(log2(static_cast<double>(x))); }
UCCL_DEVICE float logfmt_exp2(float x) { return static_cast<float>(exp2(static_cast<double>(x))); }
#else
UCCL_DEVICE float logfmt_log2(float x) { return log2f(x); }
UCCL_DEVICE float logfmt_exp2(float x) { return exp2f(x); }
#endif

struct LogfmtDiv {
  float log_amin, step, step_inv, bias;
  bool cast;
};

// The levels of a division from its meta word, one IEEE-rounded op at a time in the reference's order.
UCCL_DEVICE LogfmtDiv logfmt_division(uint32_t meta) {
  LogfmtDiv d;
  const float log_amax = logfmt_log2(bf16_to_float(meta & 0xffffu));
  d.log_amin = fmaxf(logfmt_log2(bf16_to_float(meta >> 16)), __fsub_rn(log_amax, 32.0f));
  d.cast = log_amax < 0.0f && d.log_amin < log_amax;  // NaN: false (BF16 fallback)
  d.step = __fdiv_rn(__fsub_rn(log_amax, d.log_amin), 510.0f);
  d.step_inv = __fdiv_rn(1.0f, d.step);
  const float half = logfmt_log2(__fmul_rn(__fadd_rn(logfmt_exp2(d.step), 1.0f), 0.5f));
  d.bias = __fsub_rn(__fsub_rn(2.0f, __fmul_rn(half, d.step_inv)), __fmul_rn(d.log_amin, d.step_inv));
  return d;
}

// 10-bit code of one BF16 value of a cast division (garbage, but defined, for other divisions).
UCCL_DEVICE uint32_t logfmt_code(uint32_t bits16, const LogfmtDiv& d) {
  const float mag = bf16_to_float(bits16 & 0x7fffu);
  const float u = __fadd_rn(__fmul_rn(logfmt_log2(mag), d.step_inv), d.bias);
  const uint32_t c = uint32_t(floorf(fminf(fmaxf(u, 0.0f), float(kLogfmtMaxCode))));  // NaN -> 0
  return c | (((bits16 >> 15) & 1u) << 9);
}

UCCL_DEVICE float logfmt_value(uint32_t code, const LogfmtDiv& d) {
  const uint32_t c = code & kLogfmtMaxCode;
  const float mag = c == 0 ? 0.0f : logfmt_exp2(__fadd_rn(__fmul_rn(float(c - 1), d.step), d.log_amin));
  return ((code >> 9) & 1u) ? -mag : mag;
}

// Largest / smallest magnitude of 8 BF16 values as bit patterns (for non-negative BF16 the integer
// order is the float order, and a NaN (0x7f81..) ranks above every number, so it forces the fallback).
UCCL_DEVICE void logfmt_extremes8(const Vec16& v, int& hi, int& lo) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = int((v.w[i / 2] >> (16 * (i % 2))) & 0x7fffu);
    hi = m > hi ? m : hi;
    lo = m < lo ? m : lo;
  }
}

// One lane's 8 codes as 80 bits: code i at bit 10 i of w.
UCCL_DEVICE void logfmt_pack8(const Vec16& v, const LogfmtDiv& p, uint32_t (&w)[3]) {
  w[0] = w[1] = w[2] = 0u;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t c = logfmt_code((v.w[i / 2] >> (16 * (i % 2))) & 0xffffu, p);
    const int bit = 10 * i;
    w[bit >> 5] |= c << (bit & 31);
    if ((bit & 31) > 22) w[(bit >> 5) + 1] |= c >> (32 - (bit & 31));
  }
}

// A lane pair's 160 bits as 5 words: the even lane's 80 bits (w), then the odd lane's (o).
UCCL_DEVICE void logfmt_pair_words(const uint32_t (&w)[3], const uint32_t (&o)[3], uint32_t* s) {
  s[0] = w[0];
  s[1] = w[1];
  s[2] = (w[2] & 0xffffu) | (o[0] << 16);
  s[3] = (o[0] >> 16) | (o[1] << 16);
  s[4] = (o[1] >> 16) | (o[2] << 16);
}

// The 16 bytes of lane li (channels 8 li .. 8 li + 7 as BF16) of division d: in part A for the
// first 10 lanes, in part B for the other 6.
UCCL_DEVICE uint8_t* logfmt_chunk(uint8_t* dst_a, int64_t a_stride, uint8_t* dst_b, int64_t b_stride, int64_t d,
                                  int li) {
  return li < kLogfmtPartA / 16 ? dst_a + d * a_stride + li * 16 : dst_b + d * b_stride + (li - kLogfmtPartA / 16) * 16;
}

// A packed region of n rows (the proxy path): where row i's parts A, meta words and parts B start.
struct LogfmtRegion {
  uint8_t *a, *meta, *b;
};
UCCL_DEVICE LogfmtRegion logfmt_region(uint8_t* region, int64_t n, int64_t i, int64_t hidden) {
  const int64_t nd = hidden / 128;
  return {region + i * nd * kLogfmtPartA, region + n * nd * kLogfmtPartA + i * nd * 4,
          region + n * nd * (kLogfmtPartA + 4) + i * nd * kLogfmtPartB};
}

// One warp encodes the BF16 row `src` (divisions [0, num_div)) into parts A / B and `meta` (u32 per
// division); true (in every lane) when a division fell back, i.e. part B was written. `stage`: this
// block's staging, kLogfmtStageWords per 16 threads, 16-byte aligned. Every lane of the warp must
// call it (shuffles and warp barriers inside).
UCCL_DEVICE bool warp_logfmt_encode_row(uint8_t* dst_a, int64_t a_stride, uint8_t* dst_b, int64_t b_stride,
                                        uint8_t* meta, const uint8_t* src, int num_div, uint32_t* stage) {
  const int lane = lane_id(), li = lane % kLogfmtLanes;
  uint32_t* my_stage = stage + (threadIdx.x / kLogfmtLanes) * kLogfmtStageWords;
  bool fell_back = false;
  for (int d0 = 0; d0 < num_div; d0 += kWarpSize / kLogfmtLanes) {
    const int d = d0 + lane / kLogfmtLanes;
    const bool active = d < num_div;
    Vec16 v{};
    if (active) v = ld16(src + int64_t(d) * kLogfmtDivBytes + li * 16);
    int hi = 0, lo = 0x7fff;
    logfmt_extremes8(v, hi, lo);
#pragma unroll
    for (int s = kLogfmtLanes / 2; s >= 1; s >>= 1) {  // over the division's 16 lanes
      const int oh = shfl_xor(hi, s), ol = shfl_xor(lo, s);
      hi = oh > hi ? oh : hi;
      lo = ol < lo ? ol : lo;
    }
    const uint32_t m = uint32_t(hi) | (uint32_t(lo) << 16);
    const LogfmtDiv p = logfmt_division(m);
    uint32_t w[3], o[3];
    logfmt_pack8(v, p, w);
#pragma unroll
    for (int k = 0; k < 3; ++k) o[k] = uint32_t(shfl_xor(int(w[k]), 1));
    if (active && p.cast && li % 2 == 0) logfmt_pair_words(w, o, my_stage + 5 * (li / 2));
    sync_warp();
    if (active) {
      uint8_t* out = logfmt_chunk(dst_a, a_stride, dst_b, b_stride, d, li);
      if (!p.cast) st16(out, v);
      else if (li < kLogfmtPartA / 16) st16(out, reinterpret_cast<const Vec16*>(my_stage)[li]);
      if (li == 0) *reinterpret_cast<uint32_t*>(meta + 4 * int64_t(d)) = m;
      fell_back = fell_back || !p.cast;
    }
    sync_warp();  // the stage is reused by the next division
  }
  return warp_ballot(fell_back) != 0;
}

// Channels [8c, 8c + 8) of a LogFMT message (parts A / B as in warp_logfmt_encode_row, meta words
// `meta`; written by peers, so read through L2) decoded to fp32.
UCCL_DEVICE void logfmt_decode8(const uint8_t* a, int64_t a_stride, const uint8_t* b, int64_t b_stride,
                                const uint8_t* meta, int64_t c, float* v) {
  const int64_t d = c / kLogfmtLanes;
  const int li = int(c % kLogfmtLanes);
  const LogfmtDiv p = logfmt_division(ld_u32_cg(meta + 4 * d));
  if (!p.cast) {
    unpack_bf16x8(ld16_cg(logfmt_chunk(const_cast<uint8_t*>(a), a_stride, const_cast<uint8_t*>(b), b_stride, d, li)), v);
    return;
  }
  const uint8_t* base = a + d * a_stride + (li / 2) * 20;
  uint32_t w[3];
  if (li % 2 == 0) {
    w[0] = ld_u32_cg(base);
    w[1] = ld_u32_cg(base + 4);
    w[2] = ld_u32_cg(base + 8) & 0xffffu;
  } else {
    const uint32_t a = ld_u32_cg(base + 8), b = ld_u32_cg(base + 12), e = ld_u32_cg(base + 16);
    w[0] = (a >> 16) | (b << 16);
    w[1] = (b >> 16) | (e << 16);
    w[2] = e >> 16;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int bit = 10 * i;
    uint32_t code = w[bit >> 5] >> (bit & 31);
    if ((bit & 31) > 22) code |= w[(bit >> 5) + 1] << (32 - (bit & 31));
    v[i] = logfmt_value(code & 0x3ffu, p);
  }
}

}  // namespace uccl_ep::dev
