// Intranode (NVLink) dispatch, fresh or cached: every token goes once to each rank that needs it.
//
// Grid: 2 blocks per channel (config.num_sms blocks). Channel c owns the contiguous token range
// c of every rank (DeepEP's split). Block 2c sends, block 2c+1 receives; their warps form one
// group of G warps per peer rank.
//   sender group j: walks channel c's tokens in order (ballots over is_token_in_rank), numbering
//     the tokens for j k = 0, 1, ...; warp k % G writes token k into slot (base + k) % S of ring
//     (c, me -> j) in j's NVL buffer: data, scales, top-k ids and weights, source index; then
//     publishes its progress counter (system-scope release);
//   receiver group i: waits until every producer warp of ring (c, i -> me) passed position
//     base + k, copies the slot into row recv_channel_prefix[i][c] + k (so rows are ordered by
//     source rank, then token: the reference's order, bit for bit), maps top-k ids to local ids
//     (-1 elsewhere, weight 0), then publishes its own progress counter to the sender.
//
// NOTES: positions are cumulative over all ops of the buffer (dispatch and combine share the
// rings of one direction) and each side keeps its base in local device memory, so nothing is
// reset between ops, no barrier is needed for cached dispatch, and CUDA-graph replays stay in
// step. Flow control: a producer may write position p once every consumer warp passed p - S.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ht_tuning.cuh"
#include "uccl_ep/device/ring.cuh"
#include "uccl_ep/device/row_meta.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

// A producer warp publishes its progress after kPublishEvery of its own tokens (ht_tuning.cuh) and
// always before it blocks: each publish is a system-scope release that drains the warp's
// outstanding NVLink stores.

struct SlotLayout {
  int64_t scales, topk, weights, src, bytes;
};

UCCL_DEVICE SlotLayout dispatch_slot(int64_t hidden_bytes, int64_t num_scales, int64_t K) {
  SlotLayout s;
  s.scales = hidden_bytes;
  s.topk = (s.scales + num_scales * 4 + 15) / 16 * 16;
  s.weights = s.topk + K * 8;
  s.src = s.weights + K * 4;
  s.bytes = (s.src + 4 + 15) / 16 * 16;
  return s;
}

// A row's metadata (row_meta.cuh) into its slot, then the source index.
UCCL_DEVICE void store_row_meta(const HTDispatchParams& p, const RowMeta& m, uint8_t* slot, const SlotLayout& L,
                                int64_t tok, int64_t K) {
  const int lane = lane_id();
  store_row_scales(p, m, reinterpret_cast<uint32_t*>(slot + L.scales), tok);
  if (lane < K) {
    reinterpret_cast<int64_t*>(slot + L.topk)[lane] = m.topk;
    reinterpret_cast<float*>(slot + L.weights)[lane] = m.weight;
  }
  for (int64_t kk = lane + kWarpSize; kk < K; kk += kWarpSize) {
    reinterpret_cast<int64_t*>(slot + L.topk)[kk] = reinterpret_cast<const int64_t*>(p.topk_idx)[tok * K + kk];
    reinterpret_cast<float*>(slot + L.weights)[kk] = reinterpret_cast<const float*>(p.topk_weights)[tok * K + kk];
  }
  if (lane == 0) *reinterpret_cast<int*>(slot + L.src) = int(tok);
}

