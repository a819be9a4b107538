// HT variant "tma" of intranode_combine.cu: same parameters, sums and ring protocol, different
// data movement (UCCL_EP_HT_VARIANT=tma; pairs with intranode_dispatch_tma.cu, whose own-rank
// bypass it relies on).
//
//   sender block 2c, group i != me: rows [recv_channel_prefix[i][c], next) of x go back to rank i
//     through ring (c, me -> i), the k-th into slot base + k, by bulk copy (ht_bulk.cuh); the
//     lanes copy the top-k weights. Group me has nothing to send: the receiver reads own rows
//     from x itself (row recv_channel_prefix[me][c] + k, k = the token's index among channel c's
//     tokens for this rank, which is send_head[t][me]).
//   receiver block 2c + 1: warp w takes channel c's tokens t_begin + w, + w + NW, ... For each it
//     bulk-loads every input row (bias0, bias1, then one row per source rank, ascending) slice by
//     slice into its shared-memory stages, kRecvStages slices in flight (across tokens too), and
//     sums each slice from shared memory: out = (bias0 + bias1) + 0 + row_0 + row_1 + ... in fp32,
//     one IEEE add at a time, cast to BF16 -- the default kernel's order, bit for bit.
//
// NOTES: a warp never blocks on a ring with loads in flight: when the next token's rows are not
// published yet it first sums what it holds, publishes, and only then waits (as the default
// kernel, so the same ring-size rule holds). Head counters mean what the default kernel's mean
// ("all my positions below V are consumed", V taken per source), so producers of either variant
// read them the same way.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ht_tma_ring.cuh"
#include "uccl_ep/device/numeric.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;
using bulk::CopyStream;
using bulk::WaitSite;

namespace {

constexpr int kRanks = bulk::kRanks;

constexpr int kHeadSlack = 16;                 // receiver: positions a head may lag before republishing
constexpr int kRecvStages = 3;                 // receiver: slices in flight per warp
constexpr int kDescs = kRecvStages + 1;        // tokens a warp can have in flight, plus the next one
constexpr int kMaxSrc = kRanks + 2;

// A token a receiver warp is summing (shared memory, written by lane 0, read by all lanes).
struct alignas(16) Desc {
  const uint8_t* src[kMaxSrc];  // input rows in summation order
  const float* wsrc[kRanks];    // top-k weights of the rank rows, same order
  int cnt[kRanks];              // this rank's tokens for rank j before this token (its position - base)
  int token, nsrc, nw;
  uint32_t inmask;              // bit j: the token went to rank j
};

struct Ctx : tma::Channel {
  const HTCombineParams* p;
  int64_t K, rb;  // top-k, bytes of a BF16 row
  int64_t w_off;  // weights inside a slot: after the 16-aligned row
};

UCCL_DEVICE uint64_t* head_of(const Ctx& x, int j, int warp) {
  return counter(x.peer[j], kHTHeadOffset, x.c, x.R, x.me, warp);
}
UCCL_DEVICE const uint64_t* tails_of(const Ctx& x, int j) {
  return counter(x.peer[x.me], kHTTailOffset, x.c, x.R, j, 0);
}

// Sender: rows back to rank i != me.
UCCL_DEVICE void send_rows(const Ctx& x, CopyStream& st, int i, int w, uint64_t base) {
  const HTCombineParams& p = *x.p;
  const auto* rcp = reinterpret_cast<const int*>(p.recv_channel_prefix);
  const auto* rank_prefix = reinterpret_cast<const int*>(p.rank_prefix);
  const int64_t start = rcp[i * x.C + x.c];
  const int64_t n = (x.c + 1 < x.C ? rcp[i * x.C + x.c + 1] : rank_prefix[i * x.R + x.me]) - start;
  auto* ring = reinterpret_cast<uint8_t*>(x.peer[i] + kHTRingOffset) + (int64_t(x.c) * x.R + x.me) * x.S * p.slot_bytes;
  const WaitSite site = {x.err, uint64_t(p.timeout_ns), kPhaseHTCombineSend, x.me, i, x.c};
  tma::Producer pr;
  pr.init(counter(x.peer[i], kHTTailOffset, x.c, x.R, x.me, w), counter(x.peer[x.me], kHTHeadOffset, x.c, x.R, i, 0),
          x.R * x.G, uint64_t(x.S), base, tma::publish_interval(x.S, x.G));
  const auto* tw = reinterpret_cast<const float*>(p.topk_weights);
  const int lane = lane_id();
  for (int64_t k = w; k < n; k += x.G) {
    const uint64_t pos = base + uint64_t(k);
    if (!pr.reserve(st, pos, site)) {
      tma::bail();
      return;
    }
    uint8_t* slot = ring + int64_t(pos % uint64_t(x.S)) * p.slot_bytes;
    const int64_t row = start + k;
    float wv = 0.0f;
    if (tw != nullptr && lane < x.K) wv = __ldg(tw + row * x.K + lane);
    bool ok = true;
    if (lane == 0) {
      uint64_t done = pr.issued;
      ok = st.push_row(reinterpret_cast<const uint8_t*>(p.x) + row * x.rb, slot, x.rb, pos + 1, &done, site);
      pr.note(done, st.stored);
    }
    if (tw != nullptr) {
      auto* sw = reinterpret_cast<float*>(slot + x.w_off);
      if (lane < x.K) sw[lane] = wv;
      for (int64_t kk = lane + kWarpSize; kk < x.K; kk += kWarpSize) sw[kk] = __ldg(tw + row * x.K + kk);
    }
    pr.after_token(st);
    if (!tma::warp_all_ok(ok)) {
      tma::bail();
      return;
    }
  }
  if (!pr.drain(st, site, base + uint64_t(n))) {
    tma::bail();
    return;
  }
  if (w == 0 && lane == 0) reinterpret_cast<uint64_t*>(p.sent)[x.c * x.R + i] = base + uint64_t(n);
}

// Bit j of lane l's result: token t0 + l went to rank j (lanes >= n or past t_end: 0).
UCCL_DEVICE uint32_t token_bits(const Ctx& x, int t0, int n) {
  const auto* in_rank = reinterpret_cast<const uint8_t*>(x.p->is_token_in_rank);
  const int t = t0 + lane_id();
  uint32_t bits = 0;
  if (lane_id() < n && t < x.t_end)
    for (int j = 0; j < x.R; ++j) bits |= uint32_t(in_rank[int64_t(t) * x.R + j] != 0) << j;
  return bits;
}

UCCL_DEVICE void add_counts(const Ctx& x, uint32_t bits, int (&cnt)[kRanks]) {
#pragma unroll
  for (int j = 0; j < kRanks; ++j)
    if (j < x.R) cnt[j] += popc64(warp_ballot((bits >> j) & 1u));
}

// One slice of one token, from the stage at `stage` (slot q of source q is q * sl bytes in).
UCCL_DEVICE void sum_slice(const Ctx& x, const Desc& d, const uint8_t* stage, int64_t sl, int64_t off, int64_t bytes) {
  const HTCombineParams& p = *x.p;
  auto* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(d.token) * x.rb + off;
  for (int64_t v = lane_id(); v < bytes / 16; v += kWarpSize) {
    float acc[8], f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    int q = 0;
    if (p.bias0 != 0) unpack_bf16x8(ld16(stage + (q++) * sl + v * 16), acc);
    if (p.bias1 != 0) {
      unpack_bf16x8(ld16(stage + (q++) * sl + v * 16), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], f[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], 0.0f);  // the reference's "+ 0" (-0 -> +0)
    for (; q < d.nsrc; ++q) {
      unpack_bf16x8(ld16(stage + q * sl + v * 16), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], f[e]);
    }
    st16(out + v * 16, pack_bf16x8(acc));
  }
}

