// Pieces shared by the low-latency kernels of the proxy path (ll/proxy/dispatch.cu,
// ll/proxy/combine.cu): per (op, destination) a few large counted Writes and one signal pair on
// one receiver counter, the per-source round counters receivers derive their targets from, and
// the header of a packed dispatch region.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/shrink.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/dma_ring.h"
#include "uccl_ep/fifo_device.cuh"
#include "uccl_ep/kernel_abi.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep::dev {

// The copy-ring byte counter (ipc "kernel" copies, transport/copy_ring.cu) of the proxy thread that serves
// FIFO `fifo`, or nullptr when there are no copy rings (dma_pushed == 0).
UCCL_DEVICE unsigned long long* dma_counter(uint64_t dma_pushed, int64_t num_proxy_threads, int fifo) {
  return dma_pushed == 0 ? nullptr
                         : reinterpret_cast<unsigned long long*>(dma_pushed) + fifo % int(num_proxy_threads);
}

// Diagnostics: the GPU clock of a send kernel's pushes to FIFO `fifo`, in the consumer state of the
// copy ring that serves it (DmaConsumer::push_ns; the copy kernel measures push -> descriptor seen
// from it). No-op without copy rings.
UCCL_DEVICE void stamp_dma_push(uint64_t dma_pushed, int64_t num_proxy_threads, int fifo) {
  if (dma_pushed == 0) return;
  auto* state = reinterpret_cast<DmaConsumer*>(dma_pushed + 8 * uint64_t(num_proxy_threads));  // ll_proxy.py layout
  *reinterpret_cast<volatile unsigned long long*>(&state[fifo % int(num_proxy_threads)].push_ns) = clock_ns();
}

// The end of an op towards dst after n counted Writes on `counter`: a fenced Atomic n + 1 (the
// receiving proxy applies it once the n writes landed) and a plain Atomic signal_total - n - 1, so
// the counter grows by exactly signal_total per op whatever n was. The counter reaches the op's
// target only once both arrived, in either order (the padding alone stays below it because
// n + 1 >= 1), which keeps the scheme correct over transports that reorder immediates.
// Writes the commands to out[0, 2) and returns how many (1 or 2).
UCCL_DEVICE int op_signal_commands(int dst, uint32_t counter, int n, int signal_total, TransferCmd* out) {
  const int32_t fenced = protocol::fenced_signal_for_count(uint32_t(n));
  out[0] = protocol::make_atomic(uint32_t(dst), counter, fenced, true);
  const int32_t pad = int32_t(signal_total) - fenced;
  if (pad <= 0) return 1;
  out[1] = protocol::make_atomic(uint32_t(dst), counter, pad, false);
  return 2;
}

// The signal pair of an op after n Writes pushed by the caller (op_signal_commands).
UCCL_DEVICE bool push_op_signal(const FifoLayout& f, int dst, uint32_t counter, int n, int signal_total,
                                uint64_t timeout_ns, ErrorWord* err, const PushSite& site) {
  TransferCmd cmds[2];
  return fifo_push_batch(f, cmds, op_signal_commands(dst, counter, n, signal_total, cmds), timeout_ns, err, site);
}

