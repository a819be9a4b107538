// Low-latency combine over NVLink: weighted sum of expert outputs back at the source rank.
//
// Send (ll_combine_send, one block per local expert e): for every row of e's slab that came from
// source rank j (layout_range / src_info of the dispatch handle), copy the BF16 expert output into
// rank j's combine area at [global expert][source token]; then publish (tag << 32) into rank j's
// signal[global expert] with a system-scope release (every source gets one, even for 0 rows).
// Recv (ll_combine_recv, one block per token t): wait (bounded) for the signal of every expert
// in topk_idx[t] (skipping -1 and masked ranks), then out[t] = sum_k w[t,k] * y_k in fp32 with k
// ascending, one IEEE-rounded multiply and add each (bit-exact with uccl_ep.refs), cast to BF16.
//
// NOTES: zero_copy needs no special path here: the caller wrote the expert outputs into this
// rank's registered send area, which is simply passed as `y`. Tags: see ll_dispatch.cu.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {
constexpr int kMaxRanks = 64;
constexpr int kMaxTopk = 32;
}  // namespace

extern "C" __global__ void __launch_bounds__(256) ll_combine_send(const UCCL_GRID_CONSTANT LLCombineParams p) {
  __shared__ int s_seg_begin[kMaxRanks];   // begin row of source j's segment in e's slab
  __shared__ int s_flat[kMaxRanks + 1];    // prefix of counts over j
  const int e = blockIdx.x, tid = threadIdx.x;
  const int R = int(p.num_ranks);
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  const int g = int(p.rank * p.num_local_experts) + e;
  const uint32_t tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  if (tid == 0) {
    int acc = 0;
    for (int j = 0; j < R; ++j) {
      int64_t packed = reinterpret_cast<const int64_t*>(p.layout_range)[int64_t(e) * R + j];
      s_seg_begin[j] = int(packed >> 32);
      s_flat[j] = acc;
      acc += is_masked(p.masked, j) ? 0 : int(packed & 0xffffffff);
    }
    s_flat[R] = acc;
  }
  __syncthreads();
  const int total = s_flat[R];
  const int64_t row_bytes = p.hidden * 2;
  const auto* y = reinterpret_cast<const uint8_t*>(p.y);
  const auto* src_info = reinterpret_cast<const int*>(p.src_info);
  for (int f = warp_id(); f < total; f += num_warps()) {
    int j = 0;
    while (f >= s_flat[j + 1]) ++j;
    const int row = s_seg_begin[j] + (f - s_flat[j]);
    const int t = src_info[int64_t(e) * rows_per_expert + row];
    auto* dst = reinterpret_cast<uint8_t*>(reinterpret_cast<const uint64_t*>(p.peer_recv)[j]);
    warp_copy16(dst + (int64_t(g) * p.num_max + t) * row_bytes, y + (int64_t(e) * rows_per_expert + row) * row_bytes,
                row_bytes);
  }
  __syncthreads();
  if (tid < R && !is_masked(p.masked, tid)) {
    auto* sig = reinterpret_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(p.peer_signal)[tid]);
    fence_system();
    st_release_sys(sig + g, uint64_t(tag) << 32);
  }
}

extern "C" __global__ void __launch_bounds__(256) ll_combine_recv(const UCCL_GRID_CONSTANT LLCombineRecvParams p) {
  __shared__ int s_expert[kMaxTopk];
  __shared__ float s_weight[kMaxTopk];
  __shared__ unsigned s_tag;
  const int t = blockIdx.x, tid = threadIdx.x;
  const int K = int(p.num_topk);
  const int E_loc = int(p.num_local_experts);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  if (tid == 0) s_tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  __syncthreads();
  if (t < p.num_tokens) {
    if (tid < K) {
      int g = int(reinterpret_cast<const int64_t*>(p.topk_idx)[int64_t(t) * K + tid]);
      if (g >= 0 && is_masked(p.masked, g / E_loc)) g = -1;
      if (g >= 0) {
        const int owner = g / E_loc;
        uint64_t waited = 0;
        int64_t got = wait_tagged(reinterpret_cast<const uint64_t*>(p.signal) + g, s_tag, uint64_t(p.timeout_ns), err,
                                  kPhaseLLCombineRecv, int(p.rank), owner, g, &waited);
        if (p.wait_stats != 0)
          atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + owner, (unsigned long long)waited);
        if (got < 0) g = -1;
      }
      s_expert[tid] = g;
      s_weight[tid] = reinterpret_cast<const float*>(p.topk_weights)[int64_t(t) * K + tid];
    }
    __syncthreads();
    const int64_t H = p.hidden;
    const auto* recv = reinterpret_cast<const uint8_t*>(p.recv_area);
    auto* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(t) * H * 2;
    for (int64_t c = tid; c < H / 8; c += blockDim.x) {
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
      for (int k0 = 0; k0 < K; k0 += 8) {  // 8 experts' loads in flight, summed in k order
        Vec16 r[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int g = k0 + u < K ? s_expert[k0 + u] : -1;
          if (g >= 0) r[u] = ld16_cg(recv + ((int64_t(g) * p.num_max + t) * H + c * 8) * 2);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int g = k0 + u < K ? s_expert[k0 + u] : -1;
          if (g < 0) continue;
          float v[8];
          unpack_bf16x8(r[u], v);
          const float w = s_weight[k0 + u];
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(v[i], w));
        }
      }
      st16(out + c * 16, pack_bf16x8(acc));
    }
  }
  last_block_bumps_seq(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<unsigned*>(p.seq));
}
