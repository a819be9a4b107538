#include "proxy/proxy_bench.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "fifo/backoff.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace proxy {

LoadResult run_load(Proxy& proxy, const LoadSpec& spec) {
  const ProxyConfig& cfg = proxy.config();
  const int num_fifos = proxy.num_fifos();
  std::vector<uint64_t> last(size_t(num_fifos), 0);
  std::vector<bool> used(size_t(num_fifos), false);
  std::mutex mu;
  std::exception_ptr error;
  std::atomic<uint64_t> pushed{0};
  std::atomic<bool> go{false};
  // Writes per (FIFO, destination), for the fenced atomics that close each stream.
  std::vector<std::vector<uint64_t>> writes(size_t(num_fifos), std::vector<uint64_t>(size_t(cfg.num_ranks), 0));
  std::vector<std::thread> threads;
  for (int p = 0; p < spec.producers; ++p) {
    threads.emplace_back([&, p] {
      const int f = p % num_fifos;
      const uint32_t counter = uint32_t(f) % cfg.num_counters;
      std::vector<uint64_t> mine(size_t(cfg.num_ranks), 0);
      uint64_t idx = 0;
      // acquire: pairs with the release of `go` below; every producer starts together.
      while (!go.load(std::memory_order_acquire)) cpu_relax();
      try {
        for (uint64_t i = 0; i < spec.per_producer; ++i) {
          const int dst = spec.dst >= 0 ? spec.dst : int((uint64_t(p) + i) % uint64_t(cfg.num_ranks));
          protocol::TransferCmd c;
          if (spec.write_bytes == 0) {
            c = protocol::make_atomic(uint32_t(dst), counter, 1, false);
          } else {
            const uint64_t slot = (uint64_t(p) * spec.per_producer + i) % spec.slots;
            c = protocol::make_counted_write(uint32_t(dst), spec.src_off, spec.dst_off + slot * spec.write_bytes,
                                             spec.write_bytes, counter);
            ++mine[size_t(dst)];
          }
          idx = proxy.push(f, c, spec.timeout_s);
          pushed.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join()
        }
        std::lock_guard<std::mutex> lock(mu);
        for (int d = 0; d < cfg.num_ranks; ++d) writes[size_t(f)][size_t(d)] += mine[size_t(d)];
        if (!used[size_t(f)] || idx > last[size_t(f)]) last[size_t(f)] = idx;
        used[size_t(f)] = true;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);  // release: see the producers' acquire
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  LoadResult r;
  r.commands = pushed.load();
  for (int f = 0; f < num_fifos; ++f) {
    if (!used[size_t(f)]) continue;
    uint64_t idx = last[size_t(f)];
    if (spec.fence && spec.write_bytes > 0) {
      for (int d = 0; d < cfg.num_ranks; ++d) {
        const uint64_t n = writes[size_t(f)][size_t(d)];
        if (n == 0) continue;
        if (n > protocol::limits::kMaxFencedCount)
          throw_error(ErrorKind::kInvalidArgument, cfg.rank, d, "load", "per_producer: more writes per FIFO and destination (" +
                      std::to_string(n) + ") than one fenced atomic counts (" +
                      std::to_string(protocol::limits::kMaxFencedCount) + ")");
        idx = proxy.push(f, protocol::make_atomic(uint32_t(d), uint32_t(f) % cfg.num_counters,
                                                  protocol::fenced_signal_for_count(uint32_t(n)), true),
                         spec.timeout_s);
        ++r.commands;
      }
    }
    proxy.wait_completion(f, idx, spec.timeout_s, "load completion");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace proxy
}  // namespace uccl_ep
