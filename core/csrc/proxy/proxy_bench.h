// Load generators for `uccl-ep bench fifo|transport` and the stress tests: host threads that push
// TransferCmds into a running Proxy exactly as kernels would, then wait until all completed.
#pragma once

#include <stdint.h>

#include "proxy/proxy.h"

namespace uccl_ep {
namespace proxy {

struct LoadSpec {
  int producers = 1;           // host threads; producer i pushes into FIFO i % num_fifos
  uint64_t per_producer = 0;   // commands each
  int dst = 0;                 // destination rank (-1: round-robin over every rank)
  uint32_t write_bytes = 0;    // 0: unfenced atomics (+1); else counted writes of this size
  uint64_t src_off = 0;        // writes read [src_off, +write_bytes) of the region
  uint64_t dst_off = 0;        // ... and land at [dst_off + k*write_bytes) (k cycling over `slots`)
  uint32_t slots = 1;
  bool fence = false;          // writes: end every FIFO's stream with a fenced atomic (count)
  double timeout_s = 60.0;
};

struct LoadResult {
  uint64_t commands = 0;  // commands pushed (writes + atomics)
  double seconds = 0.0;   // first push to the last local completion
};

// Counter used by FIFO f: f % num_counters. Throws EpError on proxy errors and timeouts.
LoadResult run_load(Proxy& proxy, const LoadSpec& spec);

}  // namespace proxy
}  // namespace uccl_ep