// The rank's own tokens of channel c, copied straight from x (and its scales, top-k) into the
// output rows, no ring: the k-th own token goes to row recv_channel_prefix[me][c] + k, as the ring
// would have put it. Own token k is copied by the sender block's own group when k is even and by
// the receiver block's when k is odd (`parity`), warp (k / 2) % G of the group; the sender's also
// writes send_head[t][me].
//
// NOTES: DeepEP's design sends the rank's own rows through its own ring like any peer's, so each
// is copied twice on the SMs (x -> ring -> recv_x). One SM copies about as fast to a peer as to
// its own HBM (tools/lab/probe_nvlink_store.py), so row copies are what the <= 24-SM
// rows are bound by; copying own rows once, split over both blocks of the channel, takes a quarter
// of the copies away at EP2. The self ring is not used at all (neither side moves its counters),
// so dispatch and combine, which share rings, stay in step.
UCCL_DEVICE void copy_own_rows(const HTDispatchParams& p, int c, int t_begin, int t_end, int G, int w, int parity) {
  const int R = int(p.num_ranks), C = int(p.num_channels), me = int(p.rank), lane = lane_id();
  const int64_t K = p.num_topk;
  const int E_loc = int(p.num_experts / R);
  const int64_t lo = int64_t(me) * E_loc;
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  const int start_row = reinterpret_cast<const int*>(p.recv_channel_prefix)[me * C + c];
  int k_run = 0;
  for (int tb = t_begin; tb < t_end; tb += kWarpSize) {
    const int t = tb + lane;
    const bool in = t < t_end && in_rank[int64_t(t) * R + me];
    const uint64_t mask = warp_ballot(in);
    if (parity == 0 && p.send_head != 0 && w == 0 && t < t_end)
      reinterpret_cast<int*>(p.send_head)[int64_t(t) * R + me] = in ? k_run + popc64(mask & lanemask_lt()) : -1;
    for (uint64_t m = mask; m != 0; m &= m - 1) {
      const int b = ffs64(m) - 1;
      const int k = k_run + popc64(mask & ((uint64_t(1) << b) - 1));
      if ((k & 1) != parity || (k >> 1) % G != w) continue;
      const int64_t row = start_row + k, tok = tb + b;
      if (row >= p.num_rows) continue;
      warp_copy16(reinterpret_cast<uint8_t*>(p.recv_x) + row * p.hidden_bytes,
                  reinterpret_cast<const uint8_t*>(p.x) + tok * p.hidden_bytes, p.hidden_bytes);
      for (int64_t sc = lane; sc < p.num_scales; sc += kWarpSize)
        reinterpret_cast<uint32_t*>(p.recv_scales)[row * p.num_scales + sc] =
            reinterpret_cast<const uint32_t*>(p.x_scales)[tok * p.scale_stride_token + sc * p.scale_stride_col];
      if (p.recv_topk_idx != 0) {
        for (int64_t kk = lane; kk < K; kk += kWarpSize) {
          const int64_t g = reinterpret_cast<const int64_t*>(p.topk_idx)[tok * K + kk];
          const bool local = g >= lo && g < lo + E_loc;
          reinterpret_cast<int64_t*>(p.recv_topk_idx)[row * K + kk] = local ? g - lo : -1;
          reinterpret_cast<float*>(p.recv_topk_weights)[row * K + kk] =
              local ? reinterpret_cast<const float*>(p.topk_weights)[tok * K + kk] : 0.0f;
        }
      }
      if (p.recv_src_idx != 0 && lane == 0) reinterpret_cast<int*>(p.recv_src_idx)[row] = int(tok);
    }
    k_run += popc64(mask);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kHTThreads, 1) ht_dispatch(const UCCL_GRID_CONSTANT HTDispatchParams p) {
  const int R = int(p.num_ranks), C = int(p.num_channels), G = int(p.warps_per_peer), me = int(p.rank);
  const int c = blockIdx.x / 2;
  const bool sender = (blockIdx.x & 1) == 0;
  const int grp = warp_id() / G, w = warp_id() % G;
  const int T = int(p.num_tokens);
  const auto [t_begin, t_end] = channel_tokens(T, C, c);
  const int64_t S = p.ring_slots, K = p.num_topk;
  const auto* peer = reinterpret_cast<const uint64_t*>(p.peer_buf);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const SlotLayout L = dispatch_slot(p.hidden_bytes, p.num_scales, K);  // K = 0 for cached dispatch
  const int E_loc = int(p.num_experts / R);
  const auto* rank_prefix = reinterpret_cast<const int*>(p.rank_prefix);

  // Bases are read by every warp before any warp of the block can advance them.
  uint64_t base = 0;
  if (grp < R) base = reinterpret_cast<const uint64_t*>(sender ? p.sent : p.consumed)[c * R + grp];
  __syncthreads();

  if (!sender && p.recv_topk_idx != 0) {  // rows past the real count (num_worst_tokens): -1 ids
    const int64_t real = rank_prefix[(R - 1) * R + me];
    for (int64_t r = real + int64_t(c) * blockDim.x + threadIdx.x; r < p.num_rows; r += int64_t(C) * blockDim.x) {
      for (int kk = 0; kk < K; ++kk) {
        reinterpret_cast<int64_t*>(p.recv_topk_idx)[r * K + kk] = -1;
        reinterpret_cast<float*>(p.recv_topk_weights)[r * K + kk] = 0.0f;
      }
      reinterpret_cast<int*>(p.recv_src_idx)[r] = -1;
    }
  }
  ht_prof_report("ht_dispatch", me);
  if (grp >= R) return;
  HTProf prof;
  prof.begin();

  if (sender) {
    const int j = grp;
    if (j == me) {  // own rows: no ring (see copy_own_rows)
      copy_own_rows(p, c, t_begin, t_end, G, w, 0);
      prof.end(true);
      return;
    }
    auto* ring = reinterpret_cast<uint8_t*>(peer[j] + kHTRingOffset) + (int64_t(c) * R + me) * S * p.slot_bytes;
    uint64_t* tail = counter(peer[j], kHTTailOffset, c, R, me, w);
    const uint64_t* heads = counter(peer[me], kHTHeadOffset, c, R, j, 0);
    const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
    uint64_t head_min = 0, done = base, published = base;
    int k_run = 0;
    for (int tb = t_begin; tb < t_end; tb += kWarpSize) {
      const int t = tb + lane_id();
      const bool in = t < t_end && in_rank[int64_t(t) * R + j];
      const uint64_t mask = warp_ballot(in);
      if (p.send_head != 0 && w == 0 && t < t_end)
        reinterpret_cast<int*>(p.send_head)[int64_t(t) * R + j] = in ? k_run + popc64(mask & lanemask_lt()) : -1;
      for (uint64_t m = mask; m != 0; m &= m - 1) {
        const int b = ffs64(m) - 1;
        const int k = k_run + popc64(mask & ((uint64_t(1) << b) - 1));
        if (k % G != w) continue;
        const uint64_t pos = base + k;
        if (pos >= head_min + S) {
          if (done > published) warp_publish(tail, published = done);  // never wait holding progress
          const long long w0 = prof.mark();
          head_min = warp_wait_above(heads, G, pos - S, uint64_t(p.timeout_ns), err,
                                     kPhaseHTDispatchSend, me, j, c);
          prof.waited(w0);
          if (head_min == 0) return;
        }
        uint8_t* slot = ring + int64_t(pos % S) * p.slot_bytes;
        const int tok = tb + b;
        // NOTES: 8 loads per lane in flight (block.cuh: warp_copy16); 16 were slower and took more
        // registers.
        const RowMeta meta = load_row_meta(p, tok, K);
        const long long c0 = prof.mark();
        warp_copy16(slot, reinterpret_cast<const uint8_t*>(p.x) + int64_t(tok) * p.hidden_bytes, p.hidden_bytes);
        prof.add(1, c0);
        store_row_meta(p, meta, slot, L, tok, K);
        done = pos + 1;
        if (done >= published + kPublishEvery * G) {
          const long long p0 = prof.mark();
          warp_publish(tail, published = done);
          prof.add(2, p0);
        }
      }
      k_run += popc64(mask);
    }
    warp_publish(tail, base + k_run);
    if (w == 0 && lane_id() == 0) reinterpret_cast<uint64_t*>(p.sent)[c * R + j] = base + k_run;
    prof.end(true);
    return;
  }

  // Receiver of ring (c, i -> me).
  const int i = grp;
  if (i == me) {  // own rows: no ring (see copy_own_rows)
    copy_own_rows(p, c, t_begin, t_end, G, w, 1);
    prof.end(false);
    return;
  }
  const auto* rcp = reinterpret_cast<const int*>(p.recv_channel_prefix);
  const int start_row = rcp[i * C + c];
  const int end_row = c + 1 < C ? rcp[i * C + c + 1] : rank_prefix[i * R + me];
  const int n = end_row - start_row;
  const auto* ring = reinterpret_cast<const uint8_t*>(peer[me] + kHTRingOffset) + (int64_t(c) * R + i) * S * p.slot_bytes;
  const uint64_t* tails = counter(peer[me], kHTTailOffset, c, R, i, 0);
  uint64_t* head = counter(peer[i], kHTHeadOffset, c, R, me, w);
  const int64_t lo = int64_t(me) * E_loc;
  uint64_t tail_min = 0, done = base, published = base;
  for (int k = w; k < n; k += G) {
    const uint64_t pos = base + k;
    if (pos >= tail_min) {
      if (done > published) publish_head(head, published = done);
      const long long w0 = prof.mark();
      tail_min = warp_wait_above(tails, G, pos, uint64_t(p.timeout_ns), err, kPhaseHTDispatchRecv, me, i, c);
      prof.waited(w0);
      if (tail_min == 0) return;
    }
    const uint8_t* slot = ring + int64_t(pos % S) * p.slot_bytes;
    const int64_t row = start_row + k;
    if (row < p.num_rows) {
      const long long c0 = prof.mark();
      warp_copy16_cg(reinterpret_cast<uint8_t*>(p.recv_x) + row * p.hidden_bytes, slot, p.hidden_bytes);
      prof.add(1, c0);
      for (int s = lane_id(); s < p.num_scales; s += kWarpSize)
        reinterpret_cast<uint32_t*>(p.recv_scales)[row * p.num_scales + s] =
            reinterpret_cast<const uint32_t*>(slot + L.scales)[s];
      if (p.recv_topk_idx != 0) {
        for (int kk = lane_id(); kk < K; kk += kWarpSize) {
          const int64_t g = reinterpret_cast<const int64_t*>(slot + L.topk)[kk];
          const bool local = g >= lo && g < lo + E_loc;
          reinterpret_cast<int64_t*>(p.recv_topk_idx)[row * K + kk] = local ? g - lo : -1;
          reinterpret_cast<float*>(p.recv_topk_weights)[row * K + kk] =
              local ? reinterpret_cast<const float*>(slot + L.weights)[kk] : 0.0f;
        }
      }
      if (p.recv_src_idx != 0 && lane_id() == 0)
        reinterpret_cast<int*>(p.recv_src_idx)[row] = *reinterpret_cast<const int*>(slot + L.src);
    }
    done = pos + 1;
    if (done >= published + kPublishEvery * G) {
      const long long p0 = prof.mark();
      publish_head(head, published = done);
      prof.add(2, p0);
    }
  }
  publish_head(head, base + n);
  if (w == 0 && lane_id() == 0) reinterpret_cast<uint64_t*>(p.consumed)[c * R + i] = base + n;
  prof.end(false);
}
