// Intranode (NVLink) combine: the reverse of dispatch, summing each token's rows from every rank.
//
// Grid: 2 blocks per channel, as in dispatch (and on the same rings: positions continue).
//   sender block 2c, group i: rows [recv_channel_prefix[i][c], next) of x came from rank i's
//     channel c in dispatch; the k-th goes back into slot base + k of ring (c, me -> i) in rank
//     i's buffer (BF16 row, then the top-k weights if given);
//   receiver block 2c + 1: every warp takes every (R*G)-th token of channel c; for token t and
//     each rank j (ascending) that received it, the row is at position base_j + send_head[t][j]
//     of ring (c, j -> me), or for j = me in x itself, at row recv_channel_prefix[me][c] +
//     send_head[t][me] (own rows need no ring: see copy_own_rows in ht/nvlink/dispatch.cu); out[t] = (bias0 + bias1) + row_0 + row_1 + ... in fp32, one IEEE add
//     at a time (bit-exact with uccl_ep.refs), cast to BF16; the weights are summed the same way.
//
// NOTES: a consumer warp publishes, per source, "all my positions below V are consumed" with V
// the source's position of the token it is about to take; see ht/nvlink/dispatch.cu for the
// counter rules. Consumers here are all R*G warps of the block, so producers take the minimum
// over that many counters.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/combine_sum.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/ht_tuning.cuh"
#include "uccl_ep/device/ring.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;


