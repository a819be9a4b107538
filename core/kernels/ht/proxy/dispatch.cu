// Normal-mode dispatch (fresh or cached) through the CPU proxy: every token goes once to each rank
// that needs it, as a message of the host executor's ring streams (device/internode_ring.cuh).
//
// Grid: 2 blocks per channel (config.num_sms blocks). Channel c owns the contiguous token range c
// of every rank (DeepEP's split) and ring c of every (peer) pair. Each block splits its 16 warps
// into one group per peer rank.
//   block 2c, group j:   walks channel c's tokens in order (ballots over is_token_in_rank[:, j]);
//                        the k-th token for j is message k of stream (me -> j, ring c): x bytes,
//                        scales, top-k ids and weights, source index (the host executor's
//                        packed row), staged and written in rounds (send_stream)
//   block 2c+1, group i: message k of stream (i -> me, ring c) is row recv_prefix[i][c] + k of
//                        the output (rows ordered by source rank, then token: the reference's
//                        order, bit for bit); top-k ids become local ids (-1 elsewhere, weight 0)
// Rows past the real count (num_worst_tokens) get top-k id -1, weight 0 and source index -1.
//
// NOTES: each rank is its own node here (the proxy path runs on one host through the ipc
// transport, ranks_per_node = 1 or UCCL_EP_FORCE_PROXY): the internode protocol's hop 1 is this
// stream and its NVLink hop is the receiver itself. A cached dispatch is the same kernel with
// no top-k (K = 0): the routing comes from the handle's prefix matrices.
#include "uccl_ep/device/internode_ring.cuh"
#include "uccl_ep/device/internode_rows.cuh"
#include "uccl_ep/device/row_meta.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

// Stages the messages of stream (me -> j, channel c): token scan state is identical in every
// warp of the group (all see the same ballots), so each can find the tokens of a round alone.
struct DispatchStager : StreamHooks {
  const HTProxyDispatchParams* p;
  const RingArgs* a;
  HTDispatchMsg L;
  int j, c, t_cur, t_end;
  int64_t k_cur;
  bool lost;  // the prefix counts promised more tokens than is_token_in_rank has

  // Message `pos` from token `tok`: its metadata loaded ahead of the row (row_meta.cuh), top-k ids as
  // 4-byte words (the message's fields are 4-byte aligned).
  UCCL_DEVICE void stage_one(int64_t pos, int tok) {
    uint8_t* slot = staging_slot(*a, j, c, pos);
    const int lane = lane_id();
    const int64_t K = p->num_topk;
    const RowMeta m = load_row_meta(*p, tok, K);
    warp_copy16(slot, reinterpret_cast<const uint8_t*>(p->x) + int64_t(tok) * p->hidden_bytes, p->hidden_bytes);
    store_row_scales(*p, m, reinterpret_cast<uint32_t*>(slot + L.scales), tok);
    if (lane < K) {
      st_u64_words(slot + L.topk + 8 * lane, m.topk);
      reinterpret_cast<float*>(slot + L.weights)[lane] = m.weight;
    }
    for (int64_t kk = lane + kWarpSize; kk < K; kk += kWarpSize) {
      st_u64_words(slot + L.topk + 8 * kk, reinterpret_cast<const int64_t*>(p->topk_idx)[tok * K + kk]);
      reinterpret_cast<float*>(slot + L.weights)[kk] = reinterpret_cast<const float*>(p->topk_weights)[tok * K + kk];
    }
    if (lane == 0) *reinterpret_cast<int*>(slot + L.src) = tok;
  }

  // This warp's share (message k goes to warp k % members) of messages [k0, k1).
  UCCL_DEVICE void stage(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    const auto* in_rank = reinterpret_cast<const uint8_t*>(p->is_token_in_rank);
    const int R = int(p->num_ranks);
    while (k_cur < k1) {
      if (t_cur >= t_end) {
        lost = true;
        return;
      }
      const int t = t_cur + lane_id();
      const uint64_t mask = warp_ballot(t < t_end && in_rank[int64_t(t) * R + j]);
      int64_t i = 0;
      bool stopped = false;
      for (uint64_t m = mask; m != 0; m &= m - 1, ++i) {
        const int b = ffs64(m) - 1;
        const int64_t k = k_cur + i;
        if (k >= k1) {  // the round ends inside this window: resume at this token next round
          t_cur += b;
          stopped = true;
          break;
        }
        if ((k - k0) % g.members == g.index) stage_one(base + k, t_cur + b);
      }
      if (stopped) {
        k_cur = k1;
        return;
      }
      k_cur += i;
      t_cur += kWarpSize;
    }
  }
};

