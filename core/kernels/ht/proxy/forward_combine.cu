// Normal-mode combine through the CPU proxy with several ranks per node: reduce inside the node
// first, then across nodes (the host executor's hierarchical reduce, uccl_ep/host/ht_internode.py).
//
// Grid: 3 blocks per channel c, on the dispatch's streams (positions continue).
//   block 3c, group j:  hop A. Rows this rank received from local forwarder j (not me) in channel
//                       c go back to it as stream (me -> j, ring C + c), in the order hop 2 brought
//                       them: sources ascending, then tokens (BF16 row, then top-k weights)
//   block 3c+1:         the forwarder: for every rail source in ascending order and every token it
//                       sent here (its dispatch masks were recorded), the fp32 sum of the token's
//                       rows of this node, local ranks ascending (own row read from x, the others
//                       from the hop-A streams, counted in the same order), sent back as message k
//                       of stream (me -> that source, ring c): fp32 row (BF16 with partial_bf16),
//                       then fp32 weights
//   block 3c+2:         the source: token-major over channel c, rounds of B tokens (one warp each);
//                       out[t] = (bias0 + bias1) + partial of node 0 + partial of node 1 + ... in
//                       fp32, one IEEE add at a time, nodes ascending, cast to BF16
// Hop A is stored over NVLink into the forwarder's ring (RingArgs::mates) unless the proxy is forced.
// NOTES: partials travel in fp32 as in the host executor by default, so the result equals the
// reference's flat rank-order sum whenever the fp32 sums are exact (the common case for BF16 data);
// see uccl_ep/host/ht_internode.py. partial_bf16 rounds them to BF16 as DeepEP does: half the bytes
// across nodes, exact only where each node's partial is exact in BF16.
#include "uccl_ep/device/forward_block.cuh"
#include "uccl_ep/device/internode_ring.cuh"
#include "uccl_ep/device/internode_rows.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxLocal = 8;
constexpr int kMaxRound = 128;

// Hop A: the rows of forwarder f's hop-2 stream, back in the same order.
struct RowsBackStager : StreamHooks {
  const HTProxyForwardCombineParams* p;
  const RingArgs* a;
  int f, f_local, c;

  UCCL_DEVICE void stage(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    const int R = int(p->num_ranks), C = int(p->num_channels), G = int(p->ranks_per_node);
    const int64_t H = p->hidden, K = p->num_topk;
    const auto* recv_prefix = reinterpret_cast<const int*>(p->recv_prefix);
    const auto* recv_count = reinterpret_cast<const int*>(p->recv_count);
    for (int64_t k = k0 + g.index; k < k1; k += g.members) {
      int s = f_local;
      int64_t before = 0;
      while (s + G < R && before + recv_count[s * C + c] <= k) before += recv_count[s * C + c], s += G;
      const int64_t row = recv_prefix[s * C + c] + (k - before);
      uint8_t* slot = staging_slot(*a, f, c, base + k);
      warp_copy16(slot, reinterpret_cast<const uint8_t*>(p->x) + row * H * 2, H * 2);
      if (p->topk_weights != 0)
        for (int64_t kk = lane_id(); kk < K; kk += kWarpSize)
          reinterpret_cast<uint32_t*>(slot + 2 * H)[kk] = reinterpret_cast<const uint32_t*>(p->topk_weights)[row * K + kk];
    }
  }
};

struct PartialShared {
  int mask[kMaxRound];
  int self[kMaxRound];              // own row offset in the (source, channel) block, or -1
  int pos[kMaxRound][kMaxLocal];    // position in hop-A stream g, relative to the round's start
  int64_t posA[kMaxLocal];          // hop-A positions consumed so far (absolute)
  int64_t tailA[kMaxLocal];         // hop-A TAIL values seen
  int64_t creditedA[kMaxLocal];     // hop-A credits returned
  int cnt[kMaxLocal];
  int self_run;
};

// Hop B: this node's partial of each token of one rail source.
struct PartialStager : StreamHooks {
  const HTProxyForwardCombineParams* p;
  const RingArgs* aB;   // hop B (area 0)
  const RingArgs* aA;   // hop A (area 1)
  PartialShared* sh;
  int src, c, me_local, G, node;
  int64_t rdma_start, self_start, round_cap;

