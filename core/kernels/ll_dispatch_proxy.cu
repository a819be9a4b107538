// Low-latency dispatch through the CPU proxy (the variant of ll_dispatch.cu for peers reached by
// a transport: another node, or a same-host GPU when UCCL_EP_FORCE_PROXY /
// allow_nvlink_for_low_latency_mode=False). Same outputs as the NVLink kernels, bit for bit.
//
// Send (ll_dispatch_proxy_send, one block per token t of this rank):
//   1. the block histograms topk_idx, so the slot of t in expert e's block is the number of
//      earlier selections of e (token order, as the reference);
//   2. its threads cast token t once (FP8 per 128 channels, or BF16) into the slot of every
//      selected expert's block in this rank's send area, and write t into the block's index list;
//   3. the block that stages the last token of expert e (a device counter per expert) writes the
//      block header {count} and pushes one Write (header + indices + count payloads, into the
//      owner's recv area at [local expert][this rank]) and one fenced Atomic into the FIFO of e.
//      Experts no token selects still get a header-only Write and their Atomic.
// Recv (ll_dispatch_proxy_recv, one block per local expert, now or in the recv hook): waits
// (bounded) until the receiving proxy counted every source's Atomic -- which it releases only
// after that source's Write landed -- reads the count from the block header and lays the
// sources out in rank order, exactly as ll_dispatch_recv does.
//
// NOTES: one Write per (destination, expert) instead of one per token: a proxy hop costs about
// as much per command as per kilobyte, so the kernel coalesces what DeepEP's IBGDA posts one
// token at a time. The block layout puts a token's slot at the same offset on both sides.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/proxy_ll.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxRanks = 64;
constexpr int kMaxTopk = 32;

// Header, then the Write and Atomic of expert e's block (count n) to its owner.
__device__ void publish_block(const LLProxyDispatchParams& p, int e, int n) {
  const int E_loc = int(p.num_experts / p.num_ranks);
  const int owner = e / E_loc, e_loc = e % E_loc;
  store_block_header(reinterpret_cast<uint8_t*>(p.send_area) + int64_t(e) * p.block_bytes, n);
  const uint64_t src_off = uint64_t(p.send_off + int64_t(e) * p.block_bytes);
  const uint64_t dst_off = uint64_t(p.recv_off + (int64_t(e_loc) * p.num_ranks + p.rank) * p.block_bytes);
  const uint32_t len = uint32_t(16 + p.idx_bytes + int64_t(n) * p.payload_bytes);
  push_write_and_signal(reinterpret_cast<const FifoLayout*>(p.fifos), int(p.num_fifos), e, owner, src_off, dst_off,
                        len, uint32_t(p.counter_base + e_loc), uint64_t(p.timeout_ns),
                        reinterpret_cast<ErrorWord*>(p.error), PushSite{kPhaseLLDispatchSend, int(p.rank), owner, e});
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ll_dispatch_proxy_send(const UCCL_GRID_CONSTANT LLProxyDispatchParams p) {
  extern __shared__ int smem[];  // [E] selections before this token, [E] selections in total
  __shared__ int s_expert[kMaxTopk];
  __shared__ uint8_t* s_slot[kMaxTopk];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int R = int(p.num_ranks), K = int(p.num_topk), T = int(p.num_tokens), E = int(p.num_experts);
  const int E_loc = E / R;
  int* before = smem;
  int* total = smem + E;
  for (int i = tid; i < 2 * E; i += blockDim.x) smem[i] = 0;
  __syncthreads();
  const auto* topk = reinterpret_cast<const int64_t*>(p.topk_idx);
  for (int i = tid; i < T * K; i += blockDim.x) {
    const int64_t e = topk[i];
    if (e < 0 || e >= E) continue;
    atomicAdd(total + e, 1);
    if (i / K < t) atomicAdd(before + e, 1);
  }
  __syncthreads();
  auto* stage = reinterpret_cast<uint8_t*>(p.send_area);

  if (t < T) {
    if (tid < K) {
      int e = int(topk[int64_t(t) * K + tid]);
      if (e < 0 || e >= E || is_masked(p.masked, e / E_loc)) e = -1;
      s_expert[tid] = e;
      s_slot[tid] = nullptr;
      if (e >= 0) {
        uint8_t* block = stage + int64_t(e) * p.block_bytes;
        reinterpret_cast<int*>(block + 16)[before[e]] = t;
        s_slot[tid] = block + 16 + p.idx_bytes + int64_t(before[e]) * p.payload_bytes;
      }
    }
    __syncthreads();
    const uint16_t* row = reinterpret_cast<const uint16_t*>(p.x) + int64_t(t) * p.hidden;
    if (p.use_fp8) {
      const int nchunk = int(p.hidden / 16);  // 16 channels per thread; 8 threads per 128-block
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
        amax = fmaxf(amax, shfl_xor(amax, 1));
        amax = fmaxf(amax, shfl_xor(amax, 2));
        amax = fmaxf(amax, shfl_xor(amax, 4));
        if (c >= nchunk) continue;
        float scale, scale_inv;
        fp8_block_scales(amax, p.round_scale != 0, &scale, &scale_inv);
        const Vec16 q = quantize16(v, scale);
        for (int k = 0; k < K; ++k) {
          uint8_t* slot = s_slot[k];
          if (slot == nullptr) continue;
          st16(slot + c * 16, q);
          if ((c & 7) == 0) reinterpret_cast<float*>(slot + p.hidden)[c >> 3] = scale_inv;
        }
      }
    } else {
      for (int c = tid; c < p.hidden / 8; c += blockDim.x) {
        const Vec16 v = ld16(row + c * 8);
        for (int k = 0; k < K; ++k)
          if (s_slot[k] != nullptr) st16(s_slot[k] + c * 16, v);
      }
    }
    __syncthreads();
    if (tid < K && s_expert[tid] >= 0) {  // one thread per selected expert, all in parallel
      const int e = s_expert[tid];
      fence_system();  // the block's staging stores (ordered by the barrier) before this count
      const unsigned prev = atomicAdd(reinterpret_cast<unsigned*>(p.finish) + e, 1u);
      if (int(prev) + 1 == total[e]) {  // last stager of e: everyone's stores are ordered before
        reinterpret_cast<unsigned*>(p.finish)[e] = 0u;
        fence_system();
        publish_block(p, e, total[e]);
      }
    }
  }
  // Experts that no token of this rank selects still get their (empty) block and signal.
  for (int e = blockIdx.x + int(gridDim.x) * tid; e < E; e += int(gridDim.x) * int(blockDim.x)) {
    if (total[e] != 0 || is_masked(p.masked, e / E_loc)) continue;
    publish_block(p, e, 0);
  }
}

