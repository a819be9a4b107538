// Low-latency dispatch over NVLink: per-expert padded slabs with in-kernel FP8 (DeepEP V1 LL).
//
// Receive area of a buffer set (this kernel's part; ll/nvlink/combine.cu lays the same bytes out its own way):
//   token area [source rank][num_max] messages of msg_bytes (payload, then FP8 scales); at flag_off,
//   past both kernels' parts, the slot flags [local expert][source rank][num_max] u64:
//   (tag << 32) | token of the slot, written once the token's message is in.
//
// Send (ll_dispatch_send, one block per token t of this rank, on the current stream):
//   1. every block histograms topk_idx (shared-memory counts per expert over all tokens, and over
//      tokens before t), so the slot of t in expert e's segment is the number of earlier tokens
//      selecting e: deterministic (token order, as the reference) and without global atomics;
//   2. at once, block b publishes the count of every expert e = b (mod grid) into signal[e_loc][rank]
//      of the owner, (tag << 32) | count: the receiver lays out its slabs without waiting for data;
//   3. warp 0 finds the token's distinct owner ranks (ballot); the block's threads cast token t
//      once (FP8 per 128 channels via 8-lane amax, or BF16 as is) and store each 16-byte piece into
//      the token area of every distinct owner rank (a peer pointer through an IPC map, or local
//      memory): once per rank, however many of its experts t selects;
//   4. after a block barrier, one thread per selected expert publishes the slot's flag with a
//      system-scope release (the barrier orders the block's message stores before it).
// Recv (ll_dispatch_recv, one block per local expert, now or in the recv hook):
//   waits (bounded) for every source's count, lays the sources out in rank order (begin_j = prefix
//   of counts), writes layout_range / recv_count / stats, then for each slot waits (bounded) for its
//   flag and copies the token it names into the caller's tensors: data rows, column-major scales
//   (packed to UE8M0 if asked), src_info.
//
// Shrink mode (device/shrink.cuh): masked ranks are read from the device mask when the kernels run
// (nothing is sent to them, nothing awaited from them); a count or flag whose wait expires masks
// its source, whose rows are then dropped. A top-k row that repeats an expert is refused through the
// error word (InvalidArgument on the host) and the repeat dropped; counts and flags never name a
// slot past num_max, and the receiver refuses a count above it, so no write lands past a slab.
//
// NOTES: signals and flags are never cleared. A tag is "completed ops on this buffer set + 1":
// every rank runs the same sequence of LL ops, so sender and receiver agree on it, a stale signal
// or flag from an earlier use of the set (a dispatch's or a combine's: they share the flag area)
// carries an older tag, and the device-side counter makes CUDA-graph replays correct without host
// involvement. The last receive block bumps the set's counter. Flags live apart from the token
// area and the combine's rows because a flag is read before its writer is known to be done: bytes
// of another op there could read as a current tag.
//
// NOTES: a flag per slot instead of a counter per expert: no device-wide atomics and no
// "last writer" round trip on the send side, and the receiver (started early, Tuning.ll_pdl)
// copies each token as soon as it lands.
//
// NOTES: a token goes to each rank once, not once per selected expert (DeepEP's LL sends per
// expert): with top-8 of 288 experts a token selects ~4 experts of each rank at EP2 and ~1.5 per
// selected rank at EP8, so NVLink carries 1.5-4x fewer bytes; the receiver's expansion into
// the per-expert slabs is a local copy it made anyway (it copied each slot's message before).
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ll_rows.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/shrink.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kMaxRanks = 64;
constexpr int kMaxTopk = 32;

}  // namespace

