#include "fifo/fifo_host.h"

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "fifo/backoff.h"

namespace uccl_ep {
namespace fifo {

using protocol::TransferCmd;

namespace {

// Control words each sit on their own cache line: producers hammer head, the proxy writes tail,
// completed and status; sharing a line would make every push bounce the proxy's lines.
constexpr size_t kLine = 64;
enum Word { kHead = 0, kTailCache = 1, kTail = 2, kCompleted = 3, kStatus = 4, kNumWords = 5 };

uint32_t log2_exact(uint32_t v) {
  uint32_t l = 0;
  while ((1u << l) < v) ++l;
  return l;
}

}  // namespace

HostFifo::HostFifo(uint32_t capacity) {
  if (capacity < kMinCapacity || (capacity & (capacity - 1)) != 0 || log2_exact(capacity) > kMaxCapacityLog2) {
    throw std::invalid_argument("fifo capacity must be a power of two in [" + std::to_string(kMinCapacity) +
                                ", " + std::to_string(1u << kMaxCapacityLog2) + "], got " +
                                std::to_string(capacity));
  }
  memory_bytes_ = kNumWords * kLine + size_t(capacity) * sizeof(TransferCmd);
  // NOTES: mmap gives zeroed, page-aligned memory: zero is "lap -1" for every slot (fifo_layout.h)
  // and page alignment lets the GPU runtime register exactly this range.
  memory_ = mmap(nullptr, memory_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory_ == MAP_FAILED) {
    memory_ = nullptr;
    throw std::runtime_error("fifo: mmap of " + std::to_string(memory_bytes_) + " bytes failed");
  }
  auto* base = static_cast<uint8_t*>(memory_);
  auto word = [&](Word w) { return reinterpret_cast<uint64_t*>(base + size_t(w) * kLine); };
  layout_.head = word(kHead);
  layout_.tail_cache = word(kTailCache);
  layout_.tail = word(kTail);
  layout_.completed = word(kCompleted);
  layout_.status = word(kStatus);
  layout_.slots = reinterpret_cast<TransferCmd*>(base + kNumWords * kLine);
  layout_.capacity = capacity;
  layout_.capacity_log2 = log2_exact(capacity);
}

HostFifo::~HostFifo() {
  if (memory_ != nullptr) munmap(memory_, memory_bytes_);
}

PushStatus HostFifo::push(const TransferCmd& cmd, double timeout_s, uint64_t* idx_out) {
  const uint64_t cap = layout_.capacity;
  // NOTES: host producers reserve with a CAS only once a slot is free, so a push that times out
  // (or sees the proxy stop) leaves no reserved-but-never-committed index behind to wedge the
  // consumer. GPU producers use fetch_add (fifo_device.cuh) and report their timeouts through the
  // device error word instead.
  // relaxed: the CAS below decides; a stale value only costs a retry.
  uint64_t idx = __atomic_load_n(layout_.head, __ATOMIC_RELAXED);
  // relaxed: a stale cache only sends us to the acquire load of tail.
  uint64_t tail = __atomic_load_n(layout_.tail_cache, __ATOMIC_RELAXED);
  // A stopped or failed proxy never consumes again: refuse at once instead of queueing blind.
  if (const uint64_t st = status(); st != kStatusRunning)
    return st == kStatusStopped ? PushStatus::kStopped : PushStatus::kFailed;
  Backoff backoff(timeout_s);
  for (;;) {
    if (idx >= tail + cap) {
      // acquire: pairs with the proxy's release of tail in pop(); its read of the slot we are
      // about to overwrite happened before.
      tail = __atomic_load_n(layout_.tail, __ATOMIC_ACQUIRE);
      if (idx >= tail + cap) {
        const uint64_t st = status();
        if (st != kStatusRunning) return st == kStatusStopped ? PushStatus::kStopped : PushStatus::kFailed;
        if (backoff.expired()) return PushStatus::kTimeout;
        backoff.pause();
        // relaxed: re-read the reservation counter; another producer may have moved it.
        idx = __atomic_load_n(layout_.head, __ATOMIC_RELAXED);
        continue;
      }
      // relaxed: monotone hint shared by producers; losing a race only costs one tail read.
      uint64_t cached = __atomic_load_n(layout_.tail_cache, __ATOMIC_RELAXED);
      while (cached < tail && !__atomic_compare_exchange_n(layout_.tail_cache, &cached, tail, true,
                                                           __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      }
    }
    // relaxed: the CAS only hands out a unique index; publication is the release store below.
    if (__atomic_compare_exchange_n(layout_.head, &idx, idx + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
  }
  TransferCmd* slot = &layout_.slots[slot_of(idx, layout_.capacity)];
  // relaxed: ordered before the commit by the release store of word1.
  __atomic_store_n(&slot->word0, cmd.word0, __ATOMIC_RELAXED);
  // release: publishes word0 together with the commit bit of this lap.
  __atomic_store_n(&slot->word1, committed_word1(cmd.word1, idx, layout_.capacity_log2), __ATOMIC_RELEASE);
  if (idx_out != nullptr) *idx_out = idx;
  return PushStatus::kOk;
}

bool HostFifo::check_completion(uint64_t idx) const {
  // acquire: pairs with the proxy's release in publish_completed(); the effects of the completed
  // commands (e.g. local source reuse) are ordered before our next accesses.
  return __atomic_load_n(layout_.completed, __ATOMIC_ACQUIRE) > idx;
}

PushStatus HostFifo::wait_completion(uint64_t idx, double timeout_s) const {
  Backoff backoff(timeout_s);
  for (;;) {
    if (check_completion(idx)) return PushStatus::kOk;
    const uint64_t st = status();
    if (st != kStatusRunning) {
      if (check_completion(idx)) return PushStatus::kOk;
      return st == kStatusStopped ? PushStatus::kStopped : PushStatus::kFailed;
    }
    if (backoff.expired()) return PushStatus::kTimeout;
    backoff.pause();
  }
}

bool HostFifo::peek(TransferCmd* out) const {
  const TransferCmd* slot = &layout_.slots[slot_of(consumed_, layout_.capacity)];
  // acquire: pairs with the producer's release of word1; word0 of the same lap is visible after.
  const uint64_t w1 = __atomic_load_n(&slot->word1, __ATOMIC_ACQUIRE);
  if (!is_committed(w1, consumed_, layout_.capacity_log2)) return false;
  // relaxed: ordered by the acquire above.
  out->word0 = __atomic_load_n(&slot->word0, __ATOMIC_RELAXED);
  out->word1 = w1 & ~commit_mask();
  return true;
}

void HostFifo::pop() {
  ++consumed_;
  // release: our reads of the slot happen-before a producer's overwrite (its acquire of tail).
  __atomic_store_n(layout_.tail, consumed_, __ATOMIC_RELEASE);
}

void HostFifo::publish_completed(uint64_t watermark) {
  // release: the work of every command below the watermark is visible to an acquiring waiter.
  __atomic_store_n(layout_.completed, watermark, __ATOMIC_RELEASE);
}

uint64_t HostFifo::completed() const { return __atomic_load_n(layout_.completed, __ATOMIC_ACQUIRE); }

void HostFifo::set_status(uint64_t status) {
  // release: an error recorded by the proxy before stopping is visible to whoever sees status.
  __atomic_store_n(layout_.status, status, __ATOMIC_RELEASE);
}

uint64_t HostFifo::status() const {
  // acquire: pairs with set_status.
  return __atomic_load_n(layout_.status, __ATOMIC_ACQUIRE);
}

uint64_t HostFifo::reserved() const {
  // relaxed: diagnostics only.
  return __atomic_load_n(layout_.head, __ATOMIC_RELAXED);
}

}  // namespace fifo
}  // namespace uccl_ep
