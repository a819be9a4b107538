// A token's row work shared by the low-latency kernels of both paths (ll/nvlink/*.cu, ll/proxy/*.cu):
// the dispatch's cast-and-store of one BF16 row into each of its destinations, and the combine's
// weighted sum of a token's expert rows. The paths differ only in where those rows live.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/numeric.cuh"

namespace uccl_ep::dev {

// Row `row` of local expert `e`'s dispatch outputs from a received message `msg` (the x bytes, then
// with FP8 one fp32 scale per 128 channels; written by a peer, so read around L1): src_info = the
// sender's token index, recv_x, and the scales into DeepEP's column-major layout (with use_ue8m0 the
// exponents packed four to an int32). Warp-cooperative; both paths' receive kernels use it.
template <class P>
UCCL_DEVICE void place_ll_row(const P& p, int e, int row, int64_t rows_per_expert, int token, const uint8_t* msg) {
  const int64_t H = p.hidden;
  const int64_t out_row = int64_t(e) * rows_per_expert + row;
  if (lane_id() == 0) reinterpret_cast<int*>(p.src_info)[out_row] = token;
  if (!p.use_fp8) {
    warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + out_row * H * 2, msg, H * 2);
    return;
  }
  warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + out_row * H, msg, H);
  const auto* scales = reinterpret_cast<const float*>(msg + H);
  if (p.use_ue8m0) {
    for (int g = lane_id(); g < H / 512; g += kWarpSize) {
      uint32_t packed = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) packed |= ((__float_as_uint(scales[g * 4 + b]) >> 23) & 0xffu) << (8 * b);
      reinterpret_cast<uint32_t*>(p.recv_scales)[(int64_t(e) * (H / 512) + g) * rows_per_expert + row] = packed;
    }
  } else {
    for (int g = lane_id(); g < H / 128; g += kWarpSize)
      reinterpret_cast<float*>(p.recv_scales)[(int64_t(e) * (H / 128) + g) * rows_per_expert + row] = scales[g];
  }
}

// An LL dispatch receive block's bookkeeping for local expert `e` once every source rank's row count
// is in s_count[0..R): thread 0 lays the sources out in rank order (s_begin[0..R], s_begin[R] = the
// total), writes recv_count[e] and adds it to the cumulative stats; then thread j < R writes
// layout_range[e][j] = (first row << 32) | rows (DeepEP's packing). The caller's barrier must
// precede it (s_count complete); it ends with s_begin visible to the whole block. Both paths'
// receive kernels (ll/nvlink/dispatch.cu, ll/proxy/dispatch.cu) use it.
template <class P>
UCCL_DEVICE void lay_out_expert_rows(const P& p, int e, int R, const int* s_count, int* s_begin) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    int acc = 0;
    for (int j = 0; j < R; ++j) {
      s_begin[j] = acc;
      acc += s_count[j];
    }
    s_begin[R] = acc;
    reinterpret_cast<int*>(p.recv_count)[e] = acc;
    if (p.cumulative_stats != 0) atomicAdd(reinterpret_cast<int*>(p.cumulative_stats) + e, acc);
  }
  __syncthreads();
  if (tid < R)
    reinterpret_cast<int64_t*>(p.layout_range)[int64_t(e) * R + tid] =
        (int64_t(s_begin[tid]) << 32) | int64_t(uint32_t(s_count[tid]));
}

// Token row `row` (BF16, `hidden` channels) into each of dst[0..n): FP8 e4m3 with one fp32 scale per
// 128 channels after the payload (DeepEP's layout), or BF16 as is. The whole block calls it; each
// thread takes 16 (FP8: 8 threads per 128-channel block) or 8 (BF16) channels at a time.
template <int N>
UCCL_DEVICE void store_token_row(const uint16_t* row, int64_t hidden, bool use_fp8, bool round_scale,
                                 uint8_t* const (&dst)[N], int n) {
  const int tid = threadIdx.x;
  if (use_fp8) {
    const int nchunk = int(hidden / 16);
    for (int base = 0; base < nchunk; base += blockDim.x) {
      const int c = base + tid;
      float v[16];
      float amax = 0.0f;
      if (c < nchunk) {
        unpack_bf16x8(ld16(row + c * 16), v);
        unpack_bf16x8(ld16(row + c * 16 + 8), v + 8);
#pragma unroll
        for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
      }
      amax = fmaxf(amax, shfl_xor(amax, 1));  // every lane joins the shuffles, in range or not
      amax = fmaxf(amax, shfl_xor(amax, 2));
      amax = fmaxf(amax, shfl_xor(amax, 4));
      if (c >= nchunk) continue;
      float scale, scale_inv;
      fp8_block_scales(amax, round_scale, &scale, &scale_inv);
      const Vec16 q = quantize16(v, scale);
      for (int k = 0; k < n; ++k) {
        st16(dst[k] + c * 16, q);
        if ((c & 7) == 0) reinterpret_cast<float*>(dst[k] + hidden)[c >> 3] = scale_inv;
      }
    }
  } else {
    for (int c = tid; c < hidden / 8; c += blockDim.x) {
      const Vec16 v = ld16(row + c * 8);
      for (int k = 0; k < n; ++k) st16(dst[k] + c * 16, v);
    }
  }
}

// acc += w_k * row_k over a token's K expert slots in k order, for the 8 BF16 channels row_at(k)
// points at (slots with expert[k] < 0 skipped), 8 experts' loads in flight, one IEEE multiply and
// add at a time (bit-exact with uccl_ep.refs).
template <class RowAt>
UCCL_DEVICE void add_weighted_rows(float (&acc)[8], const int* expert, const float* weight, int K, RowAt row_at) {
  for (int k0 = 0; k0 < K; k0 += 8) {
    Vec16 r[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = k0 + u < K ? expert[k0 + u] : -1;
      if (g >= 0) r[u] = ld16_cg(row_at(k0 + u));
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = k0 + u < K ? expert[k0 + u] : -1;
      if (g < 0) continue;
      float v[8];
      unpack_bf16x8(r[u], v);
      const float w = weight[k0 + u];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(v[i], w));
    }
  }
}

}  // namespace uccl_ep::dev
