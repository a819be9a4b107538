// Normal-mode combine through the CPU proxy: the reverse of ht/proxy/dispatch.cu, reducing each
// token's rows from every rank that received it.
//
// Grid: 2 blocks per channel, on the same streams as dispatch (positions continue).
//   block 2c, group i:  rows [recv_prefix[i][c], next) of x came from rank i's channel c; the k-th
//                       goes back as message k of stream (me -> i, ring c): the BF16 row, then the
//                       top-k weights if given (the host executor's combine row)
//   block 2c+1:         token-major over channel c, a round of B tokens at a time (one warp per
//                       token): for token t and each rank j (ascending) that received it, the row
//                       is message send_head[t][j] - (tokens to j before channel c) of stream
//                       (j -> me, ring c); out[t] = (bias0 + bias1) + row_0 + row_1 + ... in fp32,
//                       one IEEE add at a time (bit-exact with uccl_ep.refs), cast to BF16; the
//                       weights are summed the same way. Credits go back after each round.
//
// NOTES: with one rank per node the hierarchical reduce of the internode protocol (node partials,
// then nodes in order) is this flat sum in rank order, and a node's partial is one BF16 row, so
// the wire carries BF16 (half the bytes of the host executor's fp32 partials, the same values).
// A round is at most half a ring (B <= slots / 2) so that every position it waits for is within
// the sender's credit (see device/internode_ring.cuh).
#include "uccl_ep/device/internode_ring.cuh"
#include "uccl_ep/device/internode_rows.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

// Stages rows [start, start + n) of x (and their weights) as the messages of stream (me -> i, c).
struct CombineStager : StreamHooks {
  const HTProxyCombineParams* p;
  const RingArgs* a;
  int i, c;
  int64_t start_row;

  UCCL_DEVICE void stage(int64_t k0, int64_t k1, int64_t base, const WarpGroup& g) {
    const int64_t H = p->hidden, K = p->num_topk;
    for (int64_t k = k0 + g.index; k < k1; k += g.members) {
      uint8_t* slot = staging_slot(*a, i, c, base + k);
      const int64_t row = start_row + k;
      warp_copy16(slot, reinterpret_cast<const uint8_t*>(p->x) + row * H * 2, H * 2);
      if (p->topk_weights != 0)
        for (int64_t kk = lane_id(); kk < K; kk += kWarpSize)
          reinterpret_cast<uint32_t*>(slot + 2 * H)[kk] = reinterpret_cast<const uint32_t*>(p->topk_weights)[row * K + kk];
    }
  }
};

// out[t] and out_weights[t] from the rows of its sources (rank order), warp-cooperative: the rows
// by the intranode combine's pipelined warp sum (combine_sum.cuh: two vectors per lane per source
// in flight, the next chunk's loads issued before the current one is added), then the weights.
// NOTES: one warp per token is bound by the loads it has in flight, not by arithmetic; with one
// 16-byte load per source per lane at a time the reducer, not the proxy, set the combine's pace.
UCCL_DEVICE void reduce_token(const HTProxyCombineParams& p, int64_t t, const uint8_t* const* rows, int nsrc) {
  const int64_t H = p.hidden, K = p.num_topk;
  warp_combine_rows<2>(reinterpret_cast<uint8_t*>(p.out) + t * H * 2, rows, nsrc, H, p.bias0, p.bias1, t);
  if (p.out_weights != 0) {
    for (int64_t kk = lane_id(); kk < K; kk += kWarpSize) {
      float acc = 0.0f;
      for (int s = 0; s < nsrc; ++s) acc = __fadd_rn(acc, __uint_as_float(ld_u32_cg(rows[s] + 2 * H + 4 * kk)));
      reinterpret_cast<float*>(p.out_weights)[t * K + kk] = acc;
    }
  }
}

}  // namespace

namespace {

UCCL_DEVICE void combine_main(const HTProxyCombineParams& p) {
  __shared__ int s_arrive[kHTProxyMaxRanks];
  __shared__ int64_t s_word[kHTProxyMaxRanks];
  __shared__ int64_t s_base[kHTProxyMaxRanks];
  __shared__ int64_t s_tail[kHTProxyMaxRanks];
  __shared__ int s_fail;
  const int R = int(p.num_ranks), C = int(p.num_channels);
  const int c = blockIdx.x / 2;
  const bool sender = (blockIdx.x & 1) == 0;
  const int T = int(p.num_tokens);
  const auto [t_begin, t_end] = channel_tokens(T, C, c);
  const RingArgs a = ring_args(p);
  const auto* recv_prefix = reinterpret_cast<const int*>(p.recv_prefix);
  const auto* recv_end = reinterpret_cast<const int*>(p.recv_end);
  const auto* send_prefix = reinterpret_cast<const int*>(p.send_prefix);
  if (threadIdx.x < kHTProxyMaxRanks) {
    s_arrive[threadIdx.x] = 0;
    s_word[threadIdx.x] = 0;
    s_base[threadIdx.x] = threadIdx.x < R ? int64_t(a.state->recv_pos[threadIdx.x][a.first_ring + c]) : 0;
    s_tail[threadIdx.x] = 0;
  }
  if (threadIdx.x == 0) s_fail = 0;
  __syncthreads();
  if (ht_combine_msg_bytes(p.hidden, p.num_topk) != p.ring.msg_bytes) {
    if (threadIdx.x == 0) raise_error(a.err, kErrProtocol, sender ? kPhaseHTCombineSend : kPhaseHTCombineRecv,
                                      a.rank, -1, c, 0);
    return;
  }

  if (sender) {
    const int W = num_warps() / R, grp = warp_id() / W;
    if (W < 1 || grp >= R) return;
    WarpGroup g{&s_arrive[grp], W, warp_id() % W, 0u};
    const int64_t start = recv_prefix[grp * C + c];
    const int64_t end = c + 1 < C ? recv_prefix[grp * C + c + 1] : recv_end[grp];
    CombineStager st{{}, &p, &a, grp, c, start};
    send_stream(a, g, &s_word[grp], grp, c, end - start, st, kPhaseHTCombineSend);
    return;
  }

  // Reducer: rounds of B tokens, one warp each, sources ascending (reduce_rounds).
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  const auto* send_head = reinterpret_cast<const int*>(p.send_head);
  const int64_t half = a.slots / 2;
  const int B = int(half < 1 ? 1 : (half < num_warps() ? half : num_warps()));
  const auto pos_of = [&](int u, int j) -> int64_t {  // token u's message in stream (j -> me, c), or -1
    const int64_t i = int64_t(u) * R + j;
    return in_rank[i] ? send_head[i] - (c > 0 ? send_prefix[j * C + c - 1] : 0) : -1;
  };
  reduce_rounds(a, c, t_begin, t_end, R, B, credit_batch(a), s_base, s_tail, &s_fail, kPhaseHTCombineRecv, pos_of,
                [](int j) { return j; },
                [&](int64_t t, const uint8_t* const* rows, int nsrc) { reduce_token(p, t, rows, nsrc); });
}

}  // namespace

// Main blocks first, then the copy role's blocks (device/ht_dma.cuh), if any.
extern "C" __global__ void __launch_bounds__(512, 1) ht_proxy_combine(const UCCL_GRID_CONSTANT HTProxyCombineParams p) {
  if (ht_dma_block(p)) return;
  combine_main(p);
  ht_dma_warp_done(p);
}