// Commands towards dst for the bytes [src_off, +len) to dst's [dst_off, +len): counted Writes of at
// most `chunk` bytes on `counter` (a zero-length one when len is 0 and min_writes is 1), then the
// fenced Atomic, and a plain Atomic padding the counter's growth to `budget` when that is above the
// fenced value; pushed in batches of up to kOpBatch commands (fifo_push_batch: one reservation per
// batch; the system fence with the first batch when `fence`). `dma` (may be null) counts the bytes
// for the copy kernel. Returns the fenced value pushed (writes + 1), or -1 (error word filled).
constexpr int kOpBatch = 8;
UCCL_DEVICE int push_op(const FifoLayout& f, int dst, uint64_t src_off, uint64_t dst_off, uint64_t len, uint64_t chunk,
                        int min_writes, uint32_t counter, int budget, bool fence, uint64_t timeout_ns, ErrorWord* err,
                        const PushSite& site, unsigned long long* dma) {
  TransferCmd batch[kOpBatch];
  int queued = 0, writes = 0;
  uint64_t bytes = 0;
  auto flush = [&]() {
    const bool ok = fifo_push_batch(f, batch, queued, timeout_ns, err, site, fence);
    if (ok && dma != nullptr && bytes > 0) atomicAdd(dma, (unsigned long long)bytes);
    fence = false;  // one fence orders everything the caller stored before any of the batches
    queued = 0;
    bytes = 0;
    return ok;
  };
  for (uint64_t at = 0; at < len || writes < min_writes; at += chunk) {
    const uint64_t part = len - at < chunk ? len - at : chunk;
    if (queued == kOpBatch && !flush()) return -1;
    batch[queued++] = protocol::make_counted_write(uint32_t(dst), src_off + at, dst_off + at, uint32_t(part), counter);
    bytes += part;
    ++writes;
    if (at + part >= len) break;
  }
  if (queued > kOpBatch - 2 && !flush()) return -1;  // room for the signal pair
  queued += op_signal_commands(dst, counter, writes, budget, batch + queued);
  return flush() ? protocol::fenced_signal_for_count(uint32_t(writes)) : -1;
}

// Where an op's commands go: the FIFO table, its size, the first FIFO (fifo_for of the destination),
// the copy rings' byte counters (dma_counter; 0 without copy rings) and whether the pushes need a
// system fence first (push_fence of the params).
// NOTES: the fence makes the staged bytes visible to whatever reads them once the proxy saw the
// command: a NIC (fabric) or a copy engine the proxy drives (ipc, UCCL_EP_IPC_COPY=cuda), both of
// which may read while this kernel still runs. The ipc copy kernel (transport/copy_ring.cu) reads them only
// after this kernel completed (stream order, or griddepcontrol.wait when overlapped), which orders
// every store of this grid before its reads; the proxy only translates the command. Without the
// fence the command is merely posted later than the stores, which nothing relies on there.
struct OpRoute {
  const FifoLayout* fifos;
  int num_fifos;
  int first_fifo;
  uint64_t dma_pushed;
  int64_t num_proxy_threads;
  bool fence = true;  // a route that does not say is fenced (the safe side)
};

// EXPERIMENT (Tuning.ll_proxy_parts, compile-time UCCL_EP_LL_PARTS; 1 = off): a region of 256 KiB or
// more per part goes out in up to that many parts, part k on FIFO first_fifo + k (proxy thread
// (first_fifo + k) % threads: distinct threads, so distinct copy rings and receiving threads), each
// part closed by its own fenced Atomic (a receiving proxy thread counts only the Writes that reached
// it), the last one padding the counter's growth to signal_total. One system fence for all.
#ifndef UCCL_EP_LL_PARTS
#define UCCL_EP_LL_PARTS 1
#endif
constexpr uint64_t kMinPartBytes = uint64_t(256) << 10;

