// Bounded waiting: spin briefly, then yield, then sleep with growing pauses, until a deadline.
//
// NOTES: CI machines have 2 cores shared by several ranks, each with proxy threads; a waiter that
// only spins starves the very thread it waits for (busy-polling on both sides of a transfer on 2
// cores cuts its throughput several times). Latency-sensitive deployments lower the sleep cap.
#pragma once

#include <sched.h>
#include <time.h>

#include <chrono>

namespace uccl_ep {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  // timeout_s <= 0 means "expire at once" (a single try).
  explicit Backoff(double timeout_s, long max_sleep_ns = 100000)
      : start_(Clock::now()),
        deadline_(start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
        max_sleep_ns_(max_sleep_ns) {}

  bool expired() const { return Clock::now() >= deadline_; }
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  // One pause; escalates with the number of calls since construction or reset().
  void pause() {
    ++rounds_;
    if (rounds_ < 64 || max_sleep_ns_ < 0) {  // max_sleep_ns < 0: spin only (never yield the core)
      cpu_relax();
    } else if (rounds_ < 128 || max_sleep_ns_ == 0) {
      // max_sleep_ns == 0: never sleep. NOTES: any nanosleep costs the timer slack (50 us by
      // default), which a latency path pays on every hop; hosts with cores to spare spin.
      sched_yield();
    } else {
      timespec ts{0, sleep_ns_};
      nanosleep(&ts, nullptr);
      sleep_ns_ = sleep_ns_ * 2 > max_sleep_ns_ ? max_sleep_ns_ : sleep_ns_ * 2;
    }
  }

  // Progress was made: go back to spinning (the deadline stays).
  void reset() {
    rounds_ = 0;
    sleep_ns_ = 1000;
  }

 private:
  Clock::time_point start_;
  Clock::time_point deadline_;
  long max_sleep_ns_;
  long sleep_ns_ = 1000;
  unsigned rounds_ = 0;
};

}  // namespace uccl_ep
