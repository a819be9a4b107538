// Receiver semantics of one proxy thread: turns the immediates of Counted / Ordered / Atomic
// writes (kernels/include/uccl_ep/immediate.h) into counter updates, whatever order they arrive in.
//
//   Counted (LL data)   count[src][c] += 1; may release a held fenced atomic of (src, c)
//   Ordered (HT data)   applied strictly in the sender's order: counters[src][c] += increment for
//                       sequence numbers expected, expected+1, ...; early arrivals wait in a
//                       reorder buffer (at most kMaxOrderedInFlight ahead)
//   Atomic, unfenced    counters[src][c] += value at once
//   Atomic, fenced      held until count[src][c] >= value - 1; then that count is consumed and
//                       counters[src][c] += value (the LL "n tokens arrived" signal is n + 1)
//
// Thread-private (no locks): a sender routes every write and atomic of one (dst, counter) through
// one FIFO, hence one proxy thread, hence this thread's Receiver at the destination.
#pragma once

#include <stdint.h>

#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace uccl_ep {
namespace proxy {

class Receiver {
 public:
  // counters: int64 [num_ranks][num_counters], shared with waiters (updated with release).
  Receiver(int num_ranks, uint32_t num_counters, int64_t* counters);

  // Applies one data/atomic immediate from `src`. Returns "" or why it breaks the protocol.
  std::string on_imm(int src, uint32_t imm);

 private:
  struct Stream {
    uint32_t expected = 0;                 // next sequence number to apply
    std::map<uint32_t, uint32_t> early;    // seq -> increment, arrived ahead of `expected`
  };

  void add(int src, uint32_t counter, int64_t value);
  void release_fenced(int src, uint32_t counter);
  size_t key(int src, uint32_t counter) const { return size_t(src) * num_counters_ + counter; }

  int num_ranks_;
  uint32_t num_counters_;
  int64_t* counters_;
  std::vector<uint32_t> counted_;                               // writes not yet consumed by a fence
  std::unordered_map<size_t, std::deque<int32_t>> fenced_;      // held fenced atomics (values)
  std::unordered_map<size_t, Stream> streams_;                  // ordered counters
};

}  // namespace proxy
}  // namespace uccl_ep
