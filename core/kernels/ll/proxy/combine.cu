// Low-latency combine through the CPU proxy (the variant of ll/nvlink/combine.cu for peers reached by a
// transport). Same output as the NVLink kernels, bit for bit.
//
// Send (ll_combine_proxy_send, a few blocks per SM): the received rows of local expert e from
// source j form the contiguous segment [begin_j, begin_j + count_j) of y[e] (layout_range), in
// the order of j's slots, i.e. of j's tokens. In j's packed region (kernel_abi.h) segment (e, j)
// starts after the segments (e' < e, j): every block scans the counts once. Warps stage the rows
// there (a row split over a few warps when the grid has warps to spare: row_split), count them per
// j, and the warp that stages the last share for j pushes the region's rows
// as one (or a few) counted Write into j's recv region [this rank] plus the signal pair. Zero
// copy (y is the send area, laid out by expert): no staging, one Write per segment (E_loc per j,
// empty ones too, so the count is known) straight from y into the packed position.
// Hybrid (proxy_ll.cuh): an NVLink peer's rows are staged straight into its recv area (in zero copy
// too, read from y) and signalled by one system-scope add to its NVLink word.
// Recv (ll_combine_proxy_recv, one block per token t; launched while the copies run, see
// ll_proxy.py): for each expert g in topk_idx[t] (not -1, owner not masked) t's row sits in g's owner's
// region at (this rank's selections of the owner's experts below g) + (t's rank among this rank's
// selections of g, exactly the dispatch slot), both counted by the whole block in one strided scan
// of topk_idx per selected expert (one thread per expert scanning alone would make T*K serial
// loads each), before it waits (bounded) for every unmasked owner's signal; out[t] = sum_k w[t,k] * row_k
// in fp32, k ascending,
// one IEEE-rounded multiply and add each, cast to BF16.
//
// LogFMT (built with UCCL_EP_LL_LOGFMT=1; device/logfmt.cuh): a region of n rows of D divisions
// holds parts A [n][D][160 B], then the meta words [n][D] u32, then parts B [n][D][96 B]; its Write
// stops after the meta words (DeepEP's 10H/8 + H/32 bytes per row) unless a division of one of its
// rows fell back to BF16 (a flag bit in the destination's finish counter tells the publishing
// warp). The rank's own rows are staged too (never read from y, which holds BF16), and zero copy is
// refused on the host. The receiver also counts n (this rank's selections of the owner's experts).
// NOTES: every block waits for every owner's signal, so the kernel ends only after every peer's
// combine send -- which each peer issues after reading this rank's dispatch data. That is what lets
// the next op on this buffer set overwrite the send area the proxy copied from, with no extra
// handshake.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ll_rows.cuh"
#include "uccl_ep/device/logfmt.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/proxy_ll.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxRanks = 64;
constexpr int kMaxTopk = 32;

UCCL_DEVICE const FifoLayout& fifo_of(const LLProxyCombineParams& p, int j) {
  return reinterpret_cast<const FifoLayout*>(p.fifos)[fifo_for(j, int(p.num_fifos))];
}

// Regions that need no Writes, only their signal: the rank's own (its receive kernel reads the rows
// in place) and an NVLink peer's (hybrid: staged in that peer's recv area already). True when j's is one.
__device__ bool signal_without_writes(const LLProxyCombineParams& p, int j) {
  if (j == int(p.rank)) {
    signal_own_region(p.self_counter, p.signal_total);
    return true;
  }
  if (is_nvl_peer(p.nvl_peers, j)) {
    signal_nvl_peer(p.peer_ll, j, p.nvl_signal_off, p.rank, p.signal_total);
    return true;
  }
  return false;
}

// The staged rows for source j (`rows` of them) as counted Writes, then the signal pair.
__device__ void publish_rows(const LLProxyCombineParams& p, int j, int rows) {
  if (signal_without_writes(p, j)) return;
  const OpRoute route{reinterpret_cast<const FifoLayout*>(p.fifos), int(p.num_fifos), fifo_for(j, int(p.num_fifos)),
                      p.dma_pushed, p.num_proxy_threads, p.push_fence != 0};
  // push_region fences at system scope first (unless only the copy kernel reads the region: OpRoute):
  // every staged row, ordered before by the caller
  push_region(route, j, uint64_t(p.send_off + int64_t(j) * p.region_bytes), uint64_t(p.recv_off + p.rank * p.region_bytes),
              uint64_t(rows) * uint64_t(p.hidden * 2), uint64_t(p.chunk_bytes), 0, uint32_t(p.counter),
              int(p.signal_total), uint64_t(p.timeout_ns), reinterpret_cast<ErrorWord*>(p.error),
              PushSite{kPhaseLLCombineSend, int(p.rank), j, -1});
}

