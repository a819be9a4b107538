// Low-latency dispatch over NVLink: per-expert padded slabs with in-kernel FP8 (DeepEP V1 LL).
//
// Send (ll_dispatch_send, one block per global expert e, on the current stream):
//   1. the block finds the tokens of this rank that select e, in token order (a block scan over
//      topk_idx), so slot i of (e, this rank) holds the i-th such token: deterministic, no atomics;
//   2. its warps cast each token (FP8 per 128 channels, or BF16 as is) straight into the slot of
//      the owner rank's receive area (a peer pointer through an IPC map, or local memory);
//   3. after a block barrier, thread 0 publishes (tag << 32 | count) into signal[e_loc][rank] of
//      the owner with a system-scope release.
// Recv (ll_dispatch_recv, one block per local expert, now or in the recv hook):
//   waits (bounded) for every source's signal, lays the sources out in rank order (begin_j =
//   prefix of counts), writes layout_range / recv_count / stats, and copies messages into the
//   caller's tensors: data rows, column-major scales (packed to UE8M0 if asked), src_info.
//
// NOTES: signals are never cleared. A tag is "completed ops on this buffer set + 1": every rank
// runs the same sequence of LL ops, so sender and receiver agree on it, a stale signal from the
// previous use of the set carries an older tag, and the device-side counter makes CUDA-graph
// replays correct without host involvement. The last receive block bumps the set's counter.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxRanks = 64;

