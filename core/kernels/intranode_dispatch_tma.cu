// HT variant "tma" of intranode_dispatch.cu: same parameters, rows, handle and ring protocol,
// different data movement (selected by UCCL_EP_HT_VARIANT=tma; see uccl_ep/cuda/ht_variants.py).
//
// Grid, groups and token numbering are the default kernel's: 2 blocks per channel (even sends,
// odd receives), G = 16 / R warps per peer rank, the k-th token of channel c for rank j belongs to
// warp k % G and to ring position base + k. What differs:
//   - rows move by bulk copy (ht_bulk.cuh): global -> shared -> global, kChunk bytes at a time,
//     kLook chunks loading while older ones store; lanes meanwhile copy the token's scales, top-k
//     and source index with plain loads issued before the row's first chunk is waited for;
//   - progress is published every few tokens without draining the pipeline (ht_tma_ring.cuh);
//   - tokens a rank sends to itself skip the ring: the sender writes them straight into recv_x
//     (row recv_channel_prefix[me][c] + k, the row the receiver would have chosen) and the
//     receiver group of the own rank has nothing to do. The own ring's positions (sent / consumed
//     [c][me]) stay untouched; intranode_combine_tma.cu reads the own rows from its input x.
//
// NOTES: the peer rings are written exactly as the default kernels write them (slot layout of
// dispatch_slot(), one tail counter per producer warp, one head counter per consumer warp), so a
// peer running the default kernels still interoperates; only the own ring is bypassed.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ht_tma_ring.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;
using bulk::CopyStream;
using bulk::WaitSite;