#if UCCL_EP_LL_LOGFMT
// publish_rows for a LogFMT region: parts A and the meta words, and parts B if a division fell back
// (rounded up to 16 bytes, the copy engines' unit; the region has room past them).
__device__ void publish_logfmt_rows(const LLProxyCombineParams& p, int j, int rows, bool fell_back) {
  if (signal_without_writes(p, j)) return;
  const int64_t nd = p.hidden / 128;
  const uint64_t len = (uint64_t(rows) * nd * (kLogfmtPartA + 4 + (fell_back ? kLogfmtPartB : 0)) + 15) & ~uint64_t(15);
  const OpRoute route{reinterpret_cast<const FifoLayout*>(p.fifos), int(p.num_fifos), fifo_for(j, int(p.num_fifos)),
                      p.dma_pushed, p.num_proxy_threads, p.push_fence != 0};
  push_region(route, j, uint64_t(p.send_off + int64_t(j) * p.region_bytes), uint64_t(p.recv_off + p.rank * p.region_bytes),
              len, uint64_t(p.chunk_bytes), 0, uint32_t(p.counter), int(p.signal_total), uint64_t(p.timeout_ns),
              reinterpret_cast<ErrorWord*>(p.error), PushSite{kPhaseLLCombineSend, int(p.rank), j, -1});
}
#endif

}  // namespace

