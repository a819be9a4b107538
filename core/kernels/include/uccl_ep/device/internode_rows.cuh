// Output-row pieces shared by the proxy-path normal-mode kernels (ht/proxy/dispatch.cu,
// ht/proxy/combine.cu and their forward variants): placing a received dispatch message in its
// row and the num_worst_tokens padding (the bias start of a combine sum: combine_sum.cuh).
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/combine_sum.cuh"
#include "uccl_ep/device/internode_ring.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/kernel_abi_internode.h"

namespace uccl_ep::dev {

// Row `row` of the dispatch outputs from a received message (written by a peer's copy engine:
// read around L1): the x bytes, scales, top-k ids mapped to this rank's local ids (-1 elsewhere,
// weight 0) and the source token index. Warp-cooperative.
template <class P>
UCCL_DEVICE void place_dispatch_row(const P& p, const HTDispatchMsg& L, const uint8_t* slot, int64_t row) {
  const int lane = lane_id();
  const int64_t K = p.num_topk, E_loc = p.num_experts / p.num_ranks, lo = p.rank * E_loc;
  warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + row * p.hidden_bytes, slot, p.hidden_bytes);
  for (int64_t s = lane; s < p.num_scales; s += kWarpSize)
    reinterpret_cast<uint32_t*>(p.recv_scales)[row * p.num_scales + s] = ld_u32_cg(slot + L.scales + 4 * s);
  if (p.recv_topk_idx != 0) {
    for (int64_t kk = lane; kk < K; kk += kWarpSize) {
      const int64_t e = ld_i64_words_cg(slot + L.topk + 8 * kk);
      const bool local = e >= lo && e < lo + E_loc;
      reinterpret_cast<int64_t*>(p.recv_topk_idx)[row * K + kk] = local ? e - lo : -1;
      reinterpret_cast<uint32_t*>(p.recv_topk_weights)[row * K + kk] = local ? ld_u32_cg(slot + L.weights + 4 * kk) : 0u;
    }
  }
  if (p.recv_src_idx != 0 && lane == 0) reinterpret_cast<int*>(p.recv_src_idx)[row] = int(ld_u32_cg(slot + L.src));
}

// Rows past the real count (num_worst_tokens): top-k id -1, weight 0, source -1 (the reference's
// padding); spread over the `num_blocks` blocks that call it, `block` being this one.
template <class P>
UCCL_DEVICE void pad_dispatch_rows(const P& p, int64_t real, int block, int num_blocks) {
  const int64_t K = p.num_topk;
  for (int64_t r = real + int64_t(block) * blockDim.x + threadIdx.x; r < p.num_rows;
       r += int64_t(num_blocks) * blockDim.x) {
    for (int64_t kk = 0; kk < K && p.recv_topk_idx != 0; ++kk) {
      reinterpret_cast<int64_t*>(p.recv_topk_idx)[r * K + kk] = -1;
      reinterpret_cast<float*>(p.recv_topk_weights)[r * K + kk] = 0.0f;
    }
    if (p.recv_src_idx != 0) reinterpret_cast<int*>(p.recv_src_idx)[r] = -1;
  }
}

}  // namespace uccl_ep::dev