extern "C" __global__ void __launch_bounds__(256)
    ll_dispatch_proxy_recv(const UCCL_GRID_CONSTANT LLProxyDispatchRecvParams p) {
  __shared__ int s_count[kMaxRanks];
  __shared__ int s_begin[kMaxRanks + 1];
  const int e = blockIdx.x;
  const int R = int(p.num_ranks), tid = threadIdx.x;
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const auto* recv = reinterpret_cast<const uint8_t*>(p.recv_area);
  const auto* rounds = reinterpret_cast<const int64_t*>(p.rounds);

  if (tid < R) {
    int n = 0;
    if (!is_masked(p.masked, tid)) {
      uint64_t waited = 0;
      const int expert = int(p.rank * p.num_local_experts + e);
      const int64_t got = wait_counter(counter_of(p.counters, p.num_counters, tid, p.counter_base + e),
                                       round_target(rounds, tid), reinterpret_cast<const uint64_t*>(p.status),
                                       uint64_t(p.timeout_ns), err, kPhaseLLDispatchRecv, int(p.rank), tid, expert,
                                       &waited);
      if (got >= 0) {
        n = load_block_count(recv + (int64_t(e) * R + tid) * p.block_bytes, p.num_max);
        if (n < 0) {
          raise_error(err, kErrProtocol, kPhaseLLDispatchRecv, int(p.rank), tid, expert, 0);
          n = 0;
        }
      }
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
  const int64_t H = p.hidden;
  for (int row = warp_id(); row < total; row += num_warps()) {
    int j = 0;
    while (row >= s_begin[j + 1]) ++j;
    const int i = row - s_begin[j];
    const uint8_t* block = recv + (int64_t(e) * R + j) * p.block_bytes;
    const uint8_t* payload = block + 16 + p.idx_bytes + int64_t(i) * p.payload_bytes;
    const int64_t out_row = int64_t(e) * rows_per_expert + row;
    if (lane_id() == 0)
      reinterpret_cast<int*>(p.src_info)[out_row] = ld_volatile(reinterpret_cast<const int*>(block + 16) + i);
    if (p.use_fp8) {
      warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + out_row * H, payload, H);
      const auto* scales = reinterpret_cast<const float*>(payload + H);
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
      warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + out_row * H * 2, payload, H * 2);
    }
  }
  last_block_bumps_rounds(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<int64_t*>(p.rounds), R, p.masked);
}
