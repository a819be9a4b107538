// Combine sums shared by the normal-mode combine kernels: out = (bias0 + bias1) + 0 + row_0 +
// row_1 + ... in fp32, one IEEE add at a time in source order (bit-exact with uccl_ep.refs), cast
// to BF16.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/ht_tuning.cuh"
#include "uccl_ep/device/numeric.cuh"

namespace uccl_ep::dev {

// The start of a combine sum for elements [8v, 8v + 8) of token t: (bias0 + bias1) + 0, one IEEE
// add at a time, as uccl_ep.refs computes it (the "+ 0" turns -0 into +0).
UCCL_DEVICE void combine_sum_start(float* acc, uint64_t bias0, uint64_t bias1, int64_t t, int64_t H, int64_t v) {
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
  if (bias0 != 0) unpack_bf16x8(ld16(reinterpret_cast<const uint8_t*>(bias0) + (t * H + v * 8) * 2), acc);
  if (bias1 != 0) {
    float b[8];
    unpack_bf16x8(ld16(reinterpret_cast<const uint8_t*>(bias1) + (t * H + v * 8) * 2), b);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], b[e]);
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], 0.0f);
}

// A chunk = U 16-byte vectors per lane (elements [8v, 8v + 8) for v = v0 + u * 32) of one or two
// sources. Shared by both warp sums below: start from the biases, add a pair of sources, store.
template <int U>
UCCL_DEVICE void chunk_start(float (&acc)[U][8], int64_t v0, int64_t nvec, uint64_t bias0, uint64_t bias1, int64_t t,
                             int64_t H) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (v0 + u * kWarpSize < nvec) combine_sum_start(acc[u], bias0, bias1, t, H, v0 + u * kWarpSize);
}

template <int U>
UCCL_DEVICE void chunk_add(float (&acc)[U][8], const Vec16 (&x)[2][U], bool two, int64_t v0, int64_t nvec) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (v0 + u * kWarpSize >= nvec) continue;
    float f[8];
    unpack_bf16x8(x[0][u], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[u][e] = __fadd_rn(acc[u][e], f[e]);
    if (two) {
      unpack_bf16x8(x[1][u], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[u][e] = __fadd_rn(acc[u][e], f[e]);
    }
  }
}

// kFp32: the sums as they are (32 bytes per vector: a partial of the hierarchical combine), else BF16.
template <int U, bool kFp32 = false>
UCCL_DEVICE void chunk_store(uint8_t* out, const float (&acc)[U][8], int64_t v0, int64_t nvec) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t v = v0 + u * kWarpSize;
    if (v >= nvec) continue;
    if constexpr (kFp32) {
      Vec16 lo, hi;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo.w[e] = __float_as_uint(acc[u][e]);
        hi.w[e] = __float_as_uint(acc[u][4 + e]);
      }
      st16(out + v * 32, lo);
      st16(out + v * 32 + 16, hi);
    } else {
      st16(out + v * 16, pack_bf16x8(acc[u]));
    }
  }
}

// One warp sums token t's `nsrc` BF16 rows (`rows`, in source order, read through L2: peers wrote
// them) into `out` (H elements). Work is cut into chunks of (step: U vectors of 16 bytes per lane,
// pair of sources); the loads of the next chunk are issued before the current one is added up.
// Used where cp.async is missing (sm < 80, HIP) or UCCL_EP_HT_COMBINE_STAGES=0; elsewhere the
// default is warp_combine_rows_staged below.
//
// kFp32 stores the fp32 sums (ht/proxy/forward_combine.cu: a node's partial) instead of BF16.
//
// NOTES: combine receivers are busy, not waiting (UCCL_EP_HT_PROF's cycle accounting: nearly all of
// their cycles outside waits), bound by loads in flight per SM. Prefetching one chunk ahead gains
// nothing on its own; it keeps as many loads in flight as 4 unpipelined vectors per lane with 2, in
// fewer registers, and more warps per block (Tuning.ht_combine_warps) is what pays.
template <int U, bool kFp32 = false>
UCCL_DEVICE void warp_combine_rows(uint8_t* out, const uint8_t* const* rows, int nsrc, int64_t H, uint64_t bias0,
                                   uint64_t bias1, int64_t t) {
  const int lane = lane_id();
  const int64_t nvec = H / 8;
  const int pairs = (nsrc + 1) / 2;
  Vec16 cur[2][U], nxt[2][U];
  auto load = [&](Vec16 (&dst)[2][U], int64_t v0, int pair) {
    const int s = 2 * pair;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + u * kWarpSize;
      if (v >= nvec) continue;
      dst[0][u] = ld16_cg(rows[s] + v * 16);
      if (s + 1 < nsrc) dst[1][u] = ld16_cg(rows[s + 1] + v * 16);
    }
  };
  if (pairs > 0) load(cur, lane, 0);
  for (int64_t v0 = lane; v0 < nvec; v0 += U * kWarpSize) {
    float acc[U][8];
    chunk_start<U>(acc, v0, nvec, bias0, bias1, t, H);
    for (int pair = 0; pair < pairs; ++pair) {
      const bool last_pair = pair + 1 == pairs;  // prefetch the next chunk (nothing past the row)
      load(nxt, last_pair ? v0 + U * kWarpSize : v0, last_pair ? 0 : pair + 1);
      chunk_add<U>(acc, cur, 2 * pair + 1 < nsrc, v0, nvec);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        cur[0][u] = nxt[0][u];
        cur[1][u] = nxt[1][u];
      }
    }
    chunk_store<U, kFp32>(out, acc, v0, nvec);
  }
}

