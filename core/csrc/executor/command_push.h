// Host executor, low-latency path (uccl_ep/host/ll.py): host threads push the per-token counted
// writes and the per-(destination, expert) fenced atomics of the host executor's LL protocol, whose
// counter values also carry the counts its masking logic needs (the CUDA proxy kernels pack one
// Write per (op, peer) instead), routed to FIFO (counter % num_fifos) so that a counter's writes
// and its fence share one FIFO (and thread).
#pragma once

#include <stdint.h>

#include <string>

#include "proxy/proxy.h"

namespace uccl_ep {
namespace executor {

struct CountedWrites {
  const int32_t* dst = nullptr;
  const int64_t* src_off = nullptr;
  const int64_t* dst_off = nullptr;
  const int32_t* counter = nullptr;
  uint64_t count = 0;
  uint32_t len = 0;  // bytes of every write
};

struct Atomics {
  const int32_t* dst = nullptr;
  const int32_t* counter = nullptr;
  const int32_t* value = nullptr;   // fenced: writes to wait for + 1 (protocol::fenced_signal_for_count)
  const uint8_t* fenced = nullptr;
  uint64_t count = 0;
};

// Pushes every write, then every atomic, on `threads` threads (FIFO f belongs to thread
// f % threads); returns after all are pushed (not completed). Throws EpError.
void push_counted(proxy::Proxy& proxy, const CountedWrites& writes, const Atomics& atomics, int threads,
                  double timeout_s);

// Waits until counters[src[i]][counter[i]] >= target[i] for every i (in order). Throws EpError.
void wait_counters(proxy::Proxy& proxy, const int32_t* src, const int32_t* counter, const int64_t* target,
                   uint64_t count, double timeout_s, const std::string& phase);

}  // namespace executor
}  // namespace uccl_ep
