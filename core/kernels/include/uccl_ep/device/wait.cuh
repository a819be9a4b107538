// Bounded device waits. A wait that outlives its budget records who waited for whom in the
// error word (pinned host memory mapped for the device) and gives up; the host turns the word
// into uccl_ep.errors.Timeout(rank, peer, phase, ...). A trap is never the outcome.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/kernel_abi.h"

namespace uccl_ep::dev {

// True once any block of any kernel of this buffer has recorded an error (so the others stop
// waiting too). Reads mapped host memory: call it only on the slow path.
UCCL_DEVICE bool error_raised(const ErrorWord* err) { return ld_volatile(&err->code) != 0; }

UCCL_DEVICE void raise_error(ErrorWord* err, int code, int phase, int rank, int peer, int expert, uint64_t waited_ns) {
  if (atomicCAS(&err->code, 0, -1) == 0) {
    err->phase = phase;
    err->rank = rank;
    err->peer = peer;
    err->expert = expert;
    err->waited_us = int(waited_ns / 1000ull);
    fence_system();
    st_release_sys(&err->code, code);
  }
}

// Spin until the tag in the high 32 bits of *signal equals `tag`; returns the low 32 bits, or -1
// after `timeout_ns` (error recorded) or when another wait already failed. `waited` gets the ns.
UCCL_DEVICE int64_t wait_tagged(const uint64_t* signal, uint32_t tag, uint64_t timeout_ns, ErrorWord* err, int phase,
                                int rank, int peer, int expert, uint64_t* waited) {
  uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    uint64_t v = ld_acquire_sys(signal);
    if (uint32_t(v >> 32) == tag) {
      if (waited != nullptr) *waited = clock_ns() - start;
      return int64_t(v & 0xffffffffu);
    }
    if ((spins & 1023u) == 1023u) {
      uint64_t now = clock_ns();
      if (now - start > timeout_ns) {
        raise_error(err, kErrTimeout, phase, rank, peer, expert, now - start);
        return -1;
      }
      if (error_raised(err)) return -1;
    }
  }
}

// Spin until the tag in the high 32 bits of *signal is >= `tag` (serial arithmetic); 0 or -1.
UCCL_DEVICE int wait_tagged_at_least(const uint64_t* signal, uint32_t tag, uint64_t timeout_ns, ErrorWord* err,
                                     int phase, int rank, int peer) {
  uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    if (int32_t(uint32_t(ld_acquire_sys(signal) >> 32) - tag) >= 0) return 0;
    if ((spins & 1023u) == 1023u) {
      uint64_t now = clock_ns();
      if (now - start > timeout_ns) {
        raise_error(err, kErrTimeout, phase, rank, peer, -1, now - start);
        return -1;
      }
      if (error_raised(err)) return -1;
    }
  }
}

// One thread: spin until *p >= target (plain u64 compare); false after `timeout_ns` (error
// recorded with `chunk` as the expert/channel field) or once another wait failed.
UCCL_DEVICE bool wait_u64_at_least(const uint64_t* p, uint64_t target, uint64_t timeout_ns, ErrorWord* err, int phase,
                                   int rank, int peer, int chunk) {
  const uint64_t start = clock_ns();
  for (uint32_t spins = 0; ld_acquire_sys(p) < target; ++spins) {
    if ((spins & 255u) == 255u) {
      const uint64_t now = clock_ns();
      if (now - start > timeout_ns) {
        raise_error(err, kErrTimeout, phase, rank, peer, chunk, now - start);
        return false;
      }
      if (error_raised(err)) return false;
    }
  }
  return true;
}

}  // namespace uccl_ep::dev
