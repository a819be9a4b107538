// Host half of the proxy FIFO (layout in kernels/include/uccl_ep/fifo_layout.h): the memory it
// lives in, the host producer push, and the consumer side used by one proxy thread.
//
// NOTES: the ring memory is plain page-aligned host memory here. The GPU runtime makes it
// GPU-visible by registering it (cudaHostRegister / hipHostRegister, mapped) and moves `head` and
// `tail_cache` to device memory in the FifoLayout it hands to kernels; nothing in this file
// depends on where those two words live.
#pragma once

#include <stdint.h>

#include <memory>

#include "uccl_ep/fifo_layout.h"

namespace uccl_ep {
namespace fifo {

enum class PushStatus { kOk, kTimeout, kStopped, kFailed };

class HostFifo {
 public:
  // capacity: power of two in [kMinCapacity, 2^kMaxCapacityLog2]; throws std::invalid_argument.
  explicit HostFifo(uint32_t capacity);
  ~HostFifo();
  HostFifo(const HostFifo&) = delete;
  HostFifo& operator=(const HostFifo&) = delete;

  const FifoLayout& layout() const { return layout_; }
  // The one page-aligned block holding slots and control words (what a GPU runtime registers).
  void* memory() const { return memory_; }
  size_t memory_bytes() const { return memory_bytes_; }
  uint32_t capacity() const { return layout_.capacity; }

  // ---- producers (any number of host threads) ------------------------------------------------
  // Reserves an index, waits (at most timeout_s) for room, writes and commits the command.
  // On kOk *idx_out is the command's index; otherwise nothing was reserved.
  PushStatus push(const protocol::TransferCmd& cmd, double timeout_s, uint64_t* idx_out);
  // True once the command at idx (and everything before it on this FIFO) completed.
  bool check_completion(uint64_t idx) const;
  // Blocks (bounded) until check_completion(idx); kOk, kTimeout, kStopped or kFailed.
  PushStatus wait_completion(uint64_t idx, double timeout_s) const;

  // ---- consumer (exactly one proxy thread) ---------------------------------------------------
  // Copies the command at the consumer index into *out; false when nothing is committed there.
  bool peek(protocol::TransferCmd* out) const;
  // Index of the command peek() returns.
  uint64_t consumer_index() const { return consumed_; }
  // Frees the slot just peeked (publishes tail).
  void pop();
  // Publishes the completion watermark (monotone).
  void publish_completed(uint64_t watermark);
  uint64_t completed() const;
  // Status word seen by producers / waiters.
  void set_status(uint64_t status);
  uint64_t status() const;
  // Index the next push would get (producers' head); for diagnostics.
  uint64_t reserved() const;

 private:
  FifoLayout layout_{};
  void* memory_ = nullptr;
  size_t memory_bytes_ = 0;
  uint64_t consumed_ = 0;  // consumer-private copy of tail
};

}  // namespace fifo
}  // namespace uccl_ep