  UCCL_DEVICE int64_t max_round() const { return round_cap; }
  UCCL_DEVICE int local_rank(int g) const { return node * G + g; }

  UCCL_DEVICE bool prepare(int64_t k0, int64_t k1, int64_t) {
    const auto* rdma_mask = reinterpret_cast<const int*>(p->rdma_mask);
    for (int g = 0; g < G; ++g) sh->cnt[g] = 0;
    for (int64_t k = k0; k < k1; ++k) {
      const int i = int(k - k0);
      const uint32_t mask = uint32_t(rdma_mask[rdma_start + k]);
      sh->mask[i] = int(mask);
      sh->self[i] = ((mask >> me_local) & 1u) ? sh->self_run++ : -1;
      for (int g = 0; g < G; ++g)
        if (g != me_local && ((mask >> g) & 1u)) sh->pos[i][g] = sh->cnt[g]++;
    }
    for (int g = 0; g < G; ++g) {  // every row of the round has landed
      if (g == me_local || sh->cnt[g] == 0) continue;
      const int64_t need = sh->posA[g] + sh->cnt[g];
      if (sh->tailA[g] < need) {
        // acquire (inside wait_tail): the rows the TAIL covers are in this rank's region
        sh->tailA[g] = wait_tail(*aA, local_rank(g), c, need, kPhaseHTCombineSend);
        if (sh->tailA[g] < 0) return false;
      }
    }
    return true;
  }

  UCCL_DEVICE void stage(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    const int64_t H = p->hidden, K = p->num_topk;
    for (int64_t k = k0 + g.index; k < k1; k += g.members) {
      const int i = int(k - k0);
      const uint32_t mask = uint32_t(sh->mask[i]);
      const uint8_t* rows[kMaxLocal];
      int nsrc = 0;
      for (int l = 0; l < G; ++l) {  // local ranks ascending: the host executor's order
        if (!((mask >> l) & 1u)) continue;
        rows[nsrc++] = l == me_local ? reinterpret_cast<const uint8_t*>(p->x) + (self_start + sh->self[i]) * H * 2
                                     : receive_slot(*aA, local_rank(l), c, sh->posA[l] + sh->pos[i][l]);
      }
      uint8_t* out = staging_slot(*aB, src, c, base + k);
      const bool bf16 = p->partial_bf16 != 0;
      if (bf16) warp_combine_rows<2, false>(out, rows, nsrc, H, 0, 0, 0);  // 0 + row, then in order, in fp32
      else warp_combine_rows<2, true>(out, rows, nsrc, H, 0, 0, 0);
      for (int64_t kk = lane_id(); kk < K; kk += kWarpSize) {
        float acc = 0.0f;
        int s = 0;
        for (int l = 0; l < G; ++l) {
          if (!((mask >> l) & 1u)) continue;
          const float v = l == me_local
                              ? reinterpret_cast<const float*>(p->topk_weights)[(self_start + sh->self[i]) * K + kk]
                              : __uint_as_float(ld_u32_cg(rows[s] + 2 * H + 4 * kk));
          acc = __fadd_rn(acc, v);
          ++s;
        }
        reinterpret_cast<float*>(out + (bf16 ? 2 : 4) * H)[kk] = acc;
      }
    }
  }

  // After the round's push: its hop-A rows are consumed; credits go back every half ring through the
  // proxy, every round to a node mate over NVLink (one store).
  UCCL_DEVICE bool finish(int64_t, int64_t, int64_t) {
    const int64_t lazy = aA->mates != nullptr ? 1 : (aA->slots / 2 > 1 ? aA->slots / 2 : 1);
    for (int g = 0; g < G; ++g) {
      if (g == me_local) continue;
      sh->posA[g] += sh->cnt[g];
      if (sh->posA[g] - sh->creditedA[g] >= lazy) {
        if (!return_credit(*aA, local_rank(g), c, sh->posA[g], sh->posA[g] - sh->creditedA[g], kPhaseHTCombineSend))
          return false;
        sh->creditedA[g] = sh->posA[g];
      }
    }
    return true;
  }
};

