// Low-latency combine through the CPU proxy (the variant of ll_combine.cu for peers reached by a
// transport). Same output as the NVLink kernels, bit for bit.
//
// Send (ll_combine_proxy_send, a few blocks per SM): the received rows of local expert e from
// source j form the contiguous segment [begin_j, begin_j + count_j) of y[e] (layout_range), in
// the order of j's slots, i.e. of j's tokens. Warps stage the rows into this rank's send area
// (same positions; skipped when y is the send area: zero copy), count them per (e, j), and the
// warp that stages the last row of a segment pushes one Write of the whole segment into j's
// combine area at [global expert][slot 0..count) plus one fenced Atomic. Every (e, j) pair gets
// both, even with 0 rows.
// Recv (ll_combine_proxy_recv, one block per token t): for each expert g in topk_idx[t] (not -1,
// owner not masked) wait (bounded) for g's signal, find t's slot in g's segment (t's rank among
// this rank's selections of g, exactly the dispatch slot), and out[t] = sum_k w[t,k] * row_k in
// fp32, k ascending, one IEEE-rounded multiply and add each, cast to BF16.
//
// NOTES: every block also waits for the signals of the experts g = block (mod grid), so the
// kernel ends only after every peer's combine send -- which each peer issues after reading this
// rank's dispatch data. That is what lets the next op on this buffer set overwrite the send
// area the proxy copied from, with no extra handshake.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/proxy_ll.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxTopk = 32;

__device__ void publish_segment(const LLProxyCombineParams& p, int e, int j, int begin, int count) {
  const int64_t row_bytes = p.hidden * 2;
  const int64_t rows_per_expert = p.num_ranks * p.num_max;
  const int g = int(p.rank * p.num_local_experts) + e;
  const uint64_t src_off = uint64_t(p.send_off + (int64_t(e) * rows_per_expert + begin) * row_bytes);
  const uint64_t dst_off = uint64_t(p.recv_off + int64_t(g) * p.num_max * row_bytes);
  push_write_and_signal(reinterpret_cast<const FifoLayout*>(p.fifos), int(p.num_fifos), j * int(p.num_local_experts) + e,
                        j, src_off, dst_off, uint32_t(count * row_bytes), uint32_t(p.counter_base + e),
                        uint64_t(p.timeout_ns), reinterpret_cast<ErrorWord*>(p.error),
                        PushSite{kPhaseLLCombineSend, int(p.rank), j, g});
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256)
    ll_combine_proxy_send(const UCCL_GRID_CONSTANT LLProxyCombineParams p) {
  extern __shared__ int smem[];  // [E_loc + 1] prefix of rows per local expert, then scan scratch
  const int tid = threadIdx.x;
  const int R = int(p.num_ranks), E_loc = int(p.num_local_experts);
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  const auto* lr = reinterpret_cast<const int64_t*>(p.layout_range);
  int* prefix = smem;
  int* scratch = smem + E_loc + 1;  // [2 * blockDim.x]
  int carry = 0;
  for (int e0 = 0; e0 < E_loc; e0 += blockDim.x) {
    const int e = e0 + tid;
    int cnt = 0;
    if (e < E_loc)
      for (int j = 0; j < R; ++j)
        if (!is_masked(p.masked, j)) cnt += int(lr[int64_t(e) * R + j] & 0xffffffff);
    int sum = 0;
    const int excl = block_exclusive_scan(cnt, scratch, &sum);
    if (e < E_loc) prefix[e] = carry + excl;
    carry += sum;
  }
  if (tid == 0) prefix[E_loc] = carry;
  __syncthreads();
  const int total = prefix[E_loc];
  const int64_t row_bytes = p.hidden * 2;
  const bool stage_rows = p.y != p.send_area;
  auto* finish = reinterpret_cast<unsigned*>(p.finish);
  const int gw = blockIdx.x * num_warps() + warp_id(), nw = gridDim.x * num_warps();
  for (int item = gw; item < total; item += nw) {
    int lo = 0, hi = E_loc;  // largest e with prefix[e] <= item
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (prefix[mid] <= item) lo = mid; else hi = mid;
    }
    const int e = lo;
    int r = item - prefix[e], j = 0, begin = 0, count = 0;
    for (; j < R; ++j) {
      if (is_masked(p.masked, j)) continue;
      const int64_t packed = lr[int64_t(e) * R + j];
      count = int(packed & 0xffffffff);
      if (r < count) {
        begin = int(packed >> 32);
        break;
      }
      r -= count;
    }
    const int64_t at = (int64_t(e) * rows_per_expert + begin + r) * row_bytes;
    if (stage_rows)
      warp_copy16(reinterpret_cast<uint8_t*>(p.send_area) + at, reinterpret_cast<const uint8_t*>(p.y) + at, row_bytes);
    sync_warp();
    if (lane_id() == 0) {
      fence_system();  // this warp's staged row before its count
      const unsigned prev = atomicAdd(finish + int64_t(e) * R + j, 1u);
      if (int(prev) + 1 == count) {  // last row of segment (e, j): every warp's rows are ordered before
        finish[int64_t(e) * R + j] = 0u;
        fence_system();
        publish_segment(p, e, j, begin, count);
      }
    }
    sync_warp();
  }
  // Segments with no rows still get their (empty) Write and signal.
  for (int s = blockIdx.x + int(gridDim.x) * tid; s < E_loc * R; s += int(gridDim.x) * int(blockDim.x)) {
    const int e = s / R, j = s % R;
    if (is_masked(p.masked, j) || (lr[int64_t(e) * R + j] & 0xffffffff) != 0) continue;
    publish_segment(p, e, j, 0, 0);
  }
}

