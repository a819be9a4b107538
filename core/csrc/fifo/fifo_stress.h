// Multi-producer stress / throughput run of one HostFifo with a consumer thread that checks
// every command: used by tests (checksums, per-producer order) and `uccl-ep bench fifo`.
#pragma once

#include <stdint.h>

namespace uccl_ep {
namespace fifo {

struct StressResult {
  uint64_t pushed = 0;        // commands producers committed
  uint64_t consumed = 0;      // commands the consumer popped
  uint64_t out_of_order = 0;  // a producer's commands seen out of its push order
  uint64_t corrupt = 0;       // commands whose payload checksum did not match
  uint64_t timeouts = 0;      // pushes that gave up (ring stayed full)
  double seconds = 0.0;       // first push to last pop
};

// `producers` threads each push `per_producer` commands into a FIFO of `capacity` slots; one
// consumer pops them (optionally marking completion every `complete_every` pops) until all are
// seen or `timeout_s` passes. `slow_consumer_ns` > 0 sleeps per pop to force full-ring waits.
StressResult run_stress(uint32_t capacity, int producers, uint64_t per_producer, double timeout_s,
                        long slow_consumer_ns = 0);

}  // namespace fifo
}  // namespace uccl_ep