// out_weights[t] from the partials' fp32 weights (at byte `at` of each message), nodes ascending.
UCCL_DEVICE void reduce_weights(const HTProxyForwardCombineParams& p, int64_t t, const uint8_t* const* rows, int nsrc,
                                int64_t at) {
  if (p.out_weights == 0) return;
  const int64_t K = p.num_topk;
  for (int64_t kk = lane_id(); kk < K; kk += kWarpSize) {
    float acc = 0.0f;
    for (int s = 0; s < nsrc; ++s) acc = __fadd_rn(acc, __uint_as_float(ld_u32_cg(rows[s] + at + 4 * kk)));
    reinterpret_cast<float*>(p.out_weights)[t * K + kk] = acc;
  }
}

// out[t] from the nodes' partials (nodes ascending), warp-cooperative.
UCCL_DEVICE void reduce_partials(const HTProxyForwardCombineParams& p, int64_t t, const uint8_t* const* rows, int nsrc) {
  const int64_t H = p.hidden;
  auto* out = reinterpret_cast<uint8_t*>(p.out) + t * H * 2;
  if (p.partial_bf16 != 0) {  // BF16 partials: a combine's sum (biases first, then the rows in order)
    warp_combine_rows<2>(out, rows, nsrc, H, p.bias0, p.bias1, t);
    reduce_weights(p, t, rows, nsrc, 2 * H);
    return;
  }
  constexpr int U = 2;  // vectors per lane per step: with a pair of sources, 8 loads in flight per lane
  const int64_t nvec = H / 8;
  for (int64_t v0 = lane_id(); v0 < nvec; v0 += U * kWarpSize) {
    float acc[U][8];
    chunk_start<U>(acc, v0, nvec, p.bias0, p.bias1, t, H);
    for (int s = 0; s < nsrc; s += 2) {
      const bool two = s + 1 < nsrc;
      Vec16 x[2][U][2];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = v0 + u * kWarpSize;
        if (v >= nvec) continue;
        x[0][u][0] = ld16_cg(rows[s] + v * 32);
        x[0][u][1] = ld16_cg(rows[s] + v * 32 + 16);
        if (two) {
          x[1][u][0] = ld16_cg(rows[s + 1] + v * 32);
          x[1][u][1] = ld16_cg(rows[s + 1] + v * 32 + 16);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // the pair in order: one IEEE add at a time
        if (j == 1 && !two) break;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (v0 + u * kWarpSize >= nvec) continue;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[u][e] = __fadd_rn(acc[u][e], __uint_as_float(x[j][u][0].w[e]));
            acc[u][4 + e] = __fadd_rn(acc[u][4 + e], __uint_as_float(x[j][u][1].w[e]));
          }
        }
      }
    }
    chunk_store<U>(out, acc, v0, nvec);
  }
  reduce_weights(p, t, rows, nsrc, 4 * H);
}

}  // namespace