extern "C" __global__ void __launch_bounds__(kHTThreads, 1) ht_combine(const UCCL_GRID_CONSTANT HTCombineParams p) {
  const int R = int(p.num_ranks), C = int(p.num_channels), G = int(p.warps_per_peer), me = int(p.rank);
  const int NW = R * G;  // consumer warps of a receiver block
  const int c = blockIdx.x / 2;
  const bool sender = (blockIdx.x & 1) == 0;
  const int warp = warp_id(), lane = lane_id();
  const int T = int(p.num_tokens);
  const auto [t_begin, t_end] = channel_tokens(T, C, c);
  const int64_t S = p.ring_slots, K = p.num_topk, H = p.hidden;
  const auto* peer = reinterpret_cast<const uint64_t*>(p.peer_buf);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const int64_t w_off = (H * 2 + 15) / 16 * 16;  // slot: bf16 row, then K fp32 weights
  const auto* rank_prefix = reinterpret_cast<const int*>(p.rank_prefix);

  uint64_t bases[kRanks];
#pragma unroll
  for (int j = 0; j < kRanks; ++j)
    bases[j] = j < R ? reinterpret_cast<const uint64_t*>(sender ? p.sent : p.consumed)[c * R + j] : 0;
  __syncthreads();
  ht_prof_report("ht_combine", me);
  if (warp >= NW) return;
  HTProf prof;
  prof.begin();

  if (sender) {
    const int i = warp / G, w = warp % G;
    if (i == me) {  // own rows: the receiver reads them from x (dispatch copied them without a ring)
      prof.end(true);
      return;
    }
    const uint64_t base = bases[i];
    const auto* rcp = reinterpret_cast<const int*>(p.recv_channel_prefix);
    const int start_row = rcp[i * C + c];
    const int n = (c + 1 < C ? rcp[i * C + c + 1] : rank_prefix[i * R + me]) - start_row;
    auto* ring = reinterpret_cast<uint8_t*>(peer[i] + kHTRingOffset) + (int64_t(c) * R + me) * S * p.slot_bytes;
    uint64_t* tail = counter(peer[i], kHTTailOffset, c, R, me, w);
    const uint64_t* heads = counter(peer[me], kHTHeadOffset, c, R, i, 0);
    uint64_t head_min = 0, done = base, published = base;
    for (int k = w; k < n; k += G) {
      const uint64_t pos = base + k;
      if (pos >= head_min + S) {
        if (done > published) warp_publish(tail, published = done);
        const long long w0 = prof.mark();
        head_min = warp_wait_above(heads, NW, pos - S, uint64_t(p.timeout_ns), err, kPhaseHTCombineSend, me, i, c);
        prof.waited(w0);
        if (head_min == 0) return;
      }
      uint8_t* slot = ring + int64_t(pos % S) * p.slot_bytes;
      const int64_t row = start_row + k;
      // the row's weights are loaded first: their latency overlaps the row copy (see ht/nvlink/dispatch.cu)
      const bool has_w = p.topk_weights != 0 && lane < K;
      const float weight = has_w ? reinterpret_cast<const float*>(p.topk_weights)[row * K + lane] : 0.0f;
      const long long c0 = prof.mark();
      warp_copy16(slot, reinterpret_cast<const uint8_t*>(p.x) + row * H * 2, H * 2);
      if (has_w) reinterpret_cast<float*>(slot + w_off)[lane] = weight;
      if (p.topk_weights != 0)
        for (int64_t kk = lane + kWarpSize; kk < K; kk += kWarpSize)
          reinterpret_cast<float*>(slot + w_off)[kk] = reinterpret_cast<const float*>(p.topk_weights)[row * K + kk];
      done = pos + 1;
      prof.add(1, c0);
      if (done >= published + kPublishEvery * G) {
        const long long p0 = prof.mark();
        warp_publish(tail, published = done);
        prof.add(2, p0);
      }
    }
    warp_publish(tail, base + n);
    if (w == 0 && lane == 0) reinterpret_cast<uint64_t*>(p.sent)[c * R + i] = base + n;
    prof.end(true);
    return;
  }

  // Receiver: token-major over channel c. Own rows (j == me) are read from x at their dispatch row,
  // recv_channel_prefix[me][c] + send_head[t][me], not from a ring: no wait, no counters.
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  const int own_start = reinterpret_cast<const int*>(p.recv_channel_prefix)[me * C + c];
  const auto* send_head = reinterpret_cast<const int*>(p.send_head);
  uint64_t tail_min[kRanks], published[kRanks];
  int counts[kRanks];
#pragma unroll
  for (int j = 0; j < kRanks; ++j) {
    tail_min[j] = 0;
    published[j] = bases[j];
    counts[j] = 0;
    if (j < R && j != me) publish_head(counter(peer[j], kHTHeadOffset, c, R, me, warp), bases[j]);
  }
  for (int tb = t_begin; tb < t_end; tb += kWarpSize) {
    const int tl = tb + lane;
    uint64_t masks[kRanks];
    int heads_of_lane[kRanks];  // send_head of token tb + lane: each token's slot without a dependent load
#pragma unroll
    for (int j = 0; j < kRanks; ++j) {
      const bool in = j < R && tl < t_end && in_rank[int64_t(tl) * R + j];
      masks[j] = warp_ballot(in);
      heads_of_lane[j] = in ? send_head[int64_t(tl) * R + j] : 0;
    }
    for (int o = 0; o < kWarpSize && tb + o < t_end; ++o) {
      const int t = tb + o;
      if ((t - t_begin) % NW != warp) continue;
      const uint8_t* rows[kRanks];
      int own_s = -1;  // which of rows[] is this rank's own row (its weights are in topk_weights)
      int64_t own_row = 0;
      uint64_t before[kRanks];
      int nsrc = 0;
      bool must_wait = false;
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        before[j] = j < R ? bases[j] + counts[j] + popc64(masks[j] & ((uint64_t(1) << o) - 1)) : 0;
        if (j < R && j != me && ((masks[j] >> o) & 1) && before[j] >= tail_min[j]) must_wait = true;
      }
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {  // publish lazily, but always before blocking
        if (j < R && j != me && (before[j] >= published[j] + kHeadSlack || (must_wait && before[j] > published[j]))) {
          publish_head(counter(peer[j], kHTHeadOffset, c, R, me, warp), before[j]);
          published[j] = before[j];
        }
      }
      bool failed = false;
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        if (j >= R || !((masks[j] >> o) & 1)) continue;
        if (j == me) {
          own_row = own_start + shfl_idx(heads_of_lane[j], o);
          own_s = nsrc;
          rows[nsrc++] = reinterpret_cast<const uint8_t*>(p.x) + own_row * H * 2;
          continue;
        }
        const uint64_t pos = bases[j] + shfl_idx(heads_of_lane[j], o);
        if (pos >= tail_min[j]) {
          const long long w0 = prof.mark();
          tail_min[j] = warp_wait_above(counter(peer[me], kHTTailOffset, c, R, j, 0), G, pos, uint64_t(p.timeout_ns),
                                        err, kPhaseHTCombineRecv, me, j, c);
          prof.waited(w0);
          if (tail_min[j] == 0) failed = true;
        }
        rows[nsrc++] = reinterpret_cast<const uint8_t*>(peer[me] + kHTRingOffset) +
                       ((int64_t(c) * R + j) * S + int64_t(pos % S)) * p.slot_bytes;
      }
      if (failed) return;
      auto* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(t) * H * 2;
      const long long s0 = prof.mark();
      warp_combine_token(out, rows, nsrc, H, p.bias0, p.bias1, t);
      prof.add(1, s0);
      const long long k0 = prof.mark();
      if (p.out_weights != 0) {
        for (int kk = lane; kk < K; kk += kWarpSize) {
          float acc = 0.0f;
          for (int s = 0; s < nsrc; ++s) {
            const float v = s == own_s ? reinterpret_cast<const float*>(p.topk_weights)[own_row * K + kk]
                                       : __uint_as_float(ld_u32_cg(rows[s] + w_off + 4 * kk));
            acc = __fadd_rn(acc, v);
          }
          reinterpret_cast<float*>(p.out_weights)[int64_t(t) * K + kk] = acc;
        }
      }
      sync_warp();
      prof.add(2, k0);
    }
#pragma unroll
    for (int j = 0; j < kRanks; ++j) counts[j] += popc64(masks[j]);
  }
#pragma unroll
  for (int j = 0; j < kRanks; ++j) {
    if (j >= R || j == me) continue;
    publish_head(counter(peer[j], kHTHeadOffset, c, R, me, warp), bases[j] + counts[j]);
    if (warp == 0 && lane == 0) reinterpret_cast<uint64_t*>(p.consumed)[c * R + j] = bases[j] + counts[j];
  }
  prof.end(false);
}