namespace {

// Byte offsets inside a dispatch slot: the default kernel's dispatch_slot() and ht.py's
// dispatch_slot_bytes() (row, scales, then 16-aligned top-k ids, weights, source index).
struct Slot {
  int64_t scales, topk, weights, src;
};

UCCL_DEVICE Slot slot_layout(int64_t hidden_bytes, int64_t num_scales, int64_t K) {
  Slot s;
  s.scales = hidden_bytes;
  s.topk = (hidden_bytes + num_scales * 4 + 15) / 16 * 16;
  s.weights = s.topk + K * 8;
  s.src = s.weights + K * 4;
  return s;
}

// Where one token's metadata comes from and goes to; null destinations are skipped. `map` turns
// global expert ids into this rank's local ids (-1 and weight 0 elsewhere), as the receiver does.
struct Meta {
  const uint32_t* sc_src;
  int64_t sc_stride;
  uint32_t* sc_dst;
  const int64_t* idx_src;
  const float* w_src;
  int64_t* idx_dst;
  float* w_dst;
  const int* src_src;  // null: the source index is `src_val`
  int src_val;
  int* src_dst;
  bool map;
  int64_t lo, num_local;
};

UCCL_DEVICE int64_t map_id(const Meta& m, int64_t g, float* w) {
  if (!m.map) return g;
  const bool local = g >= m.lo && g < m.lo + m.num_local;
  if (!local) *w = 0.0f;
  return local ? g - m.lo : -1;
}

// All lanes. The loads of the common sizes (<= 64 scales, <= 32 top-k) are issued before any
// store so their latencies overlap; __ldcg because ring slots are written by peers (L1 is not
// coherent with them) and the inputs do not mind.
UCCL_DEVICE void copy_meta(const Meta& m, int ns, int K) {
  const int lane = lane_id();
  uint32_t s0 = 0, s1 = 0;
  long long g = 0;
  float wv = 0.0f;
  int sv = m.src_val;
  if (m.sc_dst != nullptr && lane < ns) s0 = __ldcg(reinterpret_cast<const unsigned*>(m.sc_src + lane * m.sc_stride));
  if (m.sc_dst != nullptr && lane + kWarpSize < ns)
    s1 = __ldcg(reinterpret_cast<const unsigned*>(m.sc_src + (lane + kWarpSize) * m.sc_stride));
  if (m.idx_dst != nullptr && lane < K) {
    g = __ldcg(reinterpret_cast<const long long*>(m.idx_src) + lane);
    wv = __ldcg(m.w_src + lane);
  }
  if (m.src_dst != nullptr && m.src_src != nullptr && lane == 0) sv = __ldcg(m.src_src);
  if (m.sc_dst != nullptr) {
    if (lane < ns) m.sc_dst[lane] = s0;
    if (lane + kWarpSize < ns) m.sc_dst[lane + kWarpSize] = s1;
    for (int s = lane + 2 * kWarpSize; s < ns; s += kWarpSize)
      m.sc_dst[s] = __ldcg(reinterpret_cast<const unsigned*>(m.sc_src + s * m.sc_stride));
  }
  if (m.idx_dst != nullptr) {
    if (lane < K) {
      const int64_t id = map_id(m, g, &wv);
      m.idx_dst[lane] = id;
      m.w_dst[lane] = wv;
    }
    for (int kk = lane + kWarpSize; kk < K; kk += kWarpSize) {
      float w = __ldcg(m.w_src + kk);
      const int64_t id = map_id(m, __ldcg(reinterpret_cast<const long long*>(m.idx_src) + kk), &w);
      m.idx_dst[kk] = id;
      m.w_dst[kk] = w;
    }
  }
  if (m.src_dst != nullptr && lane == 0) *m.src_dst = sv;
}

struct Ctx : tma::Channel {
  const HTDispatchParams* p;
  int w;  // warp within its group
  int64_t K, hb, ns;
  Slot L;
};

// Sender group for rank j: walk channel c's tokens, number those for j, handle own ones (k % G == w).
// Returns the number of tokens for j (every warp of the group computes it), or -1 after an error.
template <typename Body>
UCCL_DEVICE int64_t walk_tokens(const Ctx& x, int j, Body&& body) {
  const HTDispatchParams& p = *x.p;
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  int64_t k_run = 0;
  for (int tb = x.t_begin; tb < x.t_end; tb += kWarpSize) {
    const int t = tb + lane_id();
    const bool in = t < x.t_end && in_rank[int64_t(t) * x.R + j];
    const uint64_t mask = warp_ballot(in);
    if (p.send_head != 0 && x.w == 0 && t < x.t_end)
      reinterpret_cast<int*>(p.send_head)[int64_t(t) * x.R + j] = in ? int(k_run + popc64(mask & lanemask_lt())) : -1;
    for (uint64_t m = mask; m != 0; m &= m - 1) {
      const int b = ffs64(m) - 1;
      const int64_t k = k_run + popc64(mask & ((uint64_t(1) << b) - 1));
      if (k % x.G != x.w) continue;
      if (!body(tb + b, k)) return -1;
    }
    k_run += popc64(mask);
  }
  return k_run;
}

UCCL_DEVICE Meta meta_from_input(const Ctx& x, int tok) {
  const HTDispatchParams& p = *x.p;
  Meta m = {};
  m.sc_src = reinterpret_cast<const uint32_t*>(p.x_scales) + tok * p.scale_stride_token;
  m.sc_stride = p.scale_stride_col;
  m.idx_src = reinterpret_cast<const int64_t*>(p.topk_idx) + int64_t(tok) * x.K;
  m.w_src = reinterpret_cast<const float*>(p.topk_weights) + int64_t(tok) * x.K;
  m.src_val = tok;
  return m;
}

// This rank's metadata outputs for row `row` (null where the call has none).
UCCL_DEVICE void meta_to_rows(const Ctx& x, int64_t row, Meta& m) {
  const HTDispatchParams& p = *x.p;
  m.sc_dst = p.recv_scales != 0 ? reinterpret_cast<uint32_t*>(p.recv_scales) + row * x.ns : nullptr;
  m.idx_dst = p.recv_topk_idx != 0 ? reinterpret_cast<int64_t*>(p.recv_topk_idx) + row * x.K : nullptr;
  m.w_dst = p.recv_topk_weights != 0 ? reinterpret_cast<float*>(p.recv_topk_weights) + row * x.K : nullptr;
  m.src_dst = p.recv_src_idx != 0 ? reinterpret_cast<int*>(p.recv_src_idx) + row : nullptr;
  m.map = true;
  m.lo = int64_t(x.me) * (p.num_experts / x.R);
  m.num_local = p.num_experts / x.R;
}

// Own tokens: x -> recv_x directly.
UCCL_DEVICE void send_self(const Ctx& x, CopyStream& st) {
  const HTDispatchParams& p = *x.p;
  const int64_t start = reinterpret_cast<const int*>(p.recv_channel_prefix)[x.me * x.C + x.c];
  const WaitSite site = {x.err, uint64_t(p.timeout_ns), kPhaseHTDispatchSend, x.me, x.me, x.c};
  uint64_t unused = 0;
  walk_tokens(x, x.me, [&](int tok, int64_t k) {
    const int64_t row = start + k;
    if (row >= p.num_rows) return true;
    Meta m = meta_from_input(x, tok);
    meta_to_rows(x, row, m);
    bool ok = true;
    if (lane_id() == 0)
      ok = st.push_row(reinterpret_cast<const uint8_t*>(p.x) + int64_t(tok) * x.hb,
                       reinterpret_cast<uint8_t*>(p.recv_x) + row * x.hb, x.hb, 0, &unused, site);
    copy_meta(m, int(x.ns), int(x.K));
    return tma::warp_all_ok(ok);
  });
  bool ok = true;
  if (lane_id() == 0) {
    ok = st.flush(&unused, site);
    bulk::wait_done<0>();
  }
  (void)tma::warp_all_ok(ok);
}

// Tokens for peer j: x -> slot of ring (c, me -> j) in j's buffer.
UCCL_DEVICE void send_peer(const Ctx& x, CopyStream& st, int j, uint64_t base) {
  const HTDispatchParams& p = *x.p;
  auto* ring = reinterpret_cast<uint8_t*>(x.peer[j] + kHTRingOffset) + (int64_t(x.c) * x.R + x.me) * x.S * p.slot_bytes;
  const WaitSite site = {x.err, uint64_t(p.timeout_ns), kPhaseHTDispatchSend, x.me, j, x.c};
  tma::Producer pr;
  pr.init(counter(x.peer[j], kHTTailOffset, x.c, x.R, x.me, x.w), counter(x.peer[x.me], kHTHeadOffset, x.c, x.R, j, 0),
          x.G, uint64_t(x.S), base, tma::publish_interval(x.S, x.G));
  const int64_t n = walk_tokens(x, j, [&](int tok, int64_t k) {
    const uint64_t pos = base + uint64_t(k);
    if (!pr.reserve(st, pos, site)) return false;
    uint8_t* slot = ring + int64_t(pos % uint64_t(x.S)) * p.slot_bytes;
    Meta m = meta_from_input(x, tok);
    m.sc_dst = reinterpret_cast<uint32_t*>(slot + x.L.scales);
    if (x.K > 0) {
      m.idx_dst = reinterpret_cast<int64_t*>(slot + x.L.topk);
      m.w_dst = reinterpret_cast<float*>(slot + x.L.weights);
    }
    m.src_dst = reinterpret_cast<int*>(slot + x.L.src);
    bool ok = true;
    if (lane_id() == 0) {
      uint64_t done = pr.issued;
      ok = st.push_row(reinterpret_cast<const uint8_t*>(p.x) + int64_t(tok) * x.hb, slot, x.hb, pos + 1, &done, site);
      pr.note(done, st.stored);
    }
    copy_meta(m, int(x.ns), int(x.K));
    pr.after_token(st);
    return tma::warp_all_ok(ok);
  });
  if (n < 0 || !pr.drain(st, site, base + uint64_t(n))) {
    tma::bail();
    return;
  }
  if (x.w == 0 && lane_id() == 0) reinterpret_cast<uint64_t*>(p.sent)[x.c * x.R + j] = base + uint64_t(n);
}

// Receiver of ring (c, i -> me), i != me.
UCCL_DEVICE void recv_peer(const Ctx& x, CopyStream& st, int i, uint64_t base) {
  const HTDispatchParams& p = *x.p;
  const auto* rcp = reinterpret_cast<const int*>(p.recv_channel_prefix);
  const auto* rank_prefix = reinterpret_cast<const int*>(p.rank_prefix);
  const int64_t start = rcp[i * x.C + x.c];
  const int64_t n = (x.c + 1 < x.C ? rcp[i * x.C + x.c + 1] : rank_prefix[i * x.R + x.me]) - start;
  const auto* ring =
      reinterpret_cast<const uint8_t*>(x.peer[x.me] + kHTRingOffset) + (int64_t(x.c) * x.R + i) * x.S * p.slot_bytes;
  const WaitSite site = {x.err, uint64_t(p.timeout_ns), kPhaseHTDispatchRecv, x.me, i, x.c};
  tma::Consumer co;
  co.init(counter(x.peer[i], kHTHeadOffset, x.c, x.R, x.me, x.w), counter(x.peer[x.me], kHTTailOffset, x.c, x.R, i, 0),
          x.G, base, tma::publish_interval(x.S, x.G));
  for (int64_t k = x.w; k < n; k += x.G) {
    const uint64_t pos = base + uint64_t(k);
    if (!co.acquire(st, pos, site)) {
      tma::bail();
      return;
    }
    const uint8_t* slot = ring + int64_t(pos % uint64_t(x.S)) * p.slot_bytes;
    const int64_t row = start + k;
    const bool keep = row < p.num_rows;
    Meta m = {};
    if (keep) {
      meta_to_rows(x, row, m);
      m.sc_src = reinterpret_cast<const uint32_t*>(slot + x.L.scales);
      m.sc_stride = 1;
      m.idx_src = reinterpret_cast<const int64_t*>(slot + x.L.topk);
      m.w_src = reinterpret_cast<const float*>(slot + x.L.weights);
      m.src_src = reinterpret_cast<const int*>(slot + x.L.src);
    }
    bool ok = true;
    if (lane_id() == 0)
      ok = st.push_row(slot, keep ? reinterpret_cast<uint8_t*>(p.recv_x) + row * x.hb : nullptr, x.hb, pos + 1,
                       &co.loaded, site);
    if (keep) copy_meta(m, int(x.ns), int(x.K));
    co.after_token();
    if (!tma::warp_all_ok(ok)) {
      tma::bail();
      return;
    }
  }
  if (!co.finish(st, base + uint64_t(n), site)) return;
  if (x.w == 0 && lane_id() == 0) reinterpret_cast<uint64_t*>(p.consumed)[x.c * x.R + i] = base + uint64_t(n);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512, 1) ht_dispatch_tma(const UCCL_GRID_CONSTANT HTDispatchParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  Ctx x;
  static_cast<tma::Channel&>(x) = tma::channel_of(p);
  x.p = &p;
  x.w = warp_id() % x.G;
  x.K = p.num_topk;  // 0 for cached dispatch
  x.hb = p.hidden_bytes;
  x.ns = p.num_scales;
  x.L = slot_layout(p.hidden_bytes, p.num_scales, x.K);
  const bool sender = x.sender;
  const int grp = warp_id() / x.G;
  if (!tma::smem_ok(x, sender ? kPhaseHTDispatchSend : kPhaseHTDispatchRecv)) return;

  // Bases are read by every warp before any warp of the block can advance them.
  uint64_t base = 0;
  if (grp < x.R) base = reinterpret_cast<const uint64_t*>(sender ? p.sent : p.consumed)[x.c * x.R + grp];
  __syncthreads();

  if (!sender && p.recv_topk_idx != 0) {  // rows past the real count (num_worst_tokens): -1 ids
    const auto* rank_prefix = reinterpret_cast<const int*>(p.rank_prefix);
    const int64_t real = rank_prefix[(x.R - 1) * x.R + x.me];
    for (int64_t r = real + int64_t(x.c) * blockDim.x + threadIdx.x; r < p.num_rows; r += int64_t(x.C) * blockDim.x) {
      for (int kk = 0; kk < x.K; ++kk) {
        reinterpret_cast<int64_t*>(p.recv_topk_idx)[r * x.K + kk] = -1;
        reinterpret_cast<float*>(p.recv_topk_weights)[r * x.K + kk] = 0.0f;
      }
      reinterpret_cast<int*>(p.recv_src_idx)[r] = -1;
    }
  }
  if (grp >= x.R || (!sender && grp == x.me)) return;

  CopyStream st;
  st.init(bulk::warp_area(smem, warp_id()));
  if (sender && grp == x.me) send_self(x, st);
  else if (sender) send_peer(x, st, grp, base);
  else recv_peer(x, st, grp, base);
}