extern "C" __global__ void __launch_bounds__(256)
    ll_combine_proxy_send(const UCCL_GRID_CONSTANT LLProxyCombineParams p) {
  // [E_loc + 1] prefix of rows per local expert, [2 * blockDim.x] scan scratch, [E_loc][R] first
  // row of segment (e, j) in j's region
  extern __shared__ int smem[];
  __shared__ int s_dest_rows[kMaxRanks];
  __shared__ int s_base[kMaxRanks];
#if UCCL_EP_LL_LOGFMT
  __shared__ __align__(16) uint32_t s_logfmt_stage[256 / kLogfmtLanes * kLogfmtStageWords];
#endif
  allow_dependent_launch();  // the copy kernel may start now (as in ll_dispatch_proxy_send)
  const int tid = threadIdx.x;
  const int R = int(p.num_ranks), E_loc = int(p.num_local_experts);
  // the mask now (shrink.cuh), read from shared memory where used (this kernel is short of registers)
  const unsigned long long* mask_bits = block_mask_bits_shared(p.mask, R);
  const auto masked_now = [&](int j) { return is_masked(int64_t(*mask_bits), j); };
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  const auto* lr = reinterpret_cast<const int64_t*>(p.layout_range);
  int* prefix = smem;
  int* scratch = smem + E_loc + 1;  // [2 * blockDim.x]
  int* first = scratch + 2 * blockDim.x;
  // Rows per (e, j) in j's region; none for this rank when its receive kernel reads them in y (own_in_y).
  const auto skipped = [&](int j) { return masked_now(j) || (p.own_in_y && j == int(p.rank)); };
  auto count_of = [&](int e, int j) { return skipped(j) ? 0 : int(lr[int64_t(e) * R + j] & 0xffffffff); };
  // In zero copy every region but an NVLink peer's goes out as Writes from y (or is read in y): the
  // staging below serves the NVLink peers only (hybrid), reading y in the send area.
  const auto by_writes = [&](int j) { return p.zero_copy && !is_nvl_peer(p.nvl_peers, j); };
  auto staged_of = [&](int e, int j) { return by_writes(j) ? 0 : count_of(e, j); };
  int carry = 0;
  for (int e0 = 0; e0 < E_loc; e0 += blockDim.x) {
    const int e = e0 + tid;
    int cnt = 0;
    if (e < E_loc)
      for (int j = 0; j < R; ++j) cnt += staged_of(e, j);
    int sum = 0;
    const int excl = block_exclusive_scan(cnt, scratch, &sum);
    if (e < E_loc) prefix[e] = carry + excl;
    carry += sum;
  }
  if (tid == 0) prefix[E_loc] = carry;
  // first[e][j]: one scan over (j, e), j major, then each j's run rebased to 0.
  const int E = E_loc * R;
  carry = 0;
  for (int i0 = 0; i0 < E; i0 += blockDim.x) {
    const int i = i0 + tid;
    const int j = i / E_loc, e = i % E_loc;
    int sum = 0;
    const int excl = block_exclusive_scan(i < E ? count_of(e, j) : 0, scratch, &sum);
    if (i < E) first[e * R + j] = carry + excl;
    carry += sum;
  }
  __syncthreads();
  for (int j = tid; j < R; j += blockDim.x) {
    s_base[j] = first[j];  // e = 0
    s_dest_rows[j] = (j + 1 < R ? first[j + 1] : carry) - first[j];
  }
  __syncthreads();
  for (int i = tid; i < E; i += blockDim.x) first[i] -= s_base[i % R];
  __syncthreads();

  const int64_t row_bytes = p.hidden * 2;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  if (p.zero_copy) {
    // One Write per segment (empty ones too), straight from y; then the signal pairs.
    for (int s = blockIdx.x * int(blockDim.x) + tid; s < E; s += int(gridDim.x) * int(blockDim.x)) {
      const int e = s / R, j = s % R;
      if (masked_now(j) || !by_writes(j) || j == int(p.rank)) continue;  // own rows: read in y by the receiver
      const int64_t packed = lr[int64_t(e) * R + j];
      const int64_t begin = packed >> 32, count = packed & 0xffffffff;
      const int fifo = fifo_for(j, int(p.num_fifos));
      const bool pushed = fifo_push(
          reinterpret_cast<const FifoLayout*>(p.fifos)[fifo],
          protocol::make_counted_write(uint32_t(j), uint64_t(p.send_off + (int64_t(e) * rows_per_expert + begin) * row_bytes),
                                       uint64_t(p.recv_off + p.rank * p.region_bytes + int64_t(first[s]) * row_bytes),
                                       uint32_t(count * row_bytes), uint32_t(p.counter)),
          uint64_t(p.timeout_ns), err, PushSite{kPhaseLLCombineSend, int(p.rank), j, int(p.rank * E_loc + e)});
      unsigned long long* dma = dma_counter(p.dma_pushed, p.num_proxy_threads, fifo);
      if (pushed && dma != nullptr && count > 0) atomicAdd(dma, (unsigned long long)(count * row_bytes));
      if (pushed) stamp_dma_push(p.dma_pushed, p.num_proxy_threads, fifo);
    }
    if (blockIdx.x == 0) {
      for (int j = tid; j < R; j += blockDim.x) {
        if (j == int(p.rank) && !masked_now(j))
          signal_own_region(p.self_counter, p.signal_total);  // y was complete before this kernel
        else if (!masked_now(j) && by_writes(j))
          push_op_signal(fifo_of(p, j), j, uint32_t(p.counter), E_loc, int(p.signal_total), uint64_t(p.timeout_ns), err,
                         PushSite{kPhaseLLCombineSend, int(p.rank), j, -1});
      }
    }
    if (p.nvl_peers == 0) return;
  }

  const int total = prefix[E_loc];
  auto* finish = reinterpret_cast<unsigned*>(p.finish);
  const int gw = blockIdx.x * num_warps() + warp_id(), nw = gridDim.x * num_warps();
  // Each row staged by `parts` warps (a contiguous share each) when the grid has warps to spare.
  // NOTES: a 14 KiB BF16 row is 3.5 rounds of warp_copy16's 4 KiB, each a dependent HBM round trip;
  // at 128 tokens the grid has ~4 warps per row, so one warp per row left most of them idle.
  int parts = total > 0 ? nw / total : 1;
  parts = parts < 1 ? 1 : (parts > int(p.row_split) ? int(p.row_split) : parts);
#if !UCCL_EP_LL_LOGFMT
  const int64_t share = ((row_bytes / 16 + parts - 1) / parts) * 16;
#endif
  for (int item = gw; item < total * parts; item += nw) {
    const int row = item / parts, part = item % parts;
    int lo = 0, hi = E_loc;  // largest e with prefix[e] <= row
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (prefix[mid] <= row) lo = mid; else hi = mid;
    }
    const int e = lo;
    int r = row - prefix[e], j = 0, begin = 0;
    for (; j < R; ++j) {
      if (skipped(j) || by_writes(j)) continue;
      const int64_t packed = lr[int64_t(e) * R + j];
      const int count = int(packed & 0xffffffff);
      if (r < count) {
        begin = int(packed >> 32);
        break;
      }
      r -= count;
    }
#if UCCL_EP_LL_LOGFMT
    bool fell_back;
    {
      const int num_div = int(p.hidden / 128);
      const int share_div = (num_div + parts - 1) / parts;  // a part encodes whole divisions
      const int d0 = part * share_div, d1 = d0 + share_div < num_div ? d0 + share_div : num_div;
      // NOTES: an NVLink peer's (hybrid) region is its receive area: encoded there directly, as BF16 rows are
      const LogfmtRegion at = logfmt_region(region_for(p.send_area, p.region_bytes, p.peer_ll, p.nvl_peers, p.recv_off,
                                                       p.rank, j),
                                            s_dest_rows[j], first[e * R + j] + r, p.hidden);
      fell_back = warp_logfmt_encode_row(
          at.a + int64_t(d0) * kLogfmtPartA, kLogfmtPartA, at.b + int64_t(d0) * kLogfmtPartB, kLogfmtPartB,
          at.meta + 4 * d0,
          reinterpret_cast<const uint8_t*>(p.y) + (int64_t(e) * rows_per_expert + begin + r) * row_bytes +
              int64_t(d0) * kLogfmtDivBytes,
          d1 > d0 ? d1 - d0 : 0, s_logfmt_stage);
    }
#else
    const int64_t at = int64_t(part) * share;
    const int64_t len = at >= row_bytes ? 0 : (row_bytes - at < share ? row_bytes - at : share);
    warp_copy16(region_for(p.send_area, p.region_bytes, p.peer_ll, p.nvl_peers, p.recv_off, p.rank, j) +
                    int64_t(first[e * R + j] + r) * row_bytes + at,
                reinterpret_cast<const uint8_t*>(p.y) + (int64_t(e) * rows_per_expert + begin + r) * row_bytes + at,
                len);
#endif
    sync_warp();
#if UCCL_EP_LL_LOGFMT
    if (lane_id() == 0) {
      __threadfence();  // as below
      // the flag bit before the count: the last count's atomic sees every earlier warp's flag
      if (fell_back) atomicOr(finish + j, 0x80000000u);
      const unsigned prev = atomicAdd(finish + j, 1u);
      if (int(prev & 0x7fffffffu) + 1 == s_dest_rows[j] * parts) {
        finish[j] = 0u;
        __threadfence();
        publish_logfmt_rows(p, j, s_dest_rows[j], fell_back || (prev >> 31) != 0);
      }
    }
#else
    if (lane_id() == 0) {
      fence_stage(p.nvl_peers, j);  // this warp's staged share before its count (see ll/proxy/dispatch.cu)
      const unsigned prev = atomicAdd(finish + j, 1u);
      if (int(prev) + 1 == s_dest_rows[j] * parts) {  // last share for j: every warp's are ordered before
        finish[j] = 0u;
        __threadfence();  // acquire: every warp's counted shares (publish_rows fences at system scope)
        publish_rows(p, j, s_dest_rows[j]);
      }
    }
#endif
    sync_warp();
  }
  // Sources with no rows still get their signal (in zero copy, those of Writes got theirs above).
  if (blockIdx.x == 0)
    for (int j = tid; j < R; j += blockDim.x)
      if (s_dest_rows[j] == 0 && !masked_now(j) && !by_writes(j)) publish_rows(p, j, 0);
}

