// Low-latency dispatch through the CPU proxy (the variant of ll/nvlink/dispatch.cu for peers reached by
// a transport: another node, or a same-host GPU when UCCL_EP_FORCE_PROXY /
// allow_nvlink_for_low_latency_mode=False). Same outputs as the NVLink kernels, bit for bit.
//
// Send (ll_dispatch_proxy_send, one block per token t of this rank):
//   1. the block histograms topk_idx: the slot of t among expert e's selections is the number of
//      earlier selections of e (token order, as the reference), and e's slots start, in the
//      region for e's owner, after the slots of the owner's lower experts (packed: kernel_abi.h);
//   2. its threads cast token t once (FP8 per 128 channels, or BF16) into the slot of every
//      selected expert and write t into the slot's index;
//   3. the thread that stages the last slot for destination d (a device counter per d) writes
//      the region header {slots} and the per-expert slot counts, then pushes the region's used
//      bytes as one (or a few, chunk_bytes each) counted Write into d's recv region [this rank]
//      and the signal pair. Destinations no token selects get a header-only Write and the pair.
//      Hybrid (proxy_ll.cuh): an NVLink peer's region is staged straight into its recv area and
//      signalled by one system-scope add to its NVLink word instead.
// Recv (ll_dispatch_proxy_recv, one block per local expert, now or in the recv hook): waits
// (bounded) until the receiving proxy counted every source's signal -- released only after that
// source's Writes landed -- reads the expert's count and first slot from the region's counts and
// lays the sources out in rank order, exactly as ll_dispatch_recv does.
//
// NOTES: one Write per destination and op, not one per token (DeepEP's IBGDA) nor per expert (one
// per expert is hundreds of proxy commands per op at 288 experts, each a copy job of a few
// microseconds on the ipc transport, and a dispatch of milliseconds). A proxy hop costs about as
// much per command as per hundred kilobytes, so few large writes win; the price is that the send
// starts only once every token is staged, which at LL sizes is a few microseconds.
// Each stager orders its stores before its count with a GPU-scope fence; only the last stager for
// a destination fences at system scope before the push (a NIC or driver copy reads the region; not
// with the ipc copy kernel, which reads it after this kernel completed: OpRoute in proxy_ll.cuh):
// causality is transitive across the GPU-scope count, so the one system fence covers every block's
// stores (the same pattern in ll/proxy/combine.cu), and 1,000+ system fences per op are avoided.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ll_rows.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/proxy_ll.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxRanks = 64;
constexpr int kMaxTopk = 32;

// Byte offsets inside a packed dispatch region (kernel_abi.h): header, counts, indices, payloads.
constexpr int64_t kCountsAt = 16;
UCCL_DEVICE int64_t index_at(int64_t counts_bytes) { return kCountsAt + counts_bytes; }
UCCL_DEVICE int64_t payload_at(int64_t counts_bytes, int64_t idx_bytes) { return kCountsAt + counts_bytes + idx_bytes; }