// One op's commands towards dst (see push_op; the caller needs no fence of its own: r.fence), then the push
// stamps for the copy kernel's diagnostics. False: the error word is filled.
UCCL_DEVICE bool push_region(const OpRoute& r, int dst, uint64_t src_off, uint64_t dst_off, uint64_t len,
                             uint64_t chunk, int min_writes, uint32_t counter, int signal_total, uint64_t timeout_ns,
                             ErrorWord* err, const PushSite& site) {
  // at most one part per proxy thread and per kMinPartBytes, at least one
  uint64_t parts = uint64_t(UCCL_EP_LL_PARTS);
  if (parts > uint64_t(r.num_proxy_threads)) parts = uint64_t(r.num_proxy_threads);
  if (parts > len / kMinPartBytes) parts = len / kMinPartBytes;
  if (parts == 0) parts = 1;
  const uint64_t per = ((len + parts - 1) / parts + 15) & ~uint64_t(15);
  int added = 0;
  for (int k = 0; k < int(parts); ++k) {
    const int fifo = (r.first_fifo + k) % r.num_fifos;
    const uint64_t at = uint64_t(k) * per;
    const uint64_t n = k == int(parts) - 1 ? len - at : per;
    const int fenced = push_op(r.fifos[fifo], dst, src_off + at, dst_off + at, n, chunk, k == 0 ? min_writes : 1,
                               counter, k == int(parts) - 1 ? signal_total - added : 0, k == 0 && r.fence, timeout_ns,
                               err, site,
                               dma_counter(r.dma_pushed, r.num_proxy_threads, fifo));
    if (fenced < 0) return false;
    added += fenced;
    stamp_dma_push(r.dma_pushed, r.num_proxy_threads, fifo);
  }
  return true;
}

// The rank's own region is complete (kernel_abi.h): the caller's stores, and those ordered before
// them, before the receive kernel's device counter for this rank moves (release, gpu scope).
UCCL_DEVICE void signal_own_region(uint64_t self_counter, int64_t signal_total) {
  __threadfence();
  atomicAdd(reinterpret_cast<unsigned long long*>(self_counter), (unsigned long long)signal_total);
}

// Target of source j's receiver counter on this set and phase: every op adds signal_total.
UCCL_DEVICE int64_t round_target(const int64_t* rounds, int j, int64_t signal_total) {
  return signal_total * (rounds[j] + 1);
}

// Address of receiver counter `c` of source `src`.
UCCL_DEVICE const int64_t* counter_of(uint64_t counters, int64_t num_counters, int src, int64_t c) {
  return reinterpret_cast<const int64_t*>(counters) + int64_t(src) * num_counters + c;
}

// Called by every block at its very end: the last block to finish counts one more round for
// every source not masked now (they all sent one signal per counter; a source masked during this op
// -- shrink mode -- is left behind with its counter) and resets `done`. Contains __syncthreads.
UCCL_DEVICE void last_block_bumps_rounds(unsigned* done, int64_t* rounds, int num_ranks, uint64_t mask) {
  __shared__ bool s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    s_last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  for (int j = threadIdx.x; j < num_ranks; j += blockDim.x)
    if (!rank_masked(mask, j)) rounds[j] += 1;
  if (threadIdx.x == 0) *done = 0u;
  __threadfence();
}

// ---- hybrid: the peers of this rank's node over NVLink ------------------------------------------
// With nodes of several ranks (ranks_per_node below the group size; not with the proxy forced), a
// peer of the rank's own node is reached over NVLink and the others through the proxy, as DeepEP,
// UCCL-EP and pplx-garden do. An NVLink peer d gets the same packed region as a proxy peer, but
// stored by the send kernel straight into d's recv area (region [this rank], peer_ll[d]: d's LL
// buffer mapped here), and instead of the Writes and signal pair one system-scope release add of
// signal_total to d's NVLink signal word of this rank (device memory in d's LL buffer, after both
// buffer sets; nvl_signal_off). The receive kernels read one format and wait for one target,
// signal_total * (rounds[src] + 1), on the source's NVLink word or its proxy counter.
UCCL_DEVICE bool is_nvl_peer(uint64_t nvl_peers, int r) { return ((nvl_peers >> r) & 1u) != 0; }

// Where this rank builds its region for rank d: in d's recv area when d is an NVLink peer, else in
// its own send area (pushed by the proxy, or read in place when d is this rank).
UCCL_DEVICE uint8_t* region_for(uint64_t send_area, int64_t region_bytes, uint64_t peer_ll, uint64_t nvl_peers,
                                int64_t recv_off, int64_t rank, int d) {
  if (is_nvl_peer(nvl_peers, d))
    return reinterpret_cast<uint8_t*>(reinterpret_cast<const uint64_t*>(peer_ll)[d] + uint64_t(recv_off) +
                                      uint64_t(rank * region_bytes));
  return reinterpret_cast<uint8_t*>(send_area) + int64_t(d) * region_bytes;
}