extern "C" __global__ void __launch_bounds__(256)
    ll_combine_proxy_recv(const UCCL_GRID_CONSTANT LLProxyCombineRecvParams p) {
  __shared__ int s_expert[kMaxTopk];
  __shared__ const uint8_t* s_row[kMaxTopk];  // the row of each selected expert
#if UCCL_EP_LL_LOGFMT
  __shared__ const uint8_t* s_meta[kMaxTopk];  // its meta words
  __shared__ const uint8_t* s_b[kMaxTopk];     // its parts B
  __shared__ int s_total[kMaxTopk];            // rows of this rank in the owner's region
#endif
  __shared__ float s_weight[kMaxTopk];
  __shared__ int s_owner_ok[kMaxRanks];
  __shared__ int s_slot[kMaxTopk], s_below[kMaxTopk];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int K = int(p.num_topk), E = int(p.num_experts), R = int(p.num_ranks);
  const int E_loc = E / R;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const auto* rounds = reinterpret_cast<const int64_t*>(p.rounds);
  const auto* status = reinterpret_cast<const uint64_t*>(p.status);
  const auto* topk = reinterpret_cast<const int64_t*>(p.topk_idx);
  const uint64_t timeout = uint64_t(p.timeout_ns);
  const bool shrink = p.shrink != 0;
  const int64_t masked = block_mask_bits(p.mask, R);  // the mask now (shrink.cuh)
  if (warp_id() == 0) {  // K <= kMaxTopk <= the warp: lane k takes the token's k-th expert
    const int lane = lane_id();
    int g = t < p.num_tokens && lane < K ? int(topk[int64_t(t) * K + lane]) : -1;
    if (g >= E || (g >= 0 && is_masked(masked, g / E_loc))) g = -1;
    if (repeats_lower_lane(g, lane, K)) {  // refused (the host raises InvalidArgument); counted once
      duplicate_expert(err, kPhaseLLCombineRecv, int(p.rank), t, g);
      g = -1;
    }
    if (lane < K) {
      s_expert[lane] = g;
      s_slot[lane] = 0;
      s_below[lane] = 0;
#if UCCL_EP_LL_LOGFMT
      s_total[lane] = 0;
#endif
    }
  }
  __syncthreads();
  // For each selected expert g (owner o): t's slot in g = selections of g by earlier tokens; rows
  // before g's segment in o's region = this rank's selections of o's experts below g. The whole
  // block scans topk_idx once per k (strided, warp sums, one shared add per warp). Done before the
  // wait for the owners' signals (it reads only local inputs), so it is off the path after them.
  const int64_t n_sel = int64_t(p.num_tokens) * K;
  for (int k = 0; k < K && t < p.num_tokens; ++k) {
    const int g = s_expert[k];
    if (g < 0) continue;  // uniform across the block
    const int64_t lo = int64_t(g / E_loc) * E_loc;
    int slot = 0, below = 0;
#if UCCL_EP_LL_LOGFMT
    int all = 0;
#endif
    for (int64_t i = tid; i < n_sel; i += blockDim.x) {
      const int64_t v = topk[i];
      slot += (v == g && i < int64_t(t) * K) ? 1 : 0;
      below += (v >= lo && v < g) ? 1 : 0;
#if UCCL_EP_LL_LOGFMT
      all += (v >= lo && v < lo + E_loc) ? 1 : 0;
#endif
    }
    slot = warp_sum(slot);
    below = warp_sum(below);
#if UCCL_EP_LL_LOGFMT
    all = warp_sum(all);
    if (lane_id() == 0) atomicAdd(&s_total[k], all);
#endif
    if (lane_id() == 0) {
      atomicAdd(&s_slot[k], slot);
      atomicAdd(&s_below[k], below);
    }
  }
  if (tid < R) {  // then every owner's signal, read or not (see NOTES); this rank's own moves in device memory
    int ok = 0;
    if (!is_masked(masked, tid)) {
      uint64_t waited = 0;
      ok = wait_source_signal(p.nvl_peers, p.nvl_signal, p.counters, p.num_counters, p.counter, p.counter_cache,
                              p.counter_lock, tid, round_target(rounds, tid, p.signal_total), status, timeout, err,
                              kPhaseLLCombineRecv, int(p.rank), -1, &waited, p.mask, shrink) >= 0;
      if (p.wait_stats != 0 && t < p.num_tokens)
        atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + tid, (unsigned long long)waited);
    }
    s_owner_ok[tid] = ok;
  }
  __syncthreads();
  if (t < p.num_tokens && tid < K) {
    int g = s_expert[tid];
    const uint8_t* row = nullptr;
#if UCCL_EP_LL_LOGFMT
    const uint8_t* meta = nullptr;
    const uint8_t* part_b = nullptr;
    const uint8_t* region = nullptr;
#endif
    if (g >= 0) {
      const int owner = g / E_loc;
      const int64_t row_bytes = p.hidden * 2;
#if UCCL_EP_LL_LOGFMT
      const bool past = int64_t(s_total[tid]) * (row_bytes + p.hidden / 32) > p.region_bytes ||
                        s_below[tid] + s_slot[tid] >= s_total[tid];
#else
      const bool past = (int64_t(s_below[tid]) + s_slot[tid] + 1) * row_bytes > p.region_bytes;
#endif
      if (past) {  // never read past a region
        raise_error(err, kErrProtocol, kPhaseLLCombineRecv, int(p.rank), owner, g, 0);
        g = -1;
      } else if (owner != int(p.rank)) {  // a peer's rows, in its recv region
        row = reinterpret_cast<const uint8_t*>(p.recv_area) + int64_t(owner) * p.region_bytes +
              int64_t(s_below[tid] + s_slot[tid]) * row_bytes;
#if UCCL_EP_LL_LOGFMT
        region = reinterpret_cast<const uint8_t*>(p.recv_area) + int64_t(owner) * p.region_bytes;
#endif
      } else if (!p.zero_copy) {  // this rank's own, staged in its send region
        row = reinterpret_cast<const uint8_t*>(p.send_area) + int64_t(owner) * p.region_bytes +
              int64_t(s_below[tid] + s_slot[tid]) * row_bytes;
#if UCCL_EP_LL_LOGFMT
        region = reinterpret_cast<const uint8_t*>(p.send_area) + int64_t(owner) * p.region_bytes;
#endif
      } else {  // zero copy: in y (the send area) at the dispatch segment of (local expert, this rank)
        const int e = g - owner * E_loc;
        const int64_t begin = reinterpret_cast<const int64_t*>(p.layout_range)[int64_t(e) * R + owner] >> 32;
        row = reinterpret_cast<const uint8_t*>(p.send_area) +
              (int64_t(e) * R * p.num_max + begin + s_slot[tid]) * row_bytes;
      }
      if (!s_owner_ok[owner]) g = -1;
#if UCCL_EP_LL_LOGFMT
      if (region != nullptr) {  // (zero copy, the last branch above, is refused on the host)
        const LogfmtRegion at = logfmt_region(const_cast<uint8_t*>(region), s_total[tid], s_below[tid] + s_slot[tid],
                                              p.hidden);
        row = at.a;
        meta = at.meta;
        part_b = at.b;
      }
#endif
    }
    s_expert[tid] = g;
    s_row[tid] = row;
#if UCCL_EP_LL_LOGFMT
    s_meta[tid] = meta;
    s_b[tid] = part_b;
#endif
    s_weight[tid] = reinterpret_cast<const float*>(p.topk_weights)[int64_t(t) * K + tid];
  }
  __syncthreads();
  if (t < p.num_tokens) {
    const int64_t H = p.hidden;
    auto* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(t) * H * 2;
    for (int64_t c = tid; c < H / 8; c += blockDim.x) {
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
#if UCCL_EP_LL_LOGFMT
      for (int k = 0; k < K; ++k) {  // decoded, then the BF16 path's multiply and add, in k order
        if (s_expert[k] < 0) continue;
        float v[8];
        logfmt_decode8(s_row[k], kLogfmtPartA, s_b[k], kLogfmtPartB, s_meta[k], c, v);
        const float w = s_weight[k];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(v[i], w));
      }
#else
      add_weighted_rows(acc, s_expert, s_weight, K, [&](int k) { return s_row[k] + c * 16; });
#endif
      st16(out + c * 16, pack_bf16x8(acc));
    }
  }
  wait_overlapped_grids();  // the copy kernel is done before this op can complete (arch.cuh; PDL launch)
  last_block_bumps_rounds(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<int64_t*>(p.rounds), R, p.mask);
}
