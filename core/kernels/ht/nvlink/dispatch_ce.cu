// Intranode (NVLink) dispatch with the copy engines on the receiving side (Tuning.ht_dispatch_ce),
// and the small kernels both copy-engine ops share.
//
// A rank's received rows from source j are one contiguous run of recv_x (rows ordered by source
// rank, then source token), so once they sit packed in a staging buffer, moving them into recv_x
// is one plain copy per chunk, which the receiver's copy engines make (uccl_ep/cuda/ht_ce.py):
//   ht_ce_begin (1 thread, current stream): the op's epoch; wait until every peer freed what
//     this rank wrote into its staging buffer last time;
//   ht_dispatch_ce (every block, current stream): token t's row for rank j goes to position
//     idx_j(t) = #{t' < t routed to j} -- own rows straight into recv_x at rank_prefix[me - 1][me]
//     + idx, peers' rows (with their scales, local top-k ids / weights, source index) into
//     j's dispatch region for this rank; once a chunk of chunk_rows positions toward j is
//     complete, dflags[me][chunk] = epoch in j's buffer (system-scope release);
//   ht_ce_wait (1 thread, a copy stream per source, before each chunk's copy): bounded wait for
//     that flag, so the copy engine never spins unbounded and a missing peer ends in Timeout.
// Blocks take batches of up to 256 tokens (>= 4 per block); a batch's positions = the count over earlier tokens (the
// notify kernel's per-channel prefix, then a scan of the batch's channel up to it) + a block scan.
//
// NOTES: why: the ring dispatch copies every remote row twice on the SMs (x -> the receiver's ring,
// ring -> recv_x), which bounds it at <= 12 SMs (docs/benchmarks.md). Here the SMs copy each row
// once (own rows to recv_x, peers' rows to the peer's staging buffer over NVLink) and the
// receiver's copy engines make the second copy, local and off the SMs.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ht_tuning.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kBatch = 256;  // most tokens per batch: one thread each for the metadata
constexpr int kMinRounds = 4;  // batches per block at least (while batches hold >= 1 token)

}  // namespace

extern "C" __global__ void ht_ce_begin(const UCCL_GRID_CONSTANT HTCEBeginParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int R = int(p.num_ranks), me = int(p.rank);
  uint64_t* epoch_word = ce_word(p.stage, uint64_t(p.epoch_off));
  const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(epoch_word) + 1;
  *reinterpret_cast<volatile uint64_t*>(epoch_word) = epoch;
  *reinterpret_cast<volatile uint64_t*>(ce_word(p.stage, uint64_t(p.epoch_src_off))) = epoch;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  for (int j = 0; j < R; ++j) {
    if (j == me) continue;
    if (!wait_u64_at_least(ce_word(p.stage, uint64_t(p.freed_off) + 8ull * j), epoch - 1, uint64_t(p.timeout_ns), err,
                       int(p.phase), me, j, -1))
      return;
  }
  __threadfence_system();  // epoch_src before the copy engines read it
}

extern "C" __global__ void ht_ce_wait(const UCCL_GRID_CONSTANT HTCEWaitParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(ce_word(p.stage, uint64_t(p.epoch_off)));
  wait_u64_at_least(reinterpret_cast<const uint64_t*>(p.flag), epoch, uint64_t(p.timeout_ns),
                reinterpret_cast<ErrorWord*>(p.error), kPhaseHTDispatchRecv, int(p.rank), int(p.peer), int(p.chunk));
}

