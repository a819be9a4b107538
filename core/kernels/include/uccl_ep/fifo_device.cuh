// Device half of the proxy FIFO: any GPU thread pushes a 16-byte TransferCmd into a ring whose
// consumer is one CPU proxy thread (layout, lap-parity commit bit and the host half:
// uccl_ep/fifo_layout.h, core/csrc/fifo/fifo_host.*).
//
// Where the parts live for GPU producers (built by uccl_ep/cuda/ll_proxy.py):
//   slots, tail, completed, status   pinned host memory of the proxy, registered and mapped for
//                                    the device (these are device addresses of that mapping)
//   head, tail_cache                 device memory: producers reserve and cache without crossing
//                                    PCIe; only a ring that looks full reads the host's tail
//
// Push (fifo_push): reserve an index with one device-scope fetch_add, wait (bounded) while the
// ring is full, then publish the command with ONE 16-byte store whose release orders everything
// the producer (and, through the caller's fences, its block) wrote before it -- the payload the
// proxy will copy. A producer that gives up (timeout, stopped proxy, another waiter's error)
// fills the error word (device/wait.cuh) and returns false; it never traps.
//
// NOTES: a producer that gives up leaves its reserved slot uncommitted, so the proxy stops
// consuming that ring: the buffer is failed from then on (the error word is sticky on the host),
// as it is after any device timeout.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/fifo_layout.h"
#include "uccl_ep/kernel_abi.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep::dev {

using fifo::FifoLayout;
using protocol::TransferCmd;

// Who pushes, for the error word of a push that gives up.
struct PushSite {
  int phase;
  int rank;
  int peer;    // destination rank of the command
  int expert;  // expert (or -1)
};

// Short pause between polls of host memory (each poll is a PCIe read).
UCCL_DEVICE void poll_pause() { pause_ns(200); }

// The commit store: word0 and word1 (commit bit included) as one 16-byte store with release
// semantics at system scope.
UCCL_DEVICE void store_command(TransferCmd* slot, uint64_t word0, uint64_t word1) {
#if UCCL_EP_HIP || defined(UCCL_EP_FIFO_SPLIT_STORE)
  // NOTES: HIP has no 16-byte release store, and some platforms deliver a 16-byte PCIe write to the
  // CPU torn (UCCL_EP_FIFO_SPLIT_STORE): word0 relaxed first, then word1 (which carries the commit
  // bit) with release; the proxy acquires word1 and only then reads word0, so it never sees a
  // committed slot with a stale word0.
  st_relaxed_sys(&slot->word0, word0);
  st_release_sys(&slot->word1, word1);
#else
  // release (sys): every write this thread made -- and every write it observed through the
  // caller's fence -- is visible to the CPU and its copy engines before the command is.
  // NOTES: one aligned 16-byte store goes out as one PCIe write and lands in one cache line of
  // the CPU (x86 and Grace root complexes deliver it whole), so the proxy, which acquires word1
  // and then reads word0, sees both halves of the same command; build with
  // -DUCCL_EP_FIFO_SPLIT_STORE where that does not hold.
  st16_release_sys(slot, word0, word1);
#endif
}

// Waits (bounded) until slot `last` of the ring is free, given `tail`, the producers' cached tail
// (tail_cache) read by the caller. True when it is; false (error word filled) on timeout, a stopped
// proxy or another waiter's error.
UCCL_DEVICE bool wait_ring_room(const FifoLayout& f, uint64_t last, uint64_t tail, uint64_t timeout_ns, ErrorWord* err,
                                const PushSite& site) {
  if (last < tail + f.capacity) return true;
  const uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    // acquire (sys): pairs with the proxy's release of tail after it read the slot we are
    // about to overwrite, so our store cannot overtake its read.
    tail = ld_acquire_sys(f.tail);
    if (last < tail + f.capacity) break;
    // acquire (sys): pairs with the proxy's release of status when it stops or fails.
    if (ld_acquire_sys(f.status) != fifo::kStatusRunning) {
      raise_error(err, kErrProxy, site.phase, site.rank, site.peer, site.expert, clock_ns() - start);
      return false;
    }
    if ((spins & 63u) == 63u) {
      const uint64_t now = clock_ns();
      if (now - start > timeout_ns) {
        raise_error(err, kErrTimeout, site.phase, site.rank, site.peer, site.expert, now - start);
        return false;
      }
      if (error_raised(err)) return false;
    }
    poll_pause();
  }
  // relaxed (device scope): a monotone hint shared by producers; a lost race only costs a
  // later PCIe read of tail.
  atomicMax(reinterpret_cast<unsigned long long*>(f.tail_cache), (unsigned long long)tail);
  return true;
}

// Pushes `cmd`; true on success. Any thread may call it; each call costs one device atomic and
// one 16-byte store to host memory (plus PCIe reads of `tail` only while the ring looks full).
UCCL_DEVICE bool fifo_push(const FifoLayout& f, const TransferCmd& cmd, uint64_t timeout_ns, ErrorWord* err,
                           const PushSite& site) {
  // relaxed (device scope): the add only hands out a unique index; publication is the store below.
  const uint64_t idx = atomicAdd(reinterpret_cast<unsigned long long*>(f.head), 1ull);
  if (!wait_ring_room(f, idx, ld_relaxed_gpu(f.tail_cache), timeout_ns, err, site)) return false;
  TransferCmd* slot = f.slots + fifo::slot_of(idx, f.capacity);
  store_command(slot, cmd.word0, fifo::committed_word1(cmd.word1, idx, f.capacity_log2));
  return true;
}