namespace {

UCCL_DEVICE void forward_combine_main(const HTProxyForwardCombineParams& p) {
  __shared__ int s_arrive[kHTProxyMaxRanks];
  __shared__ int64_t s_word[kHTProxyMaxRanks];
  __shared__ int64_t s_base[kHTProxyMaxRanks];
  __shared__ int64_t s_tail[kHTProxyMaxRanks];
  __shared__ PartialShared sh;
  __shared__ int s_fail;
  const ForwardBlock b = forward_block(p);
  const RingArgs aB = ring_args(p);
  const RingArgs aA = nvl_ring_args(p);
  if (threadIdx.x < kHTProxyMaxRanks) {
    s_arrive[threadIdx.x] = 0;
    s_word[threadIdx.x] = 0;
    const int rail = int(threadIdx.x) * b.G + b.me_local;
    s_base[threadIdx.x] = threadIdx.x < b.N ? int64_t(aB.state->recv_pos[rail][aB.first_ring + b.c]) : 0;
    s_tail[threadIdx.x] = 0;
  }
  if (threadIdx.x == 0) {
    s_fail = 0;
    for (int l = 0; l < b.G && l < kMaxLocal; ++l) {
      sh.posA[l] = l == b.me_local ? 0 : int64_t(aA.state->recv_pos[b.node * b.G + l][aA.first_ring + b.c]);
      sh.tailA[l] = 0;
      sh.creditedA[l] = sh.posA[l];
    }
  }
  __syncthreads();
  if (ht_partial_msg_bytes(p.hidden, p.num_topk, p.partial_bf16 != 0) != p.ring.msg_bytes ||
      ht_combine_msg_bytes(p.hidden, p.num_topk) != p.nvl_ring.msg_bytes || b.G > kMaxLocal) {
    if (threadIdx.x == 0) raise_error(aB.err, kErrProtocol, kPhaseHTCombineSend, b.me, -1, b.c, 0);
    return;
  }

  if (b.role == 0) {  // hop A: one group per other local rank
    MateGroup mg;
    if (!mate_group(b, reinterpret_cast<const int*>(p.recv_count), s_arrive, mg)) return;
    RowsBackStager st{{}, &p, &aA, mg.f, mg.f_local, b.c};
    send_stream(aA, mg.g, &s_word[mg.grp], mg.f, b.c, mg.n, st, kPhaseHTCombineSend);
    return;
  }
  if (b.role == 1) {  // the forwarder: partials to every rail source in ascending order
    WarpGroup g{&s_arrive[0], num_warps(), warp_id(), 0u};
    const auto* rdma_count = reinterpret_cast<const int*>(p.rdma_count);
    const int64_t half = aA.slots / 2 > 1 ? aA.slots / 2 : 1;
    const bool passed = for_each_rail_source(
        b, reinterpret_cast<const int*>(p.rdma_prefix), reinterpret_cast<const int*>(p.recv_prefix), sh, &s_fail,
        [&](int m, int src, int64_t rdma_first, int64_t recv_first) {
          PartialStager st{{}, &p, &aB, &aA, &sh, src, b.c, b.me_local, b.G, b.node, rdma_first, recv_first,
                           half < kMaxRound ? half : kMaxRound};
          return send_stream(aB, g, &s_word[0], src, b.c, rdma_count[m * b.C + b.c], st, kPhaseHTCombineSend);
        });
    if (!passed) return;
    if (threadIdx.x == 0) {  // the last credits, and where the hop-A streams stand
      for (int l = 0; l < b.G; ++l) {
        if (l == b.me_local) continue;
        const int mate = b.node * b.G + l;
        if (sh.posA[l] > sh.creditedA[l] &&
            !return_credit(aA, mate, b.c, sh.posA[l], sh.posA[l] - sh.creditedA[l], kPhaseHTCombineSend))
          return;
        aA.state->recv_pos[mate][aA.first_ring + b.c] = uint64_t(sh.posA[l]);
      }
    }
    return;
  }

  // The source: rounds of B tokens, one warp each, nodes ascending (reduce_rounds).
  const auto* head = reinterpret_cast<const int*>(p.send_rdma_head);
  const auto* nsp = reinterpret_cast<const int*>(p.node_send_prefix);
  const int64_t half = aB.slots / 2;
  const int B = int(half < 1 ? 1 : (half < num_warps() ? half : num_warps()));
  const auto pos_of = [&](int u, int n) -> int64_t {  // token u's partial in node n's stream, or -1
    const int h = head[int64_t(u) * b.N + n];
    return h < 0 ? -1 : h - (b.c > 0 ? nsp[n * b.C + b.c - 1] : 0);
  };
  reduce_rounds(aB, b.c, b.t_begin, b.t_end, b.N, B, half > 1 ? half : 1, s_base, s_tail, &s_fail,
                kPhaseHTCombineRecv, pos_of, [&](int n) { return n * b.G + b.me_local; },
                [&](int64_t t, const uint8_t* const* rows, int nsrc) { reduce_partials(p, t, rows, nsrc); });
}

}  // namespace

// Main blocks first, then the copy role's blocks (device/ht_dma.cuh), if any.
extern "C" __global__ void __launch_bounds__(512, 1) ht_proxy_forward_combine(const UCCL_GRID_CONSTANT HTProxyForwardCombineParams p) {
  if (ht_dma_block(p)) return;
  forward_combine_main(p);
  ht_dma_warp_done(p);
}