extern "C" __global__ void __launch_bounds__(256)
    ll_combine_proxy_recv(const UCCL_GRID_CONSTANT LLProxyCombineRecvParams p) {
  __shared__ int s_expert[kMaxTopk];
  __shared__ int s_slot[kMaxTopk];
  __shared__ float s_weight[kMaxTopk];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int K = int(p.num_topk), E = int(p.num_experts), R = int(p.num_ranks);
  const int E_loc = E / R;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const auto* rounds = reinterpret_cast<const int64_t*>(p.rounds);
  const auto* status = reinterpret_cast<const uint64_t*>(p.status);
  const auto* topk = reinterpret_cast<const int64_t*>(p.topk_idx);
  const uint64_t timeout = uint64_t(p.timeout_ns);
  if (t < p.num_tokens && tid < K) {
    int g = int(topk[int64_t(t) * K + tid]);
    if (g >= E || (g >= 0 && is_masked(p.masked, g / E_loc))) g = -1;
    int slot = 0;
    if (g >= 0) {
      for (int64_t i = 0; i < int64_t(t) * K; ++i) slot += topk[i] == g ? 1 : 0;  // dispatch's slot of t in g
      const int owner = g / E_loc;
      uint64_t waited = 0;
      const int64_t got = wait_counter(counter_of(p.counters, p.num_counters, owner, p.counter_base + g % E_loc),
                                       round_target(rounds, owner), status, timeout, err, kPhaseLLCombineRecv,
                                       int(p.rank), owner, g, &waited);
      if (p.wait_stats != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + owner, (unsigned long long)waited);
      if (got < 0) g = -1;
    }
    s_expert[tid] = g;
    s_slot[tid] = slot;
    s_weight[tid] = reinterpret_cast<const float*>(p.topk_weights)[int64_t(t) * K + tid];
  }
  // The signals of experts g = block (mod grid), read or not (see NOTES).
  for (int g = blockIdx.x + int(gridDim.x) * tid; g < E; g += int(gridDim.x) * int(blockDim.x)) {
    const int owner = g / E_loc;
    if (is_masked(p.masked, owner)) continue;
    wait_counter(counter_of(p.counters, p.num_counters, owner, p.counter_base + g % E_loc),
                 round_target(rounds, owner), status, timeout, err, kPhaseLLCombineRecv, int(p.rank), owner, g, nullptr);
  }
  __syncthreads();
  if (t < p.num_tokens) {
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
          if (g >= 0) r[u] = ld16_cg(recv + ((int64_t(g) * p.num_max + s_slot[k0 + u]) * H + c * 8) * 2);
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
  last_block_bumps_rounds(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<int64_t*>(p.rounds), R, p.masked);
}