// Pushes cmds[0, n) into n consecutive slots of one FIFO, in order; true on success. One device
// atomic reserves them all, one system fence orders everything before them (the caller's stores,
// and those it observed), then n posted 16-byte stores commit them.
// NOTES: fifo_push per command costs a reservation round trip and a release store (MEMBAR.SYS)
// each; for the LL proxy send kernels' three commands per destination that was most of a send
// kernel's tail. A release fence followed by strong stores is a release pattern in
// the PTX memory model: each command is visible to the proxy only after what the fence ordered.
// `fence` = false: the caller already fenced (fence_release_sys) after everything the commands carry.
UCCL_DEVICE bool fifo_push_batch(const FifoLayout& f, const TransferCmd* cmds, int n, uint64_t timeout_ns,
                                 ErrorWord* err, const PushSite& site, bool fence = true) {
  if (n <= 0) return true;
  const uint64_t first = atomicAdd(reinterpret_cast<unsigned long long*>(f.head), (unsigned long long)n);
  const uint64_t tail = ld_relaxed_gpu(f.tail_cache);
#if !(UCCL_EP_HIP || defined(UCCL_EP_FIFO_SPLIT_STORE))
  // Issued while the reservation is in flight: the fence waits for it anyway (one wait, not two).
  if (fence) fence_release_sys();
#endif
  if (!wait_ring_room(f, first + uint64_t(n - 1), tail, timeout_ns, err, site)) return false;
#if UCCL_EP_HIP || defined(UCCL_EP_FIFO_SPLIT_STORE)
  for (int i = 0; i < n; ++i)
    store_command(f.slots + fifo::slot_of(first + uint64_t(i), f.capacity), cmds[i].word0,
                  fifo::committed_word1(cmds[i].word1, first + uint64_t(i), f.capacity_log2));
#else
  for (int i = 0; i < n; ++i) {  // after fence_release_sys above
    TransferCmd* slot = f.slots + fifo::slot_of(first + uint64_t(i), f.capacity);
    const uint64_t w1 = fifo::committed_word1(cmds[i].word1, first + uint64_t(i), f.capacity_log2);
    st16_relaxed_sys(slot, cmds[i].word0, w1);
  }
#endif
  return true;
}

// FIFO used for a key (expert, (peer, expert), ...): commands of one receiver counter always go
// through the same FIFO, hence the same proxy thread (the receiver's ordering and fences rely on it).
UCCL_DEVICE int fifo_for(int key, int num_fifos) { return key % num_fifos; }

// The bounded-wait checks of wait_counter*: the proxy still running, the deadline, another wait's
// error. False (error word filled, or already filled) when the wait must end.
UCCL_DEVICE bool proxy_wait_ok(uint64_t start, const uint64_t* status, uint64_t timeout_ns, ErrorWord* err, int phase,
                               int rank, int peer, int expert) {
  const uint64_t now = clock_ns();
  // acquire (sys): pairs with the proxy's release of status.
  if (ld_acquire_sys(status) != fifo::kStatusRunning) {
    raise_error(err, kErrProxy, phase, rank, peer, expert, now - start);
    return false;
  }
  if (now - start > timeout_ns) {
    raise_error(err, kErrTimeout, phase, rank, peer, expert, now - start);
    return false;
  }
  return !error_raised(err);
}

// Waits (bounded) until *counter >= target, a counter the receiving proxy bumps in mapped host
// memory; gives up early when the proxy stopped or failed (its FIFO status word) or another wait
// recorded an error. Returns the value, or -1 (error word filled). `waited` gets the ns.
UCCL_DEVICE int64_t wait_counter(const int64_t* counter, int64_t target, const uint64_t* status, uint64_t timeout_ns,
                                 ErrorWord* err, int phase, int rank, int peer, int expert, uint64_t* waited) {
  const uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    // acquire (sys): pairs with the receiving proxy's release add, which it made only after the
    // copies this count accounts for completed into our memory.
    const int64_t v = int64_t(ld_acquire_sys(reinterpret_cast<const uint64_t*>(counter)));
    if (v >= target) {
      if (waited != nullptr) *waited = clock_ns() - start;
      return v;
    }
    if ((spins & 255u) == 255u && !proxy_wait_ok(start, status, timeout_ns, err, phase, rank, peer, expert)) return -1;
  }
}

// wait_counter for a host word that many threads of this GPU wait on: one thread at a time -- the
// holder of *lock (device memory, 0 = free) -- reads host memory and raises *cache (device memory,
// the largest value read so far; the counter only grows); the others poll *cache in L2.
// NOTES: the LL proxy receive kernels wait with a thread per (block, source): 288 threads at 288
// experts, each reading mapped host memory in a loop. Those reads cross PCIe one after another, so
// a counter that was long there was seen tens of microseconds late (every receive kernel of the
// forced proxy path); the copy kernel's descriptor reads behaved the same.
UCCL_DEVICE int64_t wait_counter_shared(const int64_t* counter, uint64_t* cache, int* lock, int64_t target,
                                        const uint64_t* status, uint64_t timeout_ns, ErrorWord* err, int phase,
                                        int rank, int peer, int expert, uint64_t* waited) {
  const uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    // acquire (gpu): pairs with the reader's release max below, which it made after acquiring the
    // host counter (and so everything the count accounts for).
    int64_t v = int64_t(ld_acquire_gpu(cache));
    if (v < target && atomicCAS(lock, 0, 1) == 0) {
      v = int64_t(ld_acquire_sys(reinterpret_cast<const uint64_t*>(counter)));  // as in wait_counter
      max_release_gpu(cache, uint64_t(v));
      atomicExch(lock, 0);
    }
    if (v >= target) {
      if (waited != nullptr) *waited = clock_ns() - start;
      return v;
    }
    if ((spins & 4095u) == 4095u && !proxy_wait_ok(start, status, timeout_ns, err, phase, rank, peer, expert)) return -1;
  }
}

}  // namespace uccl_ep::dev