// Header, per-expert counts, then the Writes and signal of destination d's region (n slots, `rows`
// rows). `total` holds every expert's selections by this rank (shared memory).
__device__ void publish_region(const LLProxyDispatchParams& p, int d, int n, int rows, const int* total) {
  const int E_loc = int(p.num_experts / p.num_ranks);
  uint8_t* region = region_for(p.send_area, p.region_bytes, p.peer_ll, p.nvl_peers, p.recv_off, p.rank, d);
  store_region_header(region, n);
  int* counts = reinterpret_cast<int*>(region + kCountsAt);
  for (int e = 0; e < E_loc; ++e) counts[e] = total[d * E_loc + e];
  if (d == int(p.rank)) {  // read in place by this rank's receive kernel
    signal_own_region(p.self_counter, p.signal_total);
    return;
  }
  if (is_nvl_peer(p.nvl_peers, d)) {  // already in d's recv area: released with the signal (hybrid)
    signal_nvl_peer(p.peer_ll, d, p.nvl_signal_off, p.rank, p.signal_total);
    return;
  }
  const OpRoute route{reinterpret_cast<const FifoLayout*>(p.fifos), int(p.num_fifos), fifo_for(d, int(p.num_fifos)),
                      p.dma_pushed, p.num_proxy_threads, p.push_fence != 0};
  const uint64_t len = uint64_t(payload_at(p.counts_bytes, p.idx_bytes) + int64_t(rows) * p.payload_bytes);
  // push_region fences at system scope first (unless only the copy kernel reads the region: OpRoute):
  // header and counts (and, ordered before by the caller, the slots)
  push_region(route, d, uint64_t(p.send_off + int64_t(d) * p.region_bytes), uint64_t(p.recv_off + p.rank * p.region_bytes),
              len, uint64_t(p.chunk_bytes), 1, uint32_t(p.counter), int(p.signal_total), uint64_t(p.timeout_ns),
              reinterpret_cast<ErrorWord*>(p.error), PushSite{kPhaseLLDispatchSend, int(p.rank), d, -1});
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ll_dispatch_proxy_send(const UCCL_GRID_CONSTANT LLProxyDispatchParams p) {
  // [E] selections before this token, [E] selections in total, [E] first slot of e in its owner's region
  extern __shared__ int smem[];
  __shared__ int s_expert[kMaxTopk];
  __shared__ uint8_t* s_row[kMaxTopk];  // [0, s_num_rows): token t's row in each distinct owner's region
  __shared__ int s_num_rows;
  __shared__ int s_dest_slots[kMaxRanks];
  __shared__ int s_rows_before[kMaxRanks], s_rows_total[kMaxRanks];  // tokens selecting d: before t, all
  // The copy kernel may start now (transport/copy_ring.cu): it reads nothing of ours before its
  // griddepcontrol.wait, and changes nothing we read.
  allow_dependent_launch();
  const int t = blockIdx.x, tid = threadIdx.x;
  const int R = int(p.num_ranks), K = int(p.num_topk), T = int(p.num_tokens), E = int(p.num_experts);
  const int E_loc = E / R;
  const int64_t masked = block_mask_bits(p.mask, R);  // the mask now (shrink.cuh)
  int* before = smem;
  int* total = smem + E;
  int* first = smem + 2 * E;
  for (int i = tid; i < 2 * E; i += blockDim.x) smem[i] = 0;
  for (int d = tid; d < R; d += blockDim.x) s_rows_before[d] = s_rows_total[d] = 0;
  __syncthreads();
  const auto* topk = reinterpret_cast<const int64_t*>(p.topk_idx);
  for (int i = tid; i < T * K; i += blockDim.x) {
    const int64_t e = topk[i];
    if (e < 0 || e >= E || is_masked(masked, int(e) / E_loc)) continue;
    atomicAdd(total + e, 1);
    if (i / K < t) atomicAdd(before + e, 1);
  }
  for (int u = tid; u < T; u += blockDim.x) {  // the row of token u in each rank it selects
    uint64_t dests = 0;
#pragma unroll 8
    for (int k = 0; k < K; ++k) {  // unrolled: the top-k loads in flight together
      const int64_t e = topk[int64_t(u) * K + k];
      if (e >= 0 && e < E && !is_masked(masked, int(e) / E_loc)) dests |= uint64_t(1) << (int(e) / E_loc);
    }
    for (; dests != 0; dests &= dests - 1) {
      const int d = ffs64(dests) - 1;
      atomicAdd(s_rows_total + d, 1);
      if (u < t) atomicAdd(s_rows_before + d, 1);
    }
  }
  __syncthreads();
  for (int d = warp_id(); d < R; d += num_warps()) {  // slots of the experts of d, in expert order: a warp scan
    int acc = 0;
    for (int e0 = d * E_loc; e0 < (d + 1) * E_loc; e0 += kWarpSize) {
      const int e = e0 + lane_id();
      const bool mine = e < (d + 1) * E_loc;
      int sum = 0;
      const int excl = warp_exclusive_scan(mine ? total[e] : 0, &sum);
      if (mine) first[e] = acc + excl;
      acc += sum;
    }
    if (lane_id() == 0) s_dest_slots[d] = acc;
  }
  __syncthreads();
  // The region for owner d: staged in the send area, or in d's recv area over NVLink (hybrid).
  const auto region_of_owner = [&](int d) {
    return region_for(p.send_area, p.region_bytes, p.peer_ll, p.nvl_peers, p.recv_off, p.rank, d);
  };

  if (t < T) {
    if (warp_id() == 0) {  // K <= kMaxTopk <= the warp: lane k takes the token's k-th expert
      const int lane = lane_id();
      int e = lane < K ? int(topk[int64_t(t) * K + lane]) : -1;
      if (e < 0 || e >= E || is_masked(masked, e / E_loc)) e = -1;
      if (repeats_lower_lane(e, lane, K)) {  // refused (the host raises InvalidArgument); dropped here
        duplicate_expert(reinterpret_cast<ErrorWord*>(p.error), kPhaseLLDispatchSend, int(p.rank), t, e);
        e = -1;
      }
      if (lane < K) {
        s_expert[lane] = e;
        const int q = e >= 0 ? first[e] + before[e] : 0;
        if (e >= 0 && q < p.max_slots) {  // the slot names the token and its row in the owner's region
          const int owner = e / E_loc;      // (q >= max_slots only with a repeated expert: never past the index)
          auto* index = reinterpret_cast<uint32_t*>(region_of_owner(owner) + index_at(p.counts_bytes));
          index[q] = uint32_t(t) | uint32_t(s_rows_before[owner]) << 16;  // num_max <= 65536 (ll_proxy.py)
        }
      }
    }
    __syncthreads();
    if (warp_id() == 0) {  // the distinct owners' rows, in top-k order: lane k keeps the first of its owner
      const int k = lane_id();
      const int owner = k < K && s_expert[k] >= 0 ? s_expert[k] / E_loc : -1;
      bool first_of_owner = owner >= 0;
      for (int k2 = 0; k2 < k && k2 < K; ++k2) first_of_owner &= !(s_expert[k2] >= 0 && s_expert[k2] / E_loc == owner);
      const uint64_t firsts = warp_ballot(first_of_owner);
      if (first_of_owner)
        s_row[popc64(firsts & lanemask_lt())] = region_of_owner(owner) + payload_at(p.counts_bytes, p.idx_bytes) +
                                                int64_t(s_rows_before[owner]) * p.payload_bytes;
      if (k == 0) s_num_rows = popc64(firsts);
    }
    __syncthreads();
    const int num_rows = s_num_rows;
    const uint16_t* row = reinterpret_cast<const uint16_t*>(p.x) + int64_t(t) * p.hidden;
    store_token_row(row, p.hidden, p.use_fp8 != 0, p.round_scale != 0, s_row, num_rows);
    __syncthreads();
    if (tid < K && s_expert[tid] >= 0) {  // one thread per selected expert, all in parallel
      const int d = s_expert[tid] / E_loc;
      fence_stage(p.nvl_peers, d);  // the block's staging stores (ordered by the barrier) before this count (NOTES)
      const unsigned prev = atomicAdd(reinterpret_cast<unsigned*>(p.finish) + d, 1u);
      if (int(prev) + 1 == s_dest_slots[d]) {  // last stager for d: everyone's stores are ordered before
        reinterpret_cast<unsigned*>(p.finish)[d] = 0u;
        __threadfence();  // acquire: the other stagers' counted stores (publish_region fences at system scope)
        publish_region(p, d, s_dest_slots[d], s_rows_total[d], total);
      }
    }
  }
  // Destinations that no token of this rank selects still get their (empty) region and signal.
  if (blockIdx.x == 0)
    for (int d = tid; d < R; d += blockDim.x)
      if (s_dest_slots[d] == 0 && !is_masked(masked, d)) publish_region(p, d, 0, 0, total);
}

extern "C" __global__ void __launch_bounds__(256)
    ll_dispatch_proxy_recv(const UCCL_GRID_CONSTANT LLProxyDispatchRecvParams p) {
  __shared__ int s_count[kMaxRanks];
  __shared__ int s_first[kMaxRanks];
  __shared__ int s_ok[kMaxRanks];
  __shared__ int s_begin[kMaxRanks + 1];
  const int e = blockIdx.x;
  const int R = int(p.num_ranks), tid = threadIdx.x;
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  const int expert = int(p.rank * p.num_local_experts + e);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const bool shrink = p.shrink != 0;
  const int64_t masked = block_mask_bits(p.mask, R);
  const auto* recv = reinterpret_cast<const uint8_t*>(p.recv_area);
  const auto* rounds = reinterpret_cast<const int64_t*>(p.rounds);
  const int64_t payload0 = payload_at(p.counts_bytes, p.idx_bytes);
  // Source j's region: in the recv area, or this rank's own in its send area (never pushed).
  auto region_of = [&](int j) {
    return j == int(p.rank) ? reinterpret_cast<const uint8_t*>(p.send_area) + int64_t(j) * p.region_bytes
                            : recv + int64_t(j) * p.region_bytes;
  };

  if (tid < R) {  // own counter: device memory (counter_cache); NVLink peers: their word; others: the proxy
    int ok = 0;
    if (!is_masked(masked, tid)) {
      uint64_t waited = 0;
      const int64_t got = wait_source_signal(
          p.nvl_peers, p.nvl_signal, p.counters, p.num_counters, p.counter, p.counter_cache, p.counter_lock, tid,
          round_target(rounds, tid, p.signal_total), reinterpret_cast<const uint64_t*>(p.status),
          uint64_t(p.timeout_ns), err, kPhaseLLDispatchRecv, int(p.rank), expert, &waited, p.mask, shrink);
      if (got >= 0) {
        if (load_region_slots(region_of(tid), p.max_slots) < 0)
          raise_error(err, kErrProtocol, kPhaseLLDispatchRecv, int(p.rank), tid, expert, 0);
        else
          ok = 1;
      }
      if (p.wait_stats != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + tid, (unsigned long long)waited);
    }
    s_ok[tid] = ok;
  }
  __syncthreads();
  // Count and first slot of expert e in each source's region: a warp per source sums the counts
  // of the lower experts (written by peers' copy engines: read around L1).
  for (int j = warp_id(); j < R; j += num_warps()) {
    int n = 0, before = 0;
    if (s_ok[j]) {
      const int* counts = reinterpret_cast<const int*>(region_of(j) + kCountsAt);
      for (int i = lane_id(); i < e; i += kWarpSize) before += ld_volatile(counts + i);
      for (int off = kWarpSize / 2; off > 0; off >>= 1) before += shfl_xor(before, off);
      n = ld_volatile(counts + e);
      const int slots = load_region_slots(region_of(j), p.max_slots);
      if (n < 0 || n > p.num_max || before < 0 || before + n > slots) {
        if (lane_id() == 0) raise_error(err, kErrProtocol, kPhaseLLDispatchRecv, int(p.rank), j, expert, 0);
        n = 0;
      }
    }
    if (lane_id() == 0) {
      s_count[j] = n;
      s_first[j] = before;
    }
  }
  __syncthreads();
  lay_out_expert_rows(p, e, R, s_count, s_begin);

  const int total = s_begin[R];
  for (int row = warp_id(); row < total; row += num_warps()) {
    int j = 0;
    while (row >= s_begin[j + 1]) ++j;
    const int q = s_first[j] + row - s_begin[j];  // slot in j's region
    const uint8_t* region = region_of(j);
    const uint32_t named = uint32_t(ld_volatile(reinterpret_cast<const int*>(region + index_at(p.counts_bytes)) + q));
    int token = int(named & 0xffffu), token_row = int(named >> 16);  // slot = token | row << 16
    if (token >= p.num_max || token_row >= p.num_max) {  // a peer's corrupt region must not steer our reads
      if (lane_id() == 0) raise_error(err, kErrProtocol, kPhaseLLDispatchRecv, int(p.rank), j, expert, 0);
      token = token_row = 0;
    }
    const uint8_t* payload = region + payload0 + int64_t(token_row) * p.payload_bytes;
    place_ll_row(p, e, row, rows_per_expert, token, payload);
  }
  wait_overlapped_grids();  // the copy kernel is done before this op can complete (arch.cuh; PDL launch)
  last_block_bumps_rounds(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<int64_t*>(p.rounds), R, p.mask);
}
