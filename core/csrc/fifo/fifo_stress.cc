#include "fifo/fifo_stress.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "fifo/backoff.h"
#include "fifo/fifo_host.h"

namespace uccl_ep {
namespace fifo {

namespace {

// Payload: word0 = producer id (16 bits) | sequence (40 bits) << 16; word1 = a checksum of word0
// in the low 62 bits (bit 63 is the commit bit, bit 62 reserved). Zero-valued commands occur (producer 0, seq 0).
uint64_t checksum(uint64_t w0) {
  uint64_t h = w0 * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return (h * 0xBF58476D1CE4E5B9ull) & ((uint64_t(1) << 62) - 1);
}

}  // namespace

StressResult run_stress(uint32_t capacity, int producers, uint64_t per_producer, double timeout_s,
                        long slow_consumer_ns) {
  HostFifo fifo(capacity);
  StressResult r;
  std::atomic<uint64_t> pushed{0}, timeouts{0};
  std::atomic<bool> go{false};
  const uint64_t total = uint64_t(producers) * per_producer;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      // acquire: pairs with the release of `go`; the FIFO is fully built before anyone pushes.
      while (!go.load(std::memory_order_acquire)) cpu_relax();
      for (uint64_t i = 0; i < per_producer; ++i) {
        const uint64_t w0 = uint64_t(p) | (i << 16);
        protocol::TransferCmd c{w0, checksum(w0)};
        // relaxed (both counters): totals read after join().
        if (fifo.push(c, timeout_s, nullptr) == PushStatus::kOk) {
          pushed.fetch_add(1, std::memory_order_relaxed);
        } else {
          timeouts.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      }
    });
  }
  std::vector<uint64_t> next(size_t(producers), 0);
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);  // release: see the producers' acquire
  Backoff backoff(timeout_s);
  protocol::TransferCmd c;
  while (r.consumed < total) {
    if (!fifo.peek(&c)) {
      if (backoff.expired() || timeouts.load() > 0) break;
      backoff.pause();
      continue;
    }
    backoff.reset();
    const uint64_t p = c.word0 & 0xFFFF, seq = c.word0 >> 16;
    if (c.word1 != checksum(c.word0) || p >= uint64_t(producers)) {
      ++r.corrupt;
    } else {
      if (seq != next[p]) ++r.out_of_order;
      next[p] = seq + 1;
    }
    fifo.pop();
    ++r.consumed;
    fifo.publish_completed(fifo.consumer_index());
    if (slow_consumer_ns > 0) {
      timespec ts{0, slow_consumer_ns};
      nanosleep(&ts, nullptr);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fifo.set_status(kStatusStopped);
  for (auto& t : threads) t.join();
  r.pushed = pushed.load();
  r.timeouts = timeouts.load();
  return r;
}

}  // namespace fifo
}  // namespace uccl_ep