// Vec16 per warp of warp_combine_rows_staged's stage area.
template <int U, int D>
constexpr int kCombineStageVecs = D * 2 * U * kWarpSize;

// warp_combine_rows with the chunks staged through this warp's shared memory (`stage`,
// kCombineStageVecs<U, D> vectors) by cp.async: D chunks in flight per warp and no registers held
// for them. Each lane copies and reads back only its own vectors, so no warp barrier is needed.
//
// NOTES: the default on sm_80+ (ht_tuning.cuh has the measurements). The register pipeline above
// holds its chunk in registers, so its depth is capped by the register budget, while the receivers
// are bound by loads in flight per SM; cp.async lands the loads in shared memory instead, so a warp
// keeps 2 x 4 vectors per lane per source pair in flight without registers for them.
template <int U, int D>
UCCL_DEVICE void warp_combine_rows_staged(uint8_t* out, const uint8_t* const* rows, int nsrc, int64_t H,
                                          uint64_t bias0, uint64_t bias1, int64_t t, Vec16* stage) {
  static_assert(D >= 2, "at least two stages");
  const int lane = lane_id();
  const int64_t nvec = H / 8;
  const int pairs = (nsrc + 1) / 2;
  if (pairs == 0) {  // nothing received for this token: the bias sum alone
    for (int64_t v = lane; v < nvec; v += kWarpSize) {
      float acc[8];
      combine_sum_start(acc, bias0, bias1, t, H, v);
      st16(out + v * 16, pack_bf16x8(acc));
    }
    return;
  }
  const int64_t steps = (nvec + U * kWarpSize - 1) / (U * kWarpSize);
  const int64_t chunks = steps * pairs;
  auto issue = [&](int64_t c) {  // chunk c = (step c / pairs, pair c % pairs) into stage c % D
    if (c < chunks) {
      const int64_t v0 = (c / pairs) * U * kWarpSize + lane;
      const int s = 2 * int(c % pairs);
      Vec16* st = stage + int(c % D) * 2 * U * kWarpSize;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = v0 + u * kWarpSize;
        if (v >= nvec) continue;
        cp_async16_cg(st + u * kWarpSize + lane, rows[s] + v * 16);
        if (s + 1 < nsrc) cp_async16_cg(st + (U + u) * kWarpSize + lane, rows[s + 1] + v * 16);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };
#pragma unroll
  for (int d = 0; d < D - 1; ++d) issue(d);
  float acc[U][8];
  for (int64_t c = 0; c < chunks; ++c) {
    issue(c + D - 1);
    cp_async_wait<D - 1>();  // chunk c has landed
    const int64_t v0 = (c / pairs) * U * kWarpSize + lane;
    const int pair = int(c % pairs);
    const bool two = 2 * pair + 1 < nsrc;
    if (pair == 0) chunk_start<U>(acc, v0, nvec, bias0, bias1, t, H);
    const Vec16* st = stage + int(c % D) * 2 * U * kWarpSize;
    Vec16 got[2][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v0 + u * kWarpSize >= nvec) continue;
      got[0][u] = st[u * kWarpSize + lane];
      if (two) got[1][u] = st[(U + u) * kWarpSize + lane];
    }
    chunk_add<U>(acc, got, two, v0, nvec);
    if (pair + 1 == pairs) chunk_store<U>(out, acc, v0, nvec);
  }
  cp_async_wait<0>();
}

// One token's sum as the intranode combine kernels run it: staged through this warp's area of the
// kernel's dynamic shared memory (kCombineStageVecs per warp; uccl_ep/cuda/ht.py sizes it) when
// UCCL_EP_HT_COMBINE_STAGES, else the register pipeline.
UCCL_DEVICE void warp_combine_token(uint8_t* out, const uint8_t* const* rows, int nsrc, int64_t H, uint64_t bias0,
                                    uint64_t bias1, int64_t t) {
#if UCCL_EP_HT_COMBINE_STAGES
  extern __shared__ __align__(16) uint8_t combine_stages[];
  warp_combine_rows_staged<kCombineUnroll, kCombineStages>(
      out, rows, nsrc, H, bias0, bias1, t,
      reinterpret_cast<Vec16*>(combine_stages) + warp_id() * kCombineStageVecs<kCombineUnroll, kCombineStages>);
#else
  warp_combine_rows<kCombineUnroll>(out, rows, nsrc, H, bias0, bias1, t);
#endif
}

}  // namespace uccl_ep::dev
