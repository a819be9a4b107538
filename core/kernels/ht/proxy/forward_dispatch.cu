// Normal-mode dispatch through the CPU proxy with several ranks per node: DeepEP's two-level
// design as the host executor runs it (uccl_ep/host/ht_internode.py), by GPU warps.
//
// Grid: 3 blocks per channel c (DeepEP's contiguous token range c of every rank).
//   block 3c, group n:    hop 1. The tokens of channel c that go to node n, in order, each ONCE
//                         (however many of n's ranks want it), as messages of stream
//                         (me -> the rank of my rail on node n, ring c): the packed row plus the
//                         source rank and the bitmask of n's local ranks that want it
//   block 3c+1:           the forwarder: the rail sources of every node, in ascending order (the
//                         host executor's source-major order), their hop-1 streams message by
//                         message: this rank's own rows go straight to its output; for every other
//                         local rank g in the mask the message is copied into the hop-2 stream
//                         (me -> g, ring C + c, area 1) and written in one ordered Write per round
//                         and g. Every token's mask is recorded (send_nvl_head of the handle)
//   block 3c+2, group j:  hop 2 from local forwarder j (not me): message k of that stream comes
//                         from source (m, j) of the message; its row is recv_prefix[src][c] plus
//                         k minus the messages of earlier sources in the stream
// Rows are ordered by (source rank, token): the reference's order, bit for bit.
//
// NOTES: processing the sources one after another keeps every hop-2 stream single-producer and
// in the host executor's order, which lets receivers and the combine find each row by counting
// instead of carrying positions. Hop 2 is stored over NVLink into the node mates' rings (RingArgs::
// mates, as DeepEP does) unless the proxy is forced, when it goes through the proxy like hop 1.
#include "uccl_ep/device/forward_block.cuh"
#include "uccl_ep/device/internode_ring.cuh"
#include "uccl_ep/device/internode_rows.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxLocal = 8;        // ranks per node
constexpr int kMaxRound = 128;      // messages of one forwarder round (its shared tables)

struct FwdMsg {
  HTDispatchMsg L;
  int64_t rank, mask;  // fields after the source index
};
UCCL_DEVICE FwdMsg fwd_msg(int64_t hidden_bytes, int64_t num_scales, int64_t num_topk) {
  FwdMsg m;
  m.L = ht_dispatch_msg(hidden_bytes, num_scales, num_topk);
  m.rank = m.L.src + 4;
  m.mask = m.L.src + 8;
  m.L.bytes = ht_forward_msg_bytes(hidden_bytes, num_scales, num_topk);
  return m;
}

// A received message into output row `row`, with the NVL mask it carried (recv_src_meta).
UCCL_DEVICE void place_row(const HTProxyForwardDispatchParams& p, const FwdMsg& M, const uint8_t* slot, int64_t row) {
  place_dispatch_row(p, M.L, slot, row);
  if (p.recv_mask != 0 && lane_id() == 0) reinterpret_cast<int*>(p.recv_mask)[row] = int(ld_u32_cg(slot + M.mask));
}

// Hop 1: the tokens of channel c that go to node n, once each.
struct NodeStager : StreamHooks {
  const HTProxyForwardDispatchParams* p;
  const RingArgs* a;
  FwdMsg M;
  int n, dst, c, t_cur, t_end;
  int64_t k_cur;
  bool lost;

  UCCL_DEVICE uint32_t mask_of(int t) const {
    const int G = int(p->ranks_per_node);
    const auto* row = reinterpret_cast<const uint8_t*>(p->is_token_in_rank) + int64_t(t) * p->num_ranks + n * G;
    uint32_t m = 0;
    for (int g = 0; g < G; ++g) m |= uint32_t(row[g] != 0) << g;
    return m;
  }

