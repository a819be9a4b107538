// Low-latency combine over NVLink: weighted sum of expert outputs back at the source rank.
//
// Combine area of a buffer set (this kernel's part; ll/nvlink/dispatch.cu lays the same bytes out its own
// way): rows [E][num_max] BF16 of hidden; at flag_off, past both kernels' parts (a flag must never
// hold a dispatch's bytes), one u64 flag per row [E][num_max].
//
// Send (ll_combine_send, a grid of a few blocks per SM): the rows of all local experts' slabs are
// one flat list of work items, ordered by (local expert e, source rank j) (prefix of the counts in
// layout_range, kept in shared memory with each segment's first row); a warp copies row (e, r),
// which came from source rank j with token t = src_info[e][r], into rank j's combine area at
// [global expert][t], then publishes (tag << 32) into that row's flag with a system-scope release.
// Recv (ll_combine_recv, one block per token t of Tuning.ll_combine_recv_threads threads): wait
// (bounded) for the flag of every row (expert in topk_idx[t], t) it needs (skipping -1 and masked
// ranks), then out[t] = sum_k w[t,k] * y_k in fp32 with k ascending, one IEEE-rounded multiply and
// add each (bit-exact with uccl_ep.refs), cast to BF16.
//
// NOTES: one flag per row, not a counter per expert: a row is published by the warp that wrote
// it (a fence and one store), with no device-wide atomic and no "last writer" round trip, experts
// with no rows need no message, and a receiving block can sum its token as soon as its own K rows
// are in (the receive kernel starts early, see Tuning.ll_pdl). Each (expert, token) row is
// written at most once per op (top-k ids of a token are distinct), so the flag's tag says "this
// op's row is here"; flags are never cleared (tags: see ll/nvlink/dispatch.cu).
// Shrink mode (device/shrink.cuh): masked ranks are read from the device mask when the kernels run;
// a row whose wait expires masks its owner and is left out of the sum. A top-k row that repeats an
// expert is refused (error word, InvalidArgument on the host) and the repeat counted once.
// NOTES: zero_copy needs no special path here: the caller wrote the expert outputs into this
// rank's registered send area, which is simply passed as `y`.
// LogFMT (built with UCCL_EP_LL_LOGFMT=1, low_latency_combine(use_logfmt=True); device/logfmt.cuh):
// the warp encodes its row into the peer's row slot (same place, at most the same bytes) and the
// division meta words into the [E][T][H/128] u32 area at meta_off; the receiver decodes each
// channel before the same multiply and add.
// NOTES: a -D variant, not a kernel parameter: the BF16 kernels stay the same code (no branch, no
// registers or shared memory for the encoder), so their speed cannot move; the executor loads both
// builds when it starts (a first-call compile on one rank would keep its peers waiting).
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ll_rows.cuh"
#include "uccl_ep/device/logfmt.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/shrink.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {
constexpr int kMaxTopk = 32;
}  // namespace

extern "C" __global__ void __launch_bounds__(256) ll_combine_send(const UCCL_GRID_CONSTANT LLCombineParams p) {
  // [E + 1] prefix of rows per (local expert, source rank) segment, [E] each segment's first row
  // in its expert's slab, [2 * blockDim.x] scan scratch.
  extern __shared__ int smem[];
#if UCCL_EP_LL_LOGFMT
  __shared__ __align__(16) uint32_t s_logfmt_stage[256 / kLogfmtLanes * kLogfmtStageWords];
#endif
  const int tid = threadIdx.x;
  const int R = int(p.num_ranks), E_loc = int(p.num_local_experts), E = E_loc * R;
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  const auto* lr = reinterpret_cast<const int64_t*>(p.layout_range);
  const uint32_t tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  allow_dependent_launch();  // the receive kernel may start now: every block has read the op counter
  const int64_t masked = block_mask_bits(p.mask, R);  // the mask now (shrink.cuh)
  const auto* peer_recv = reinterpret_cast<const uint64_t*>(p.peer_recv);
  int* prefix = smem;
  int* first_row = smem + E + 1;
  int* scratch = first_row + E;
  int carry = 0;
  for (int f0 = 0; f0 < E; f0 += blockDim.x) {  // f = e * R + j, the order of the work items
    const int f = f0 + tid;
    int cnt = 0;
    if (f < E && !is_masked(masked, f % R)) {
      const int64_t packed = lr[f];
      cnt = int(packed & 0xffffffff);
      first_row[f] = int(packed >> 32);
    }
    int sum = 0;
    const int excl = block_exclusive_scan(cnt, scratch, &sum);
    if (f < E) prefix[f] = carry + excl;
    carry += sum;
  }
  if (tid == 0) prefix[E] = carry;
  __syncthreads();
  const int total = prefix[E];
  const int64_t row_bytes = p.hidden * 2;
  const int gw = blockIdx.x * num_warps() + warp_id(), nw = gridDim.x * num_warps();
  for (int item = gw; item < total; item += nw) {
    int lo = 0, hi = E;  // largest f with prefix[f] <= item (empty segments share their prefix)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (prefix[mid] <= item) lo = mid; else hi = mid;
    }
    const int e = lo / R, j = lo % R;
    const int row = first_row[lo] + (item - prefix[lo]);
    const int g = int(p.rank) * E_loc + e;
    const int t = reinterpret_cast<const int*>(p.src_info)[int64_t(e) * rows_per_expert + row];
#if UCCL_EP_LL_LOGFMT
    {  // parts A / B in the BF16 row's own places (logfmt.cuh)
      uint8_t* dst = reinterpret_cast<uint8_t*>(peer_recv[j]) + (int64_t(g) * p.num_max + t) * row_bytes;
      warp_logfmt_encode_row(dst, kLogfmtDivBytes, dst + kLogfmtPartA, kLogfmtDivBytes,
                             reinterpret_cast<uint8_t*>(peer_recv[j]) + p.meta_off +
                                 (int64_t(g) * p.num_max + t) * (p.hidden / 128) * 4,
                             reinterpret_cast<const uint8_t*>(p.y) + (int64_t(e) * rows_per_expert + row) * row_bytes,
                             int(p.hidden / 128), s_logfmt_stage);
    }
#else
    warp_copy16(reinterpret_cast<uint8_t*>(peer_recv[j]) + (int64_t(g) * p.num_max + t) * row_bytes,
                reinterpret_cast<const uint8_t*>(p.y) + (int64_t(e) * rows_per_expert + row) * row_bytes, row_bytes);
#endif
    sync_warp();
    if (lane_id() == 0)  // release (system scope): the warp's row before its flag
      st_release_sys(ll_flags(peer_recv[j], p.flag_off) + int64_t(g) * p.num_max + t,
                     uint64_t(tag) << 32);
    sync_warp();
  }
}

