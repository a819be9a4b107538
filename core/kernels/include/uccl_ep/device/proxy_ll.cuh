// Pieces shared by the low-latency kernels of the proxy path (ll_dispatch_proxy.cu,
// ll_combine_proxy.cu): one Write + fenced Atomic per (destination, expert), the per-source
// round counters receivers derive their targets from, and the dispatch block header.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/fifo_device.cuh"
#include "uccl_ep/kernel_abi.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep::dev {

// The fenced Atomic of a (destination, expert): "1 write, then add 2" (protocol.h: n + 1).
constexpr int32_t kLLProxySignal = protocol::fenced_signal_for_count(1);

// Pushes Write{dst, src_off, dst_off, len, counter} and its fenced Atomic into FIFO
// fifo_for(key). The caller fenced after everything the write carries was stored (by any thread).
UCCL_DEVICE bool push_write_and_signal(const FifoLayout* fifos, int num_fifos, int key, int dst, uint64_t src_off,
                                       uint64_t dst_off, uint32_t len, uint32_t counter, uint64_t timeout_ns,
                                       ErrorWord* err, const PushSite& site) {
  const FifoLayout& f = fifos[fifo_for(key, num_fifos)];
  if (!fifo_push(f, protocol::make_counted_write(uint32_t(dst), src_off, dst_off, len, counter), timeout_ns, err, site))
    return false;
  return fifo_push(f, protocol::make_atomic(uint32_t(dst), counter, kLLProxySignal, true), timeout_ns, err, site);
}

// Target of a receiver counter of source j on this set and phase: every op adds kLLProxySignal.
UCCL_DEVICE int64_t round_target(const int64_t* rounds, int j) { return int64_t(kLLProxySignal) * (rounds[j] + 1); }

// Address of receiver counter `c` of source `src`.
UCCL_DEVICE const int64_t* counter_of(uint64_t counters, int64_t num_counters, int src, int64_t c) {
  return reinterpret_cast<const int64_t*>(counters) + int64_t(src) * num_counters + c;
}

// Called by every block at its very end: the last block to finish counts one more round for
// every source it did not mask (they all sent one signal per counter) and resets `done`.
// Contains __syncthreads.
UCCL_DEVICE void last_block_bumps_rounds(unsigned* done, int64_t* rounds, int num_ranks, int64_t masked) {
  __shared__ bool s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    s_last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  for (int j = threadIdx.x; j < num_ranks; j += blockDim.x)
    if (!is_masked(masked, j)) rounds[j] += 1;
  if (threadIdx.x == 0) *done = 0u;
  __threadfence();
}

// Dispatch block header: {count, magic, 0, 0}.
UCCL_DEVICE void store_block_header(uint8_t* block, int count) {
  Vec16 h = {{uint32_t(count), kLLProxyBlockMagic, 0u, 0u}};
  st16(block, h);
}

// Count of a received block, or -1 when its header is not a dispatch header of <= num_max slots.
UCCL_DEVICE int load_block_count(const uint8_t* block, int64_t num_max) {
  const Vec16 h = ld16_cg(block);
  if (h.w[1] != kLLProxyBlockMagic || int64_t(h.w[0]) > num_max) return -1;
  return int(h.w[0]);
}

}  // namespace uccl_ep::dev