  UCCL_DEVICE void stage_one(int64_t pos, int tok, uint32_t mask) {
    uint8_t* slot = staging_slot(*a, dst, c, pos);
    const int lane = lane_id();
    warp_copy16(slot, reinterpret_cast<const uint8_t*>(p->x) + int64_t(tok) * p->hidden_bytes, p->hidden_bytes);
    for (int64_t s = lane; s < p->num_scales; s += kWarpSize)
      reinterpret_cast<uint32_t*>(slot + M.L.scales)[s] =
          reinterpret_cast<const uint32_t*>(p->x_scales)[tok * p->scale_stride_token + s * p->scale_stride_col];
    for (int64_t kk = lane; kk < p->num_topk; kk += kWarpSize) {
      st_u64_words(slot + M.L.topk + 8 * kk, reinterpret_cast<const int64_t*>(p->topk_idx)[tok * p->num_topk + kk]);
      reinterpret_cast<uint32_t*>(slot + M.L.weights)[kk] =
          reinterpret_cast<const uint32_t*>(p->topk_weights)[tok * p->num_topk + kk];
    }
    if (lane == 0) {
      *reinterpret_cast<int*>(slot + M.L.src) = tok;
      *reinterpret_cast<int*>(slot + M.rank) = int(p->rank);
      *reinterpret_cast<int*>(slot + M.mask) = int(mask);
    }
  }