// Receiver warp `warp` of NW.
UCCL_DEVICE void recv_tokens(const Ctx& x, uint8_t* area, const uint64_t (&bases)[kRanks]) {
  const HTCombineParams& p = *x.p;
  const int NW = x.R * x.G, warp = warp_id(), lane = lane_id();
  const int nslots = x.R + (p.bias0 != 0) + (p.bias1 != 0);
  // This warp's shared memory: descriptors, barriers, per-stage (descriptor, slice), then stages.
  auto* descs = reinterpret_cast<Desc*>(area);
  auto* bars = reinterpret_cast<uint64_t*>(descs + kDescs);
  auto* stage_desc = reinterpret_cast<int*>(bars + kRecvStages);
  auto* stage_slice = stage_desc + kRecvStages;
  const int64_t header = (reinterpret_cast<uint8_t*>(stage_slice + kRecvStages) - area + 127) / 128 * 128;
  uint8_t* stages = area + header;
  // Slices: as few as the stages allow, of equal size (no short tail slice), multiples of 16 bytes.
  const int64_t sl_max = (int64_t(bulk::kStreamAreaBytes) - header) / kRecvStages / nslots / 16 * 16;
  if (sl_max < 16) {
    if (lane == 0) raise_error(x.err, kErrProtocol, kPhaseHTCombineRecv, x.me, -1, x.c, 0);  // host sized it wrong
    return;
  }
  const int nsl = int((x.rb + sl_max - 1) / sl_max);
  const int64_t sl = ((x.rb + nsl - 1) / nsl + 15) / 16 * 16;
  const int64_t stage_bytes = sl * nslots;
  if (lane == 0) {
    for (int s = 0; s < kRecvStages; ++s) bulk::mbar_init(bars + s, 1);
    bulk::fence_mbar_init();
  }
  sync_warp();
  const WaitSite bar_site = {x.err, uint64_t(p.timeout_ns), kPhaseHTCombineRecv, x.me, -1, x.c};
  const int64_t self_start = reinterpret_cast<const int*>(p.recv_channel_prefix)[x.me * x.C + x.c];

  uint64_t tail_min[kRanks], published[kRanks];
  int cnt[kRanks];
#pragma unroll
  for (int j = 0; j < kRanks; ++j) {
    tail_min[j] = 0;
    published[j] = bases[j];
    cnt[j] = 0;
    if (j < x.R && j != x.me) warp_publish(head_of(x, j, warp), bases[j]);  // counters past G may be stale
  }
  add_counts(x, token_bits(x, x.t_begin, warp), cnt);  // tokens before this warp's first one

  int t_push = x.t_begin + warp, s_push = 0, ntok = 0;
  bool have = false, ready = false;
  uint32_t pmask = 0, np = 0, nr = 0;
  int pcnt[kRanks];
  float wv[kRanks];
  for (;;) {
    // Fill: push slices while stages are free and the next token's rows are published.
    while (np - nr < uint32_t(kRecvStages) && t_push < x.t_end) {
      if (!have) {
        const uint32_t bits = token_bits(x, t_push, NW);
        pmask = uint32_t(shfl_idx(int(bits), 0));
#pragma unroll
        for (int j = 0; j < kRanks; ++j) pcnt[j] = cnt[j];
        add_counts(x, bits, cnt);
        if (lane == 0) {
          Desc& d = descs[ntok % kDescs];
          int n = 0, nw = 0;
          if (p.bias0 != 0) d.src[n++] = reinterpret_cast<const uint8_t*>(p.bias0) + int64_t(t_push) * x.rb;
          if (p.bias1 != 0) d.src[n++] = reinterpret_cast<const uint8_t*>(p.bias1) + int64_t(t_push) * x.rb;
#pragma unroll
          for (int j = 0; j < kRanks; ++j) {
            d.cnt[j] = pcnt[j];
            if (j >= x.R || !((pmask >> j) & 1u)) continue;
            if (j == x.me) {
              const int64_t row = self_start + pcnt[j];
              d.src[n++] = reinterpret_cast<const uint8_t*>(p.x) + row * x.rb;
              d.wsrc[nw++] = reinterpret_cast<const float*>(p.topk_weights) + row * x.K;
            } else {
              const uint64_t pos = bases[j] + uint64_t(pcnt[j]);
              const uint8_t* slot = reinterpret_cast<const uint8_t*>(x.peer[x.me] + kHTRingOffset) +
                                    ((int64_t(x.c) * x.R + j) * x.S + int64_t(pos % uint64_t(x.S))) * p.slot_bytes;
              d.src[n++] = slot;
              d.wsrc[nw++] = reinterpret_cast<const float*>(slot + x.w_off);
            }
          }
          d.token = t_push;
          d.nsrc = n;
          d.nw = nw;
          d.inmask = pmask;
        }
        have = true;
        ready = false;
      }
      if (!ready) {
        bool need = false;
#pragma unroll
        for (int j = 0; j < kRanks; ++j) {
          if (j >= x.R || j == x.me || !((pmask >> j) & 1u) || bases[j] + uint64_t(pcnt[j]) < tail_min[j]) continue;
          tail_min[j] = warp_min_counter(tails_of(x, j), x.G);
          if (bases[j] + uint64_t(pcnt[j]) >= tail_min[j]) need = true;
        }
        if (need) {
          if (np != nr) break;  // sum what is in flight first
#pragma unroll
          for (int j = 0; j < kRanks; ++j) {  // publish everything before blocking (release, all reduced)
            const uint64_t v = bases[j] + uint64_t(pcnt[j]);
            if (j < x.R && j != x.me && v > published[j]) warp_publish(head_of(x, j, warp), published[j] = v);
          }
#pragma unroll
          for (int j = 0; j < kRanks; ++j) {
            const uint64_t pos = bases[j] + uint64_t(pcnt[j]);
            if (j >= x.R || j == x.me || !((pmask >> j) & 1u) || pos < tail_min[j]) continue;
            tail_min[j] = warp_wait_above(tails_of(x, j), x.G, pos, uint64_t(p.timeout_ns), x.err, kPhaseHTCombineRecv,
                                          x.me, j, x.c);
            if (tail_min[j] == 0) return;  // nothing in flight (np == nr)
          }
        }
        sync_warp();  // the counters' acquires (all lanes) before lane 0's bulk loads
        if (lane == 0) bulk::fence_async_global();
        ready = true;
      }
      if (lane == 0) {
        const int s = int(np % kRecvStages);
        const Desc& d = descs[ntok % kDescs];
        const int64_t off = int64_t(s_push) * sl;
        const uint32_t bytes = uint32_t(x.rb - off < sl ? x.rb - off : sl);
        stage_desc[s] = ntok % kDescs;
        stage_slice[s] = s_push;
        bulk::arrive_expect(bars + s, bytes * uint32_t(d.nsrc));
        for (int q = 0; q < d.nsrc; ++q) bulk::load(stages + s * stage_bytes + q * sl, d.src[q] + off, bytes, bars + s);
      }
      ++np;
      if (++s_push == nsl) {
        s_push = 0;
        t_push += NW;
        ++ntok;
        have = false;
      }
    }
    sync_warp();  // lane 0's descriptors and stage records before the lanes read them
    if (np == nr) break;

    // Sum the oldest slice.
    const int s = int(nr % kRecvStages);
    if (!bulk::warp_wait_bar(bars + s, (nr / kRecvStages) & 1u, bar_site)) return;
    const Desc& d = descs[stage_desc[s]];
    const int slice = stage_slice[s];
    const int64_t off = int64_t(slice) * sl;
    sum_slice(x, d, stages + s * stage_bytes, sl, off, x.rb - off < sl ? x.rb - off : sl);
    if (p.out_weights != 0 && slice == 0 && lane < x.K) {  // weights: loaded early, summed at the end
#pragma unroll
      for (int q = 0; q < kRanks; ++q)
        if (q < d.nw) wv[q] = __ldcg(d.wsrc[q] + lane);
    }
    if (slice == nsl - 1) {
      if (p.out_weights != 0) {
        auto* ow = reinterpret_cast<float*>(p.out_weights) + int64_t(d.token) * x.K;
        if (lane < x.K) {
          float acc = 0.0f;
#pragma unroll
          for (int q = 0; q < kRanks; ++q)
            if (q < d.nw) acc = __fadd_rn(acc, wv[q]);
          ow[lane] = acc;
        }
        for (int64_t kk = lane + kWarpSize; kk < x.K; kk += kWarpSize) {
          float acc = 0.0f;
          for (int q = 0; q < d.nw; ++q) acc = __fadd_rn(acc, __ldcg(d.wsrc[q] + kk));
          ow[kk] = acc;
        }
      }
#pragma unroll
      // Lazily, "all my positions below v are consumed": warp_publish is a system-scope release
      // after a warp barrier, so this token's completed bulk loads and weight reads come first.
      for (int j = 0; j < kRanks; ++j) {
        const uint64_t v = bases[j] + uint64_t(d.cnt[j]) + ((d.inmask >> j) & 1u);
        if (j < x.R && j != x.me && v >= published[j] + kHeadSlack) warp_publish(head_of(x, j, warp), published[j] = v);
      }
    }
    sync_warp();  // every lane is done with the stage before lane 0 refills it
    ++nr;
  }

  // cnt now counts every token of the channel for each rank.
#pragma unroll
  for (int j = 0; j < kRanks; ++j) {
    if (j >= x.R || j == x.me) continue;
    warp_publish(head_of(x, j, warp), bases[j] + uint64_t(cnt[j]));
    if (warp == 0 && lane == 0) reinterpret_cast<uint64_t*>(p.consumed)[x.c * x.R + j] = bases[j] + uint64_t(cnt[j]);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512, 1) ht_combine_tma(const UCCL_GRID_CONSTANT HTCombineParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  Ctx x;
  static_cast<tma::Channel&>(x) = tma::channel_of(p);
  x.p = &p;
  x.K = p.num_topk;
  x.rb = p.hidden * 2;
  x.w_off = (x.rb + 15) / 16 * 16;
  const bool sender = x.sender;
  const int NW = x.R * x.G;
  if (!tma::smem_ok(x, sender ? kPhaseHTCombineSend : kPhaseHTCombineRecv)) return;

  // Bases are read by every warp before any warp of the block can advance them.
  const int i = warp_id() / x.G;
  uint64_t bases[kRanks];
#pragma unroll
  for (int j = 0; j < kRanks; ++j)
    bases[j] = j < x.R ? reinterpret_cast<const uint64_t*>(p.consumed)[x.c * x.R + j] : 0;
  const uint64_t send_base = sender && i < x.R ? reinterpret_cast<const uint64_t*>(p.sent)[x.c * x.R + i] : 0;
  __syncthreads();
  if (warp_id() >= NW) return;
  uint8_t* area = bulk::warp_area(smem, warp_id());
  if (!sender) {
    recv_tokens(x, area, bases);
    return;
  }
  if (i == x.me) return;  // own rows are read from x by the receiver
  CopyStream st;
  st.init(area);
  send_rows(x, st, i, warp_id() % x.G, send_base);
}
