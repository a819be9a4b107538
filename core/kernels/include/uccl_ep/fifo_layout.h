// uccl_ep wire protocol, part 3: the memory layout of one proxy FIFO, so that any producer (GPU
// warps through fifo_device.cuh, host threads through csrc/fifo/fifo_host.h) can push into a
// queue whose consumer is one CPU proxy thread.
//
//   slots[capacity]  TransferCmd ring, pinned host memory (GPU-mapped). Never cleared: a slot is
//                    valid for index i when its commit bit equals commit_bit(i) (lap parity), so
//                    an all-zero command is still legal and nobody writes a slot twice per lap.
//   head             next index to reserve. Producers take indices with an atomic fetch_add.
//                    GPU producers: a device-memory word; host producers: a host word. Only
//                    producers touch it.
//   tail             first index the proxy has NOT consumed yet; the proxy publishes it with a
//                    release store after it is done reading a slot; pinned host memory.
//   tail_cache       producer-side copy of tail (GPU: device memory) so the fast path never reads
//                    host memory across PCIe; refreshed only when the ring looks full.
//   completed        watermark: every command with index < completed is complete (its local
//                    transfer finished, or the Quiet / Barrier it encodes is satisfied); written
//                    by the proxy with release; pinned host memory.
//   status           0 while the proxy runs; non-zero (kStatus*) once it stopped or failed, so a
//                    producer spinning on a full ring or a waiter on `completed` gives up.
//
// Push (every producer):
//   1. idx = fetch_add(head, 1)                          relaxed: only reserves a number
//   2. while idx >= tail_cache + capacity:               ring full (bounded wait, checks status)
//        tail_cache = acquire-load(tail)                 acquire pairs with the proxy's release
//                                                        of tail: its reads of the old slot are
//                                                        done before we overwrite it
//   3. slot.word0 = cmd.word0                            plain / relaxed store
//      slot.word1 = cmd.word1 | commit_bit(idx) << 63    release (or one 128-bit release store on
//                                                        CUDA): word0 is visible before the commit
//   4. return idx                                        check_completion(idx): completed > idx
//
// Pop (the proxy thread, sole consumer): acquire-load slot.word1 at index tail; if its commit bit
// is commit_bit(tail) the command is there (word0 readable after the acquire); process it, then
// release-store tail + 1.
#pragma once

#include <stdint.h>

#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace fifo {

using protocol::TransferCmd;

constexpr uint32_t kMinCapacity = 2;
constexpr uint32_t kMaxCapacityLog2 = 24;
constexpr uint32_t kDefaultCapacity = 2048;

enum Status : uint64_t {
  kStatusRunning = 0,
  kStatusStopped = 1,  // proxy shut down cleanly: waiters get Aborted
  kStatusFailed = 2,   // proxy hit an error (peer failure, protocol error): waiters get it
};

// Where the parts of one FIFO live. Plain data: built by the host, copied to the device.
struct FifoLayout {
  TransferCmd* slots;           // [capacity], pinned host
  uint64_t* head;               // producers' reservation counter (host or device word)
  uint64_t* tail;               // pinned host, written by the proxy
  uint64_t* tail_cache;         // producers' cached tail (host or device word)
  uint64_t* completed;          // pinned host, written by the proxy
  uint64_t* status;             // pinned host, written by the proxy (Status)
  uint32_t capacity;            // power of two
  uint32_t capacity_log2;
};

UCCL_EP_HOST_DEVICE constexpr uint32_t slot_of(uint64_t idx, uint32_t capacity) {
  return uint32_t(idx & (uint64_t(capacity) - 1));
}

// Lap parity: lap 0 commits with bit 1 (memory starts zeroed, i.e. "lap -1"), lap 1 with 0, ...
UCCL_EP_HOST_DEVICE constexpr uint64_t commit_bit(uint64_t idx, uint32_t capacity_log2) {
  return ((idx >> capacity_log2) & 1) ^ 1;
}

UCCL_EP_HOST_DEVICE constexpr uint64_t commit_mask() { return uint64_t(1) << protocol::kFieldCommit.shift; }

// word1 as stored for index idx.
UCCL_EP_HOST_DEVICE constexpr uint64_t committed_word1(uint64_t word1, uint64_t idx, uint32_t capacity_log2) {
  return (word1 & ~commit_mask()) | (commit_bit(idx, capacity_log2) << protocol::kFieldCommit.shift);
}

// True when a word1 read at index idx belongs to lap idx / capacity.
UCCL_EP_HOST_DEVICE constexpr bool is_committed(uint64_t word1, uint64_t idx, uint32_t capacity_log2) {
  return ((word1 >> protocol::kFieldCommit.shift) & 1) == commit_bit(idx, capacity_log2);
}

}  // namespace fifo
}  // namespace uccl_ep