extern "C" __global__ void __launch_bounds__(512) ll_combine_recv(const UCCL_GRID_CONSTANT LLCombineRecvParams p) {
  __shared__ int s_expert[kMaxTopk];
  __shared__ float s_weight[kMaxTopk];
  __shared__ unsigned s_tag;
  const int t = blockIdx.x, tid = threadIdx.x;
  const int K = int(p.num_topk);
  const int E_loc = int(p.num_local_experts);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const bool shrink = p.shrink != 0;
  if (tid == 0) s_tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  __syncthreads();
  if (t < p.num_tokens) {
    if (warp_id() == 0) {  // K <= kMaxTopk <= the warp: lane k waits for the row of the token's k-th expert
      const int lane = lane_id();
      int g = lane < K ? int(reinterpret_cast<const int64_t*>(p.topk_idx)[int64_t(t) * K + lane]) : -1;
      if (repeats_lower_lane(g, lane, K)) {  // refused (the host raises InvalidArgument); counted once
        duplicate_expert(err, kPhaseLLCombineRecv, int(p.rank), t, g);
        g = -1;
      }
      if (g >= 0 && rank_masked(p.mask, g / E_loc)) g = -1;
      if (g >= 0) {
        const int owner = g / E_loc;
        uint64_t waited = 0;
        const uint64_t* flag = ll_flags(p.recv_area, p.flag_off) + int64_t(g) * p.num_max + t;
        int64_t got = wait_tagged_peer(flag, s_tag, uint64_t(p.timeout_ns), err, kPhaseLLCombineRecv, int(p.rank),
                                       owner, g, &waited, p.mask, shrink);
        if (p.wait_stats != 0)
          atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + owner, (unsigned long long)waited);
        if (got < 0) g = -1;  // timed out (shrink mode: the owner is masked, its rows dropped)
      }
      if (lane < K) {
        s_expert[lane] = g;
        s_weight[lane] = reinterpret_cast<const float*>(p.topk_weights)[int64_t(t) * K + lane];
      }
    }
    __syncthreads();
    const int64_t H = p.hidden;
    const auto* recv = reinterpret_cast<const uint8_t*>(p.recv_area);
    auto* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(t) * H * 2;
    for (int64_t c = tid; c < H / 8; c += blockDim.x) {
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
#if UCCL_EP_LL_LOGFMT
      for (int k = 0; k < K; ++k) {  // decoded, then the BF16 path's multiply and add, in k order
        const int g = s_expert[k];
        if (g < 0) continue;
        float v[8];
        const uint8_t* row = recv + (int64_t(g) * p.num_max + t) * H * 2;
        logfmt_decode8(row, kLogfmtDivBytes, row + kLogfmtPartA, kLogfmtDivBytes,
                       recv + p.meta_off + (int64_t(g) * p.num_max + t) * (H / 128) * 4, c, v);
        const float w = s_weight[k];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(v[i], w));
      }
#else
      add_weighted_rows(acc, s_expert, s_weight, K, [&](int k) {
        return recv + ((int64_t(s_expert[k]) * p.num_max + t) * H + c * 8) * 2;
      });
#endif
      st16(out + c * 16, pack_bf16x8(acc));
    }
  }
  wait_overlapped_grids();  // the send kernel is done (see arch.cuh) before this op can complete
  last_block_bumps_seq(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<unsigned*>(p.seq));
}
