#include "proxy/receiver.h"

#include <stdio.h>

#include "uccl_ep/immediate.h"

namespace uccl_ep {
namespace proxy {

Receiver::Receiver(int num_ranks, uint32_t num_counters, int64_t* counters)
    : num_ranks_(num_ranks), num_counters_(num_counters), counters_(counters),
      counted_(size_t(num_ranks) * num_counters, 0) {}

void Receiver::add(int src, uint32_t counter, int64_t value) {
  // release: the payload bytes of every write this update accounts for were placed before their
  // completions reached us; a waiter that acquires the counter sees them.
  __atomic_fetch_add(&counters_[key(src, counter)], value, __ATOMIC_RELEASE);
}

void Receiver::release_fenced(int src, uint32_t counter) {
  auto it = fenced_.find(key(src, counter));
  if (it == fenced_.end()) return;
  uint32_t& have = counted_[key(src, counter)];
  std::deque<int32_t>& q = it->second;
  while (!q.empty() && have >= uint32_t(q.front() - 1)) {
    have -= uint32_t(q.front() - 1);
    add(src, counter, q.front());
    q.pop_front();
  }
  if (q.empty()) fenced_.erase(it);
}

std::string Receiver::on_imm(int src, uint32_t v) {
  if (src < 0 || src >= num_ranks_) return "immediate from unknown rank " + std::to_string(src);
  if (!imm::well_formed(v)) {
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", v);
    return std::string("malformed immediate 0x") + hex;
  }
  const uint32_t c = imm::counter(v);
  if (c >= num_counters_)
    return "counter " + std::to_string(c) + " out of range (this buffer has " + std::to_string(num_counters_) + ")";
  switch (imm::kind(v)) {
    case imm::kCounted:
      ++counted_[key(src, c)];
      release_fenced(src, c);
      return "";
    case imm::kOrdered: {
      Stream& s = streams_[key(src, c)];
      const uint32_t seq = imm::seq(v);
      const int32_t ahead = imm::seq_distance(seq, s.expected);
      if (ahead < 0 || ahead >= int32_t(imm::limits::kMaxOrderedInFlight))
        return "ordered write with sequence " + std::to_string(seq) + " for counter " + std::to_string(c) +
               " while expecting " + std::to_string(s.expected) + " (duplicate, or more than " +
               std::to_string(imm::limits::kMaxOrderedInFlight) + " in flight)";
      if (ahead > 0) {
        if (!s.early.emplace(seq, imm::increment(v)).second)
          return "duplicate ordered write with sequence " + std::to_string(seq) + " for counter " + std::to_string(c);
        return "";
      }
      int64_t total = imm::increment(v);
      s.expected = (s.expected + 1) % imm::limits::kSeqModulus;
      for (auto it = s.early.find(s.expected); it != s.early.end(); it = s.early.find(s.expected)) {
        total += it->second;
        s.early.erase(it);
        s.expected = (s.expected + 1) % imm::limits::kSeqModulus;
      }
      // NOTES: one release add for the whole in-order run: the waiter never sees a tail that
      // covers a slot whose write has not landed.
      add(src, c, total);
      return "";
    }
    case imm::kAtomic: {
      const int32_t value = imm::value(v);
      if (!imm::fenced(v)) {
        add(src, c, value);
        return "";
      }
      if (value < 1) return "fenced atomic with value " + std::to_string(value) + " (must be count + 1 >= 1)";
      fenced_[key(src, c)].push_back(value);
      release_fenced(src, c);
      return "";
    }
    default:
      return "control immediate routed to the data receiver";
  }
}

}  // namespace proxy
}  // namespace uccl_ep
