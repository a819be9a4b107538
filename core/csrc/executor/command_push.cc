#include "executor/command_push.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace executor {

void push_counted(proxy::Proxy& proxy, const CountedWrites& writes, const Atomics& atomics, int threads,
                  double timeout_s) {
  const int num_fifos = proxy.num_fifos();
  const uint32_t num_counters = proxy.config().num_counters;
  for (uint64_t i = 0; i < atomics.count; ++i) {
    const int32_t v = atomics.value[i];
    const bool bad = atomics.fenced[i] ? (v < 1 || v > protocol::limits::kMaxAtomicValue)
                                       : (v < protocol::limits::kMinAtomicValue || v > protocol::limits::kMaxAtomicValue);
    if (bad)
      throw_error(ErrorKind::kInvalidArgument, proxy.config().rank, atomics.dst[i], "push",
                  "atomic value: expected " + std::string(atomics.fenced[i] ? "1" : std::to_string(protocol::limits::kMinAtomicValue)) +
                      ".." + std::to_string(protocol::limits::kMaxAtomicValue) + ", got " + std::to_string(v));
  }
  threads = std::max(1, std::min(threads, num_fifos));
  std::mutex mu;
  std::exception_ptr error;
  std::atomic<bool> abort{false};
  auto worker = [&](int w) {
    try {
      // relaxed (abort): a hint to stop early; the first exception is the result.
      for (uint64_t i = 0; i < writes.count && !abort.load(std::memory_order_relaxed); ++i) {
        const int f = int(uint32_t(writes.counter[i]) % num_counters % uint32_t(num_fifos));
        if (f % threads != w) continue;
        proxy.push(f, protocol::make_counted_write(uint32_t(writes.dst[i]), uint64_t(writes.src_off[i]),
                                                   uint64_t(writes.dst_off[i]), writes.len, uint32_t(writes.counter[i])),
                   timeout_s);
      }
      for (uint64_t i = 0; i < atomics.count && !abort.load(std::memory_order_relaxed); ++i) {
        const int f = int(uint32_t(atomics.counter[i]) % num_counters % uint32_t(num_fifos));
        if (f % threads != w) continue;
        proxy.push(f, protocol::make_atomic(uint32_t(atomics.dst[i]), uint32_t(atomics.counter[i]), atomics.value[i],
                                            atomics.fenced[i] != 0),
                   timeout_s);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      // relaxed: a hint to stop early; the exception is the result.
      abort.store(true, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(worker, w);
  worker(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void wait_counters(proxy::Proxy& proxy, const int32_t* src, const int32_t* counter, const int64_t* target,
                   uint64_t count, double timeout_s, const std::string& phase) {
  // NOTES: one deadline for the whole set, not per counter, so the bound is timeout_s in total.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  for (uint64_t i = 0; i < count; ++i) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    try {
      proxy.wait_counter(src[i], uint32_t(counter[i]), target[i], std::max(left, 1e-3), phase);
    } catch (EpError& e) {
      if (e.info.kind != ErrorKind::kTimeout) throw;
      ErrorInfo info = e.info;
      info.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      throw EpError(info);
    }
  }
}

}  // namespace executor
}  // namespace uccl_ep
