// get_dispatch_layout: per-rank and per-expert token counts and the token x rank membership.
// One thread per token; block-local counts in shared memory, then one atomic per counter and
// block. Counts are integers, so the atomics' order does not matter: the result is exact.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/kernel_abi.h"

using namespace uccl_ep;
using namespace uccl_ep::dev;

extern "C" __global__ void __launch_bounds__(256) ht_layout(const UCCL_GRID_CONSTANT HTLayoutParams p) {
  extern __shared__ int smem[];  // [R] rank counts, then [E] expert counts
  const int R = int(p.num_ranks), E = int(p.num_experts), K = int(p.num_topk);
  int* rank_cnt = smem;
  int* exp_cnt = smem + R;
  for (int i = threadIdx.x; i < R + E; i += blockDim.x) smem[i] = 0;
  __syncthreads();
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < p.num_tokens) {
    const int per_rank = E / R;
    const auto* ids = reinterpret_cast<const int64_t*>(p.topk_idx) + t * K;
    uint64_t ranks = 0;
    for (int k = 0; k < K; ++k) {
      const int64_t e = ids[k];
      if (e < 0 || e >= E) continue;
      atomicAdd(exp_cnt + e, 1);
      ranks |= uint64_t(1) << (e / per_rank);
    }
    auto* row = reinterpret_cast<uint8_t*>(p.is_token_in_rank) + t * R;
    for (int r = 0; r < R; ++r) {
      const bool in = (ranks >> r) & 1;
      row[r] = in ? 1 : 0;
      if (in) atomicAdd(rank_cnt + r, 1);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R + E; i += blockDim.x) {
    if (smem[i] == 0) continue;
    if (i < R)
      atomicAdd(reinterpret_cast<int*>(p.num_tokens_per_rank) + i, smem[i]);
    else
      atomicAdd(reinterpret_cast<int*>(p.num_tokens_per_expert) + (i - R), smem[i]);
  }
}
