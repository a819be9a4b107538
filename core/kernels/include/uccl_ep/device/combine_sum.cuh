// Combine sums shared by the normal-mode combine kernels: out = (bias0 + bias1) + 0 + row_0 +
// row_1 + ... in fp32, one IEEE add at a time in source order (bit-exact with uccl_ep.refs), cast
// to BF16.
#pragma once

#include "uccl_ep/device/arch.cuh"
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

// One warp sums token t's `nsrc` BF16 rows (`rows`, in source order, read through L2: peers wrote
// them) into `out` (H elements). Work is cut into chunks of (step: U vectors of 16 bytes per lane,
// pair of sources); the loads of the next chunk are issued before the current one is added up.
//
// NOTES: a receiver warp is latency-bound, not ALU- or bandwidth-bound: with loads issued only
// after the previous step's adds, each step paid a full L2 round trip plus its adds, and the
// 2 x H200 wait accounting (UCCL_EP_HT_PROF) showed combine receivers busy 95% of the time at
// half the row rate of dispatch's receivers. Prefetching one chunk ahead overlaps the two.
template <int U>
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
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v0 + u * kWarpSize < nvec) combine_sum_start(acc[u], bias0, bias1, t, H, v0 + u * kWarpSize);
    }
    for (int pair = 0; pair < pairs; ++pair) {
      const bool last_pair = pair + 1 == pairs;  // prefetch the next chunk (nothing past the row)
      load(nxt, last_pair ? v0 + U * kWarpSize : v0, last_pair ? 0 : pair + 1);
      const bool two = 2 * pair + 1 < nsrc;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (v0 + u * kWarpSize >= nvec) continue;
        float f[8];
        unpack_bf16x8(cur[0][u], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = __fadd_rn(acc[u][e], f[e]);
        if (two) {
          unpack_bf16x8(cur[1][u], f);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u][e] = __fadd_rn(acc[u][e], f[e]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        cur[0][u] = nxt[0][u];
        cur[1][u] = nxt[1][u];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v0 + u * kWarpSize < nvec) st16(out + (v0 + u * kWarpSize) * 16, pack_bf16x8(acc[u]));
  }
}

}  // namespace uccl_ep::dev
