// A dispatched row's metadata (FP8 scales, top-k ids and weights), loaded by the whole warp before
// the row's data is copied and stored after it, so that the metadata's loads wait alongside the row's
// first piece: lane l holds scales l and l + 32 and top-k entry l. Entries past those (more than 64
// scales or 32 top-k) are copied after the row, one load at a time, by the stores' callers.
//
// NOTES: copied after the row (a dependent load -> store per field), the metadata cost as much as
// the row itself for FP8 rows (UCCL_EP_HT_PROF's cycle accounting of the NVLink dispatch: the sender
// warps spent over half their cycles outside the row copy and the publications); through the proxy
// an FP8 message was four dependent load -> store steps (row, row tail, scales, top-k), now two.
#pragma once

#include "uccl_ep/device/arch.cuh"

namespace uccl_ep::dev {

struct RowMeta {
  uint32_t scales[2];
  int64_t topk;
  float weight;
};

// Token `tok`'s metadata from any params struct with x_scales (u32 [T][num_scales] at
// scale_stride_token / scale_stride_col), topk_idx (i64 [T][K]) and topk_weights (f32 [T][K]).
template <class P>
UCCL_DEVICE RowMeta load_row_meta(const P& p, int64_t tok, int64_t K) {
  RowMeta m{{0, 0}, 0, 0.0f};
  const int lane = lane_id();
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int64_t s = lane + q * kWarpSize;
    if (s < p.num_scales)
      m.scales[q] = reinterpret_cast<const uint32_t*>(p.x_scales)[tok * p.scale_stride_token + s * p.scale_stride_col];
  }
  if (lane < K) {
    m.topk = reinterpret_cast<const int64_t*>(p.topk_idx)[tok * K + lane];
    m.weight = reinterpret_cast<const float*>(p.topk_weights)[tok * K + lane];
  }
  return m;
}

// The scales of `m` at `scales_out` (u32 [num_scales]), then the ones past lane + 32 loaded now.
template <class P>
UCCL_DEVICE void store_row_scales(const P& p, const RowMeta& m, uint32_t* scales_out, int64_t tok) {
  const int lane = lane_id();
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int64_t s = lane + q * kWarpSize;
    if (s < p.num_scales) scales_out[s] = m.scales[q];
  }
  for (int64_t s = lane + 2 * kWarpSize; s < p.num_scales; s += kWarpSize)
    scales_out[s] = reinterpret_cast<const uint32_t*>(p.x_scales)[tok * p.scale_stride_token + s * p.scale_stride_col];
}

}  // namespace uccl_ep::dev