extern "C" __global__ void __launch_bounds__(512) ll_dispatch_send(const UCCL_GRID_CONSTANT LLDispatchParams p) {
  extern __shared__ int smem[];  // [E] selections before this token, [E] selections in total
  __shared__ int s_expert[kMaxTopk];
  __shared__ uint8_t* s_msg[kMaxTopk];  // [0, s_num_dst): the token's message in each distinct owner rank
  __shared__ int s_num_dst;
  const int t = blockIdx.x, tid = threadIdx.x;
  const int R = int(p.num_ranks), K = int(p.num_topk), T = int(p.num_tokens), E = int(p.num_experts);
  const int E_loc = E / R;
  const int64_t masked = block_mask_bits(p.mask, R);  // the mask now (shrink.cuh)
  int* before = smem;
  int* total = smem + E;
  for (int i = tid; i < 2 * E; i += blockDim.x) smem[i] = 0;
  __syncthreads();
  const auto* topk = reinterpret_cast<const int64_t*>(p.topk_idx);
  for (int i = tid; i < T * K; i += blockDim.x) {
    const int64_t e = topk[i];
    if (e < 0 || e >= E) continue;
    atomicAdd(total + e, 1);
    if (i / K < t) atomicAdd(before + e, 1);
  }
  const uint32_t tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  allow_dependent_launch();  // the receive kernel may start now: every block has read the op counter
  const auto* peer_recv = reinterpret_cast<const uint64_t*>(p.peer_recv);
  const auto* peer_signal = reinterpret_cast<const uint64_t*>(p.peer_signal);
  __syncthreads();
  // Counts first (the histogram is complete): block b publishes experts e = b (mod grid).
  for (int e = blockIdx.x + int(gridDim.x) * tid; e < E; e += int(gridDim.x) * int(blockDim.x)) {
    if (is_masked(masked, e / E_loc)) continue;
    auto* sig = reinterpret_cast<uint64_t*>(peer_signal[e / E_loc]);
    // at most num_max: only a top-k row that repeats an expert selects it more often than T <= num_max
    // times (refused below); the receiver's slab has num_max rows per source
    const int count = total[e] < int(p.num_max) ? total[e] : int(p.num_max);
    st_relaxed_sys(sig + int64_t(e % E_loc) * R + p.rank, (uint64_t(tag) << 32) | uint32_t(count));
  }

  if (t < T) {
    if (warp_id() == 0) {  // K <= kMaxTopk <= the warp: lane k handles the token's k-th expert
      const int lane = lane_id();
      int e = -1;
      if (lane < K) {
        e = int(topk[int64_t(t) * K + lane]);
        if (e < 0 || e >= E || is_masked(masked, e / E_loc)) e = -1;
      }
      if (repeats_lower_lane(e, lane, K)) {  // refused (the host raises InvalidArgument); dropped here
        duplicate_expert(reinterpret_cast<ErrorWord*>(p.error), kPhaseLLDispatchSend, int(p.rank), t, e);
        e = -1;
      }
      if (lane < K) s_expert[lane] = e;
      // distinct owner ranks, in top-k order: a lane is first if no lower lane has its owner
      const int d = e < 0 ? -1 : e / E_loc;
      bool first = d >= 0;
      for (int k2 = 0; k2 < K; ++k2) {
        const int d2 = shfl_idx(d, k2);
        first = first && !(k2 < lane && d2 == d);
      }
      const uint64_t firsts = warp_ballot(first);
      if (first)
        s_msg[popc64(firsts & lanemask_lt())] =
            reinterpret_cast<uint8_t*>(peer_recv[d]) + (int64_t(p.rank) * p.num_max + t) * p.msg_bytes;
      if (lane == 0) s_num_dst = popc64(firsts);
    }
    __syncthreads();
    const int num_dst = s_num_dst;
    const uint16_t* row = reinterpret_cast<const uint16_t*>(p.x) + int64_t(t) * p.hidden;
    store_token_row(row, p.hidden, p.use_fp8 != 0, p.round_scale != 0, s_msg, num_dst);
    __syncthreads();
    if (tid < K && s_expert[tid] >= 0 && before[s_expert[tid]] < p.num_max) {  // one thread per selected expert
      const int e = s_expert[tid];
      uint64_t* flag = ll_flags(peer_recv[e / E_loc], p.flag_off) + (int64_t(e % E_loc) * R + p.rank) * p.num_max +
                       before[e];
      // release (system scope): the block's message stores, ordered before it by the barrier
      st_release_sys(flag, (uint64_t(tag) << 32) | uint32_t(t));
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) ll_dispatch_recv(const UCCL_GRID_CONSTANT LLDispatchRecvParams p) {
  __shared__ int s_count[kMaxRanks];
  __shared__ int s_begin[kMaxRanks + 1];
  __shared__ unsigned s_tag;
  const int e = blockIdx.x;
  const int R = int(p.num_ranks), tid = threadIdx.x;
  const int64_t rows_per_expert = int64_t(R) * p.num_max;
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const bool shrink = p.shrink != 0;
  const int64_t masked = block_mask_bits(p.mask, R);
  if (tid == 0) s_tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  __syncthreads();

  if (tid < R) {
    int n = 0;
    if (!is_masked(masked, tid)) {
      uint64_t waited = 0;
      const auto* sig = reinterpret_cast<const uint64_t*>(p.signal) + int64_t(e) * R + tid;
      int64_t got = wait_tagged_peer(sig, s_tag, uint64_t(p.timeout_ns), err, kPhaseLLDispatchRecv, int(p.rank), tid,
                                     int(p.rank * p.num_local_experts + e), &waited, p.mask, shrink);
      if (got > p.num_max) {  // more than a slab holds: never lay out (or copy) past it
        raise_error(err, kErrProtocol, kPhaseLLDispatchRecv, int(p.rank), tid, int(p.rank * p.num_local_experts + e), 0);
        got = -1;
      }
      n = got < 0 ? 0 : int(got);
      if (p.wait_stats != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + tid, (unsigned long long)waited);
    }
    s_count[tid] = n;
  }
  __syncthreads();
  lay_out_expert_rows(p, e, R, s_count, s_begin);

  const int total = s_begin[R];
  const auto* recv = reinterpret_cast<const uint8_t*>(p.recv_area);
  const uint64_t* flags = ll_flags(p.recv_area, p.flag_off);
  for (int row = warp_id(); row < total; row += num_warps()) {
    int j = 0;
    while (row >= s_begin[j + 1]) ++j;
    const int i = row - s_begin[j];
    uint64_t waited = 0;
    const int64_t got = wait_tagged_peer(flags + (int64_t(e) * R + j) * p.num_max + i, s_tag, uint64_t(p.timeout_ns),
                                         err, kPhaseLLDispatchRecv, int(p.rank), j,
                                         int(p.rank * p.num_local_experts + e), &waited, p.mask, shrink);
    if (p.wait_stats != 0 && lane_id() == 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + j, (unsigned long long)waited);
    if (got < 0) continue;  // timed out: the error word says so (shrink mode: the source is masked)
    if (got >= p.num_max) {  // a current tag with no valid token: never copy from a bad index
      if (lane_id() == 0)
        raise_error(err, kErrProtocol, kPhaseLLDispatchRecv, int(p.rank), j, int(p.rank * p.num_local_experts + e), 0);
      continue;
    }
    const int t = int(got);
    const uint8_t* msg = recv + (int64_t(j) * p.num_max + t) * p.msg_bytes;
    place_ll_row(p, e, row, rows_per_expert, t, msg);
  }
  wait_overlapped_grids();  // the send kernel is done (see arch.cuh) before this op can complete
  last_block_bumps_seq(reinterpret_cast<unsigned*>(p.done), reinterpret_cast<unsigned*>(p.seq));
}