// Cast one BF16 token to FP8 (per 128 channels) into msg payload + scales, one warp.
UCCL_DEVICE void warp_cast_fp8(const uint16_t* x_row, uint8_t* dst_data, float* dst_scales, int64_t hidden,
                               bool round_scale) {
  const int lane = lane_id();
  const int64_t nchunk = hidden / 16;  // 16 channels per lane and step; 8 lanes per 128-block
  for (int64_t base = 0; base < nchunk; base += 2 * kWarpSize) {
    float v[2][16];
    float amax[2] = {0.0f, 0.0f};
    Vec16 raw[2][2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // issue both chunks' loads before any use
      const int64_t c = base + u * kWarpSize + lane;
      if (c < nchunk) {
        raw[u][0] = ld16(x_row + c * 16);
        raw[u][1] = ld16(x_row + c * 16 + 8);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t c = base + u * kWarpSize + lane;
      if (c < nchunk) {
        unpack_bf16x8(raw[u][0], v[u]);
        unpack_bf16x8(raw[u][1], v[u] + 8);
#pragma unroll
        for (int i = 0; i < 16; ++i) amax[u] = fmaxf(amax[u], fabsf(v[u][i]));
      }
      amax[u] = fmaxf(amax[u], shfl_xor(amax[u], 1));
      amax[u] = fmaxf(amax[u], shfl_xor(amax[u], 2));
      amax[u] = fmaxf(amax[u], shfl_xor(amax[u], 4));
      if (c < nchunk) {
        float scale, scale_inv;
        fp8_block_scales(amax[u], round_scale, &scale, &scale_inv);
        st16(dst_data + c * 16, quantize16(v[u], scale));
        if ((c & 7) == 0) dst_scales[c >> 3] = scale_inv;
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) ll_dispatch_send(const UCCL_GRID_CONSTANT LLDispatchParams p) {
  extern __shared__ int smem[];
  const int e = blockIdx.x;
  const int R = int(p.num_ranks), K = int(p.num_topk), T = int(p.num_tokens);
  const int E_loc = int(p.num_experts / p.num_ranks);
  const int dst = e / E_loc, e_loc = e % E_loc;
  const int tid = threadIdx.x;
  int* tokens = smem;                       // [T] tokens selecting e, in order
  int* scratch = smem + (T > 0 ? T : 1);    // [2 * blockDim.x]

  // 1. tokens of this rank selecting e, in token order. The K ids of a token are loaded
  //    independently (no early exit) so a thread has all its loads in flight at once.
  const auto* topk = reinterpret_cast<const int64_t*>(p.topk_idx);
  const int per = (T + int(blockDim.x) - 1) / int(blockDim.x);
  const int t0 = min(T, tid * per), t1 = min(T, t0 + per);
  uint32_t hits = 0;  // bit i: token t0 + i selects e (per <= 32 checked by the host)
  for (int t = t0; t < t1; ++t) {
    bool hit = false;
    for (int k = 0; k < K; ++k) hit |= topk[int64_t(t) * K + k] == e;
    hits |= uint32_t(hit) << (t - t0);
  }
  int count = 0;
  int pos = block_exclusive_scan(__popc(hits), scratch, &count);
  for (int t = t0; t < t1; ++t)
    if ((hits >> (t - t0)) & 1u) tokens[pos++] = t;
  __syncthreads();
  count = min(count, int(p.num_max));
  const bool skip = is_masked(p.masked, dst);
  const uint32_t tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;

  // 2. write the messages into the owner's receive area.
  if (!skip) {
    auto* recv = reinterpret_cast<uint8_t*>(reinterpret_cast<const uint64_t*>(p.peer_recv)[dst]);
    const int64_t slot0 = (int64_t(e_loc) * R + p.rank) * p.num_max;
    const auto* x = reinterpret_cast<const uint16_t*>(p.x);
    for (int i = warp_id(); i < count; i += num_warps()) {
      const int t = tokens[i];
      uint8_t* msg = recv + (slot0 + i) * p.msg_bytes;
      if (lane_id() == 0) {
        Vec16 header = {{uint32_t(t), 0u, 0u, 0u}};
        st16(msg, header);
      }
      const uint16_t* row = x + int64_t(t) * p.hidden;
      if (p.use_fp8) {
        warp_cast_fp8(row, msg + 16, reinterpret_cast<float*>(msg + 16 + p.hidden), p.hidden, p.round_scale != 0);
      } else {
        warp_copy16(msg + 16, row, p.hidden * 2);
      }
    }
  }
  // 3. publish the count once every warp's stores are done.
  __syncthreads();
  if (tid == 0 && !skip) {
    auto* sig = reinterpret_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(p.peer_signal)[dst]);
    fence_system();
    st_release_sys(sig + int64_t(e_loc) * R + p.rank, (uint64_t(tag) << 32) | uint32_t(count));
  }
}

extern "C" __global__ void __launch_bounds__(256) ll_dispatch_recv(const UCCL_GRID_CONSTANT LLDispatchRecvParams p) {
  __shared__ int s_count[kMaxRanks];
  __shared__ int s_begin[kMaxRanks + 1];
  __shared__ unsigned s_tag;
  const int e = blockIdx.x;
  const int R = int(p.num_ranks), tid = threadIdx.x;
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  if (tid == 0) s_tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  __syncthreads();

  if (tid < R) {
    int n = 0;
    if (!is_masked(p.masked, tid)) {
      uint64_t waited = 0;
      const auto* sig = reinterpret_cast<const uint64_t*>(p.signal) + int64_t(e) * R + tid;
      int64_t got = wait_tagged(sig, s_tag, uint64_t(p.timeout_ns), err, kPhaseLLDispatchRecv, int(p.rank), tid,
                                int(p.rank * p.num_local_experts + e), &waited);
      n = got < 0 ? 0 : int(got);
      if (p.wait_stats != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + tid, (unsigned long long)waited);
    }
    s_count[tid] = n;
  }
  __syncthreads();
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

  const int total = s_begin[R];
  const auto* recv = reinterpret_cast<const uint8_t*>(p.recv_area);
  const int64_t H = p.hidden;
  for (int row = warp_id(); row < total; row += num_warps()) {
    int j = 0;
    while (row >= s_begin[j + 1]) ++j;
    const int i = row - s_begin[j];
    const uint8_t* msg = recv + ((int64_t(e) * R + j) * p.num_max + i) * p.msg_bytes;
    const int64_t out_row = int64_t(e) * rows_per_expert + row;
    if (lane_id() == 0) reinterpret_cast<int*>(p.src_info)[out_row] = *reinterpret_cast<const int*>(msg);
    if (p.use_fp8) {
      warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + out_row * H, msg + 16, H);
      const auto* scales = reinterpret_cast<const float*>(msg + 16 + H);
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
    } else {
      warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + out_row * H * 2, msg + 16, H * 2);
    }
  }
  last_block_bumps_seq(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<unsigned*>(p.seq));
}
