// Per-warp progress counters of the HT rings (ht/nvlink/dispatch.cu / ht/nvlink/combine.cu).
//
// A ring direction (channel c, rank i -> rank j) has several producer warps and several consumer
// warps; each warp owns one u64 counter that it publishes with a system-scope release:
// "every position below this value that belongs to me is done". Counters are cumulative over
// all ops and only grow, so the minimum over a side's counters is a position below which the
// whole side is done, and a stale read is always conservative.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/wait.cuh"

namespace uccl_ep::dev {

UCCL_DEVICE uint64_t shfl_xor_u64(uint64_t v, int mask) {
  uint32_t lo = uint32_t(v), hi = uint32_t(v >> 32);
  lo = uint32_t(shfl_xor(int(lo), mask));
  hi = uint32_t(shfl_xor(int(hi), mask));
  return (uint64_t(hi) << 32) | lo;
}

// min over counters[0, n) (n <= warp size), the same value in every lane.
UCCL_DEVICE uint64_t warp_min_counter(const uint64_t* counters, int n) {
  uint64_t v = lane_id() < n ? ld_acquire_sys(counters + lane_id()) : ~uint64_t(0);
  for (int m = kWarpSize / 2; m >= 1; m >>= 1) {
    uint64_t o = shfl_xor_u64(v, m);
    v = o < v ? o : v;
  }
  return v;
}

// Wait (whole warp) until min(counters[0, n)) > target; returns the min, or 0 after a timeout or
// another block's error (the error word is filled).
UCCL_DEVICE uint64_t warp_wait_above(const uint64_t* counters, int n, uint64_t target, uint64_t timeout_ns,
                                     ErrorWord* err, int phase, int rank, int peer, int channel) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    uint64_t m = warp_min_counter(counters, n);
    if (m > target) return m;
    if (spins == 0) start = clock_ns();
    if ((spins & 255u) == 255u) {
      int give_up = 0;
      if (lane_id() == 0) {
        uint64_t now = clock_ns();
        if (now - start > timeout_ns) {
          raise_error(err, kErrTimeout, phase, rank, peer, channel, now - start);
          give_up = 1;
        } else if (error_raised(err)) {
          give_up = 1;
        }
      }
      if (shfl_idx(give_up, 0)) return 0;
    }
  }
}

// Counter of warp w for (channel c, peer) in the counter array at `offset` of an NVL buffer.
UCCL_DEVICE uint64_t* counter(uint64_t buf, uint64_t offset, int c, int R, int peer, int w) {
  return reinterpret_cast<uint64_t*>(buf + offset) + (int64_t(c) * R + peer) * kHTMaxWarps + w;
}

// Publish a counter after this warp's stores (all lanes) are done.
UCCL_DEVICE void warp_publish(uint64_t* counter, uint64_t value) {
  sync_warp();
  if (lane_id() == 0) st_release_sys(counter, value);
  sync_warp();
}

// Publish a consumer counter whose freed positions this warp only *read*: every load of them fed a
// value this warp already used, so no fence is needed before the store (a release would drain the
// warp's outstanding output stores first, which the producer does not depend on).
UCCL_DEVICE void warp_publish_consumed(uint64_t* counter, uint64_t value) {
  sync_warp();
  if (lane_id() == 0) st_relaxed_sys(counter, value);
  sync_warp();
}

}  // namespace uccl_ep::dev