// Places the messages of stream (i -> me, channel c) in their output rows.
struct DispatchConsumer : StreamHooks {
  const HTProxyDispatchParams* p;
  const RingArgs* a;
  HTDispatchMsg L;
  int i, c;
  int64_t start_row;

  UCCL_DEVICE void consume(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    for (int64_t k = k0 + g.index; k < k1; k += g.members) {
      const int64_t row = start_row + k;
      if (row < p->num_rows) place_dispatch_row(*p, L, receive_slot(*a, i, c, base + k), row);
      // (rows past num_worst_tokens: notify reported it)
    }
  }
};

}  // namespace

namespace {

UCCL_DEVICE void dispatch_main(const HTProxyDispatchParams& p) {
  __shared__ int s_arrive[kHTProxyMaxRanks];
  __shared__ int64_t s_word[kHTProxyMaxRanks];
  const int R = int(p.num_ranks), C = int(p.num_channels);
  const int c = blockIdx.x / 2;
  const bool sender = (blockIdx.x & 1) == 0;
  const int W = num_warps() / R;
  const int grp = warp_id() / W;
  const int T = int(p.num_tokens);
  const auto [t_begin, t_end] = channel_tokens(T, C, c);
  clear_group_words(s_arrive, s_word);
  const auto* recv_end = reinterpret_cast<const int*>(p.recv_end);
  if (!sender) pad_dispatch_rows(p, recv_end[R - 1], c, C);  // rows past the real count (num_worst_tokens)
  __syncthreads();
  if (W < 1 || grp >= R) return;

  const RingArgs a = ring_args(p);
  WarpGroup g{&s_arrive[grp], W, warp_id() % W, 0u};
  const HTDispatchMsg L = ht_dispatch_msg(p.hidden_bytes, p.num_scales, p.num_topk);
  if (L.bytes != p.ring.msg_bytes) {  // the host and this kernel disagree on the message layout
    if (threadIdx.x == 0) raise_error(a.err, kErrProtocol, sender ? kPhaseHTDispatchSend : kPhaseHTDispatchRecv,
                                      a.rank, -1, c, 0);
    return;
  }
  if (sender) {
    const auto* send_prefix = reinterpret_cast<const int*>(p.send_prefix);
    const int64_t n = send_prefix[grp * C + c] - (c > 0 ? send_prefix[grp * C + c - 1] : 0);
    DispatchStager st{{}, &p, &a, L, grp, c, t_begin, t_end, 0, false};
    send_stream(a, g, &s_word[grp], grp, c, n, st, kPhaseHTDispatchSend);
    if (st.lost && lane_id() == 0) raise_error(a.err, kErrProtocol, kPhaseHTDispatchSend, a.rank, grp, c, 0);
    return;
  }
  const auto* recv_prefix = reinterpret_cast<const int*>(p.recv_prefix);
  const int64_t start = recv_prefix[grp * C + c];
  const int64_t end = c + 1 < C ? recv_prefix[grp * C + c + 1] : recv_end[grp];
  DispatchConsumer cons{{}, &p, &a, L, grp, c, start};
  recv_stream(a, g, &s_word[grp], grp, c, end - start, cons, kPhaseHTDispatchRecv);
}

}  // namespace

// Main blocks first, then the copy role's blocks (device/ht_dma.cuh), if any.
extern "C" __global__ void __launch_bounds__(512, 1) ht_proxy_dispatch(const UCCL_GRID_CONSTANT HTProxyDispatchParams p) {
  if (ht_dma_block(p)) return;
  dispatch_main(p);
  ht_dma_warp_done(p);
}