extern "C" __global__ void __launch_bounds__(kHTThreads, 1) ht_dispatch_ce(const UCCL_GRID_CONSTANT HTDispatchCEParams p) {
  const int R = int(p.num_ranks), C = int(p.num_channels), me = int(p.rank);
  const int T = int(p.num_tokens);
  const int64_t K = p.num_topk, HB = p.hidden_bytes, NS = p.num_scales;
  const int per = (T + C - 1) / C;
  const int E_loc = int(p.num_experts / R);
  const int lane = lane_id(), warp = warp_id(), nw = num_warps(), tid = threadIdx.x;
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  const auto* chp = reinterpret_cast<const int*>(p.channel_prefix);
  const auto* peers = reinterpret_cast<const uint64_t*>(p.peer_stage);
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(ce_word(p.stage, kCEDEpochOffset));
  const int own_off = me > 0 ? reinterpret_cast<const int*>(p.rank_prefix)[(me - 1) * R + me] : 0;
  // this rank's dispatch region in peer j's staging buffer
  const auto region_at = [&](int j) {
    return peers[j] + uint64_t(p.region_base) + uint64_t(ce_region_slot(me, j)) * uint64_t(p.region_bytes);
  };
  __shared__ int s_pre[kRanks];            // positions before this batch, per destination
  __shared__ int s_wcnt[kBatch / kWarpSize][kRanks];  // per warp (wavefront on AMD)
  __shared__ int s_idx[kBatch][kRanks];    // token's position toward j, -1 if not routed there
  __shared__ int s_total[kRanks];          // this batch's tokens per destination

  // NOTES: batch size. Fixed 256-token batches left blocks idle (4096 tokens = 16 batches: at 12
  // blocks 4 of them ran a second batch while 8 waited, at 24 blocks 8 had none), and the chunks of
  // the last round only complete when the kernel ends, so their copies trail it. Batches of
  // ceil(T / (blocks x kMinRounds)) tokens give every block the same work within one batch and
  // complete the chunks in >= 4 waves the copy engines follow.
  const int G = int(gridDim.x);
  const int bsz = max(1, min(kBatch, (T + G * kMinRounds - 1) / (G * kMinRounds)));
  for (int b0 = int(blockIdx.x) * bsz; b0 < T; b0 += G * bsz) {
    const int n = min(bsz, T - b0);
    // a. tokens before the batch, per destination: the notify kernel's count for the channels
    //    before the batch's (channel_prefix), plus a scan of that channel up to the batch
    const int c0 = b0 / per;
    if (tid < kRanks) s_pre[tid] = tid < R && c0 > 0 ? chp[tid * C + c0 - 1] : 0;
    __syncthreads();
    {
      int cnt[kRanks];
#pragma unroll
      for (int j = 0; j < kRanks; ++j) cnt[j] = 0;
      for (int t = c0 * per + tid; t < b0; t += blockDim.x)
#pragma unroll
        for (int j = 0; j < kRanks; ++j)
          if (j < R) cnt[j] += in_rank[int64_t(t) * R + j];
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        const int v = warp_sum(cnt[j]);
        if (lane == 0 && j < R && v != 0) atomicAdd(&s_pre[j], v);
      }
    }
    // b. positions inside the batch (each warp holds kWarpSize tokens)
    int in_bits = 0;
    if (tid < kBatch) {
      const int t = b0 + tid;
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        const bool in = j < R && tid < n && in_rank[int64_t(t) * R + j];
        const uint64_t m = warp_ballot(in);
        if (in) in_bits |= 1 << j;
        if (lane == 0 && j < R) s_wcnt[tid / kWarpSize][j] = popc64(m);
        s_idx[tid][j] = in ? popc64(m & lanemask_lt()) : -1;
      }
    }
    __syncthreads();
    if (tid < kBatch && tid < n) {
      const int t = b0 + tid, c = t / per;
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        if (j >= R) continue;
        int idx = -1;
        if ((in_bits >> j) & 1) {
          idx = s_pre[j];
          for (int w = 0; w < tid / kWarpSize; ++w) idx += s_wcnt[w][j];
          idx += s_idx[tid][j];
        }
        s_idx[tid][j] = idx;
        if (p.fresh)  // the position inside the token's channel, as the ring dispatch records it
          reinterpret_cast<int*>(p.send_head)[int64_t(t) * R + j] = idx < 0 ? -1 : idx - (c > 0 ? chp[j * C + c - 1] : 0);
        // cached dispatch: rows (and scales) only. NOTES: `fresh`, not a null output pointer, says
        // which: a rank that receives no rows has empty (null) outputs but still sends metadata.
        if (idx < 0 || !p.fresh) continue;
        // metadata: the source index and top-k ids local to j (-1 elsewhere, weight 0)
        int64_t* ids;
        float* wts;
        int* src;
        if (j == me) {
          const int64_t row = own_off + idx;
          ids = reinterpret_cast<int64_t*>(p.recv_topk_idx) + row * K;
          wts = reinterpret_cast<float*>(p.recv_topk_weights) + row * K;
          src = reinterpret_cast<int*>(p.recv_src_idx) + row;
        } else {
          const uint64_t region = region_at(j);
          ids = reinterpret_cast<int64_t*>(region + p.topk_off) + int64_t(idx) * K;
          wts = reinterpret_cast<float*>(region + p.weights_off) + int64_t(idx) * K;
          src = reinterpret_cast<int*>(region + p.src_off) + idx;
        }
        *src = t;
        if (p.topk_idx == 0) continue;
        const int64_t lo = int64_t(j) * E_loc;
        for (int64_t kk = 0; kk < K; ++kk) {
          const int64_t g = reinterpret_cast<const int64_t*>(p.topk_idx)[int64_t(t) * K + kk];
          const bool local = g >= lo && g < lo + E_loc;
          ids[kk] = local ? g - lo : -1;
          wts[kk] = local ? reinterpret_cast<const float*>(p.topk_weights)[int64_t(t) * K + kk] : 0.0f;
        }
      }
    }
    __syncthreads();
    // c. rows (and scales): warp w takes the batch's tokens w, w + nw, ...; each row is read once
    //    and stored to every destination it is routed to
    for (int i = warp; i < n; i += nw) {
      const int64_t t = b0 + i;
      uint8_t* dst[kRanks];
      uint32_t* sdst[kRanks];
      int num_dst = 0;
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        if (j >= R) continue;
        const int idx = s_idx[i][j];
        if (idx < 0) continue;
        if (j == me) {
          const int64_t row = own_off + idx;
          dst[num_dst] = reinterpret_cast<uint8_t*>(p.recv_x) + row * HB;
          sdst[num_dst] = NS > 0 ? reinterpret_cast<uint32_t*>(p.recv_scales) + row * NS : nullptr;
        } else {
          const uint64_t region = region_at(j);
          dst[num_dst] = reinterpret_cast<uint8_t*>(region) + int64_t(idx) * HB;
          sdst[num_dst] = NS > 0 ? reinterpret_cast<uint32_t*>(region + p.scales_off) + int64_t(idx) * NS : nullptr;
        }
        ++num_dst;
      }
      if (num_dst == 0) continue;
      warp_copy16_multi(dst, num_dst, reinterpret_cast<const uint8_t*>(p.x) + t * HB, HB);
      for (int64_t sc = lane; sc < NS; sc += kWarpSize) {
        const uint32_t v = reinterpret_cast<const uint32_t*>(p.x_scales)[t * p.scale_stride_token + sc * p.scale_stride_col];
#pragma unroll
        for (int d = 0; d < kRanks; ++d)
          if (d < num_dst) sdst[d][sc] = v;
      }
    }
    // d. count this batch's positions toward each peer into its chunks; the block completing a
    //    chunk raises the peer's flag for it (after a system-scope fence over the whole block's stores)
    if (tid < kRanks) {
      int total = 0;
      if (tid < R)
        for (int w = 0; w < (n + kWarpSize - 1) / kWarpSize; ++w) total += s_wcnt[w][tid];
      s_total[tid] = total;
    }
    __syncthreads();
    if (tid == 0) {
      __threadfence_system();
      for (int j = 0; j < R; ++j) {
        if (j == me || s_total[j] == 0) continue;
        const int lo = s_pre[j], hi = s_pre[j] + s_total[j];
        const int n_j = chp[j * C + C - 1];
        auto* counts = reinterpret_cast<unsigned*>(p.stage + kCEDCountOffset) + j * kCEMaxChunks;
        for (int k = lo / int(p.chunk_rows); k * int(p.chunk_rows) < hi; ++k) {
          const int c0 = k * int(p.chunk_rows), c1 = min(n_j, c0 + int(p.chunk_rows));
          const int part = min(hi, c1) - max(lo, c0);
          if (atomicAdd(counts + k, unsigned(part)) + unsigned(part) == unsigned(c1 - c0)) {
            counts[k] = 0u;  // complete: nobody else adds to it in this op
            st_release_sys(ce_word(peers[j], kCEDFlagsOffset + 8ull * (uint64_t(me) * kCEMaxChunks + k)), epoch);
          }
        }
      }
    }
    __syncthreads();  // the shared arrays are rewritten by the next batch
  }
}