// A stager's share of NVLink peer d's region is stored (ordered before this by the caller's barrier):
// release it at system scope before the gpu-scope count the last stager acquires, so every share has
// reached d before d's signal moves; a proxy or own region needs the gpu-scope fence only.
UCCL_DEVICE void fence_stage(uint64_t nvl_peers, int d) {
  if (is_nvl_peer(nvl_peers, d))
    fence_release_sys();
  else
    __threadfence();
}

// NVLink peer d's region from this rank is complete (every stager's share observed by the caller):
// d's signal word of this rank grows by signal_total, a release at system scope.
UCCL_DEVICE void signal_nvl_peer(uint64_t peer_ll, int d, int64_t nvl_signal_off, int64_t rank, int64_t signal_total) {
  auto* word = reinterpret_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(peer_ll)[d] + uint64_t(nvl_signal_off) +
                                           8 * uint64_t(rank));
  add_release_sys(word, uint64_t(signal_total));
}

// A receive kernel's bounded wait until NVLink source j's signal word (this rank's device memory)
// reaches `target`, with shrink mode as in wait_counter_shared_peer. Returns the value, or -1.
UCCL_DEVICE int64_t wait_nvl_signal_peer(const uint64_t* word, int64_t target, uint64_t timeout_ns, ErrorWord* err,
                                         int phase, int rank, int peer, int expert, uint64_t* waited, uint64_t mask,
                                         bool shrink) {
  // the acquire loads pair with the sender's add_release_sys
  return wait_peer_word(
      word, [target](uint64_t v) { return int64_t(v) >= target; }, [](uint64_t v) { return int64_t(v); }, timeout_ns,
      err, phase, rank, peer, expert, waited, mask, shrink);
}

// The wait of a receive kernel on source j's op signal: j's NVLink word, or its proxy counter through
// the shared reader (wait_counter_shared_peer; the rank's own moves in counter_cache[rank]).
UCCL_DEVICE int64_t wait_source_signal(uint64_t nvl_peers, uint64_t nvl_signal, uint64_t counters, int64_t num_counters,
                                       int64_t counter, uint64_t counter_cache, uint64_t counter_lock, int j,
                                       int64_t target, const uint64_t* status, uint64_t timeout_ns, ErrorWord* err,
                                       int phase, int rank, int expert, uint64_t* waited, uint64_t mask, bool shrink) {
  if (is_nvl_peer(nvl_peers, j))
    return wait_nvl_signal_peer(reinterpret_cast<const uint64_t*>(nvl_signal) + j, target, timeout_ns, err, phase,
                                rank, j, expert, waited, mask, shrink);
  return wait_counter_shared_peer(counter_of(counters, num_counters, j, counter),
                                  reinterpret_cast<uint64_t*>(counter_cache) + j, reinterpret_cast<int*>(counter_lock) + j,
                                  target, status, timeout_ns, err, phase, rank, j, expert, waited, mask, shrink);
}

// Header of a packed dispatch region: {slots, magic, 0, 0}.
UCCL_DEVICE void store_region_header(uint8_t* region, int slots) {
  Vec16 h = {{uint32_t(slots), kLLProxyBlockMagic, 0u, 0u}};
  st16(region, h);
}

// Slots of a received region, or -1 when its header is not a dispatch header of <= max_slots.
UCCL_DEVICE int load_region_slots(const uint8_t* region, int64_t max_slots) {
  const Vec16 h = ld16_cg(region);
  if (h.w[1] != kLLProxyBlockMagic || int64_t(h.w[0]) > max_slots) return -1;
  return int(h.w[0]);
}

}  // namespace uccl_ep::dev