  UCCL_DEVICE void stage(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    while (k_cur < k1) {
      if (t_cur >= t_end) {
        lost = true;
        return;
      }
      const int t = t_cur + lane_id();
      const uint32_t mine = t < t_end ? mask_of(t) : 0u;
      const uint64_t ballot = warp_ballot(mine != 0);
      int64_t i = 0;
      bool stopped = false;
      for (uint64_t m = ballot; m != 0; m &= m - 1, ++i) {
        const int b = ffs64(m) - 1;
        const int64_t k = k_cur + i;
        if (k >= k1) {
          t_cur += b;
          stopped = true;
          break;
        }
        const uint32_t mask = uint32_t(shfl_idx(int(mine), b));
        if ((k - k0) % g.members == g.index) stage_one(base + k, t_cur + b, mask);
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

// What the forwarder's leader keeps across rounds and sources (shared memory).
struct ForwardShared {
  int mask[kMaxRound];
  int self[kMaxRound];               // row offset of the message in this rank's (source, channel) block, or -1
  int pos[kMaxRound][kMaxLocal];     // position of the message in hop-2 stream g (relative to the round's start)
  int64_t pos2[kMaxLocal];           // hop-2 stream positions (absolute)
  int64_t credit2[kMaxLocal];        // hop-2 credits seen
  int cnt[kMaxLocal];                // messages of the round for g
  int self_run;                      // own messages of the current source so far
};

// Hop 1 in, own rows out, hop 2 out: one rail source's stream.
struct ForwardConsumer : StreamHooks {
  const HTProxyForwardDispatchParams* p;
  const RingArgs* a1;   // hop 1 (area 0)
  const RingArgs* a2;   // hop 2 (area 1)
  ForwardShared* sh;
  FwdMsg M;
  int src, c, me_local, G, node;
  int64_t rdma_start, self_start, round_cap;

  UCCL_DEVICE int64_t max_round() const { return round_cap; }

  UCCL_DEVICE int local_rank(int g) const { return node * G + g; }

  UCCL_DEVICE bool prepare(int64_t k0, int64_t k1, int64_t base) {
    for (int g = 0; g < G; ++g) sh->cnt[g] = 0;
    for (int64_t k = k0; k < k1; ++k) {
      const int i = int(k - k0);
      const uint32_t mask = ld_u32_cg(receive_slot(*a1, src, c, base + k) + M.mask);
      sh->mask[i] = int(mask);
      sh->self[i] = ((mask >> me_local) & 1u) ? sh->self_run++ : -1;
      for (int g = 0; g < G; ++g)
        if (g != me_local && ((mask >> g) & 1u)) sh->pos[i][g] = sh->cnt[g]++;
    }
    for (int g = 0; g < G; ++g) {  // room in every hop-2 ring this round writes to
      if (g == me_local || sh->cnt[g] == 0) continue;
      const int64_t need = sh->pos2[g] + sh->cnt[g] - a2->slots;  // credits needed
      if (sh->credit2[g] < need) {
        sh->credit2[g] = wait_head(*a2, local_rank(g), c, need, kPhaseHTDispatchRecv);
        if (sh->credit2[g] < 0) return false;
      }
    }
    return true;
  }

  UCCL_DEVICE void consume(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    for (int64_t k = k0 + g.index; k < k1; k += g.members) {
      const int i = int(k - k0);
      const uint8_t* slot = receive_slot(*a1, src, c, base + k);
      const uint32_t mask = uint32_t(sh->mask[i]);
      if (lane_id() == 0 && rdma_start + k < p->rdma_rows)
        reinterpret_cast<int*>(p->rdma_mask)[rdma_start + k] = int(mask);
      if (sh->self[i] >= 0 && self_start + sh->self[i] < p->num_rows) place_row(*p, M, slot, self_start + sh->self[i]);
      for (int l = 0; l < G; ++l) {
        if (l == me_local || !((mask >> l) & 1u)) continue;
        warp_copy16_cg(staging_slot(*a2, local_rank(l), c, sh->pos2[l] + sh->pos[i][l]), slot, M.L.bytes);
      }
    }
    // the hop-2 copies before the leader's push or release (fence_staged)
    fence_staged(a2->dma != nullptr && a2->mates == nullptr);
  }

  UCCL_DEVICE bool finish(int64_t, int64_t, int64_t) {
    for (int l = 0; l < G; ++l) {
      if (l == me_local || sh->cnt[l] == 0) continue;
      if (a2->mates != nullptr) {  // the copies went straight into the mate's ring
        sh->pos2[l] += sh->cnt[l];
        publish_to_mate(*a2, local_rank(l), c, sh->pos2[l]);
        continue;
      }
      const int64_t ring = a2->first_ring + c;
      int64_t pos = sh->pos2[l], left = sh->cnt[l];
      while (left > 0) {  // at most two Writes: the run may wrap around the ring
        const int64_t run = min64(left, a2->slots - pos % a2->slots);
        const int64_t slot0 = pos % a2->slots;
        const TransferCmd cmd = protocol::make_ordered_write(
            uint32_t(local_rank(l)), ring_slot(*a2, a2->send_base, local_rank(l), c, slot0),
            ring_slot(*a2, a2->recv_base, a2->rank, c, slot0),
            uint32_t(run * a2->msg), uint32_t(ring), uint32_t(run));
        dma_count_push(a2->dma, int(ring % a2->num_fifos), uint64_t(run * a2->msg));
        if (!fifo_push(a2->fifos[ring % a2->num_fifos], cmd, a2->timeout_ns, a2->err,
                       PushSite{kPhaseHTDispatchRecv, a2->rank, local_rank(l), c}))
          return false;
        pos += run;
        left -= run;
      }
      sh->pos2[l] = pos;
    }
    return true;
  }
};

// Hop 2 from one local forwarder: rows by the source in the message.
struct Hop2Consumer : StreamHooks {
  const HTProxyForwardDispatchParams* p;
  const RingArgs* a2;
  FwdMsg M;
  int f, f_local, c;

  UCCL_DEVICE void consume(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    const int R = int(p->num_ranks), C = int(p->num_channels), G = int(p->ranks_per_node);
    const auto* recv_prefix = reinterpret_cast<const int*>(p->recv_prefix);
    const auto* recv_count = reinterpret_cast<const int*>(p->recv_count);
    for (int64_t k = k0 + g.index; k < k1; k += g.members) {
      const uint8_t* slot = receive_slot(*a2, f, c, base + k);
      const int s = int(ld_u32_cg(slot + M.rank));
      if (s < 0 || s >= R || s % G != f_local) {  // not a source this forwarder serves
        if (lane_id() == 0) raise_error(a2->err, kErrProtocol, kPhaseHTDispatchRecv, a2->rank, f, c, 0);
        continue;
      }
      int64_t before = 0;  // messages of earlier sources in this stream (source-major)
      for (int src = f_local; src < s; src += G) before += recv_count[src * C + c];
      const int64_t row = recv_prefix[s * C + c] + (k - before);
      if (row < p->num_rows) place_row(*p, M, slot, row);
    }
  }
};

}  // namespace

namespace {

UCCL_DEVICE void forward_dispatch_main(const HTProxyForwardDispatchParams& p) {
  __shared__ int s_arrive[kHTProxyMaxRanks];
  __shared__ int64_t s_word[kHTProxyMaxRanks];
  __shared__ ForwardShared sh;
  __shared__ int s_fail;
  const ForwardBlock b = forward_block(p);
  clear_group_words(s_arrive, s_word);
  const auto* recv_end = reinterpret_cast<const int*>(p.recv_end);
  if (b.role == 2) pad_dispatch_rows(p, recv_end[b.R - 1], b.c, b.C);  // rows past the real count (num_worst_tokens)
  const RingArgs a1 = ring_args(p);
  const RingArgs a2 = nvl_ring_args(p);
  const FwdMsg M = fwd_msg(p.hidden_bytes, p.num_scales, p.num_topk);
  if (M.L.bytes != p.ring.msg_bytes || M.L.bytes != p.nvl_ring.msg_bytes || b.G > kMaxLocal) {
    if (threadIdx.x == 0) raise_error(a1.err, kErrProtocol, kPhaseHTDispatchSend, b.me, -1, b.c, 0);
    return;
  }
  if (threadIdx.x == 0) s_fail = 0;
  if (b.role == 1 && threadIdx.x == 0) {
    for (int l = 0; l < b.G; ++l) {
      sh.pos2[l] = l == b.me_local ? 0 : int64_t(a2.state->send_pos[b.node * b.G + l][a2.first_ring + b.c]);
      sh.credit2[l] = 0;
    }
  }
  __syncthreads();

  if (b.role == 0) {  // hop 1: one group per destination node
    const int W = num_warps() / b.N, grp = warp_id() / W;
    if (W < 1 || grp >= b.N) return;
    WarpGroup g{&s_arrive[grp], W, warp_id() % W, 0u};
    const auto* nsp = reinterpret_cast<const int*>(p.node_send_prefix);
    const int64_t n = nsp[grp * b.C + b.c] - (b.c > 0 ? nsp[grp * b.C + b.c - 1] : 0);
    NodeStager st{{}, &p, &a1, M, grp, grp * b.G + b.me_local, b.c, b.t_begin, b.t_end, 0, false};
    send_stream(a1, g, &s_word[grp], st.dst, b.c, n, st, kPhaseHTDispatchSend);
    if (st.lost && lane_id() == 0) raise_error(a1.err, kErrProtocol, kPhaseHTDispatchSend, b.me, st.dst, b.c, 0);
    return;
  }
  if (b.role == 1) {  // the forwarder: every rail source in ascending order
    WarpGroup g{&s_arrive[0], num_warps(), warp_id(), 0u};
    const auto* rdma_count = reinterpret_cast<const int*>(p.rdma_count);
    const int64_t half = a2.slots / 2 > 1 ? a2.slots / 2 : 1;
    const bool passed = for_each_rail_source(
        b, reinterpret_cast<const int*>(p.rdma_prefix), reinterpret_cast<const int*>(p.recv_prefix), sh, &s_fail,
        [&](int m, int src, int64_t rdma_first, int64_t recv_first) {
          ForwardConsumer fc{{}, &p, &a1, &a2, &sh, M, src, b.c, b.me_local, b.G, b.node, rdma_first, recv_first,
                             half < kMaxRound ? half : kMaxRound};
          return recv_stream(a1, g, &s_word[0], src, b.c, rdma_count[m * b.C + b.c], fc, kPhaseHTDispatchRecv);
        });
    if (!passed) return;
    if (threadIdx.x == 0)
      for (int l = 0; l < b.G; ++l)
        if (l != b.me_local) a2.state->send_pos[b.node * b.G + l][a2.first_ring + b.c] = uint64_t(sh.pos2[l]);
    return;
  }
  // hop 2: one group per other local rank (forwarder)
  MateGroup mg;
  if (!mate_group(b, reinterpret_cast<const int*>(p.recv_count), s_arrive, mg)) return;
  Hop2Consumer hc{{}, &p, &a2, M, mg.f, mg.f_local, b.c};
  recv_stream(a2, mg.g, &s_word[mg.grp], mg.f, b.c, mg.n, hc, kPhaseHTDispatchRecv);
}

}  // namespace

// Main blocks first, then the copy role's blocks (device/ht_dma.cuh), if any.
extern "C" __global__ void __launch_bounds__(512, 1) ht_proxy_forward_dispatch(const UCCL_GRID_CONSTANT HTProxyForwardDispatchParams p) {
  if (ht_dma_block(p)) return;
  forward_dispatch_main(p);
  ht_dma_warp_done(p);
}
