// Shrink mode (DeepEP's enable_shrink) in the low-latency kernels.
//
// The Buffer's rank mask is int32 [R] in device memory (nonzero = masked). Kernels read it when
// they run -- so a CUDA graph replays with the mask of the moment, not the one at capture -- send
// nothing to a masked rank and wait for nothing from it. A receive kernel whose bounded wait on a
// peer expires masks that peer in shrink mode (its part of the op is dropped, the rest completes)
// instead of failing the op through the error word; waits on a peer that another wait has masked
// end at once. Masks stay until the host clears them (low_latency_clean_mask_buffer).
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/fifo_device.cuh"
#include "uccl_ep/kernel_abi.h"

namespace uccl_ep::dev {

// Whether rank r is masked now (mask 0: no mask words, nothing is masked).
UCCL_DEVICE bool rank_masked(uint64_t mask, int r) {
  return mask != 0 && ld_volatile(reinterpret_cast<const int*>(mask) + r) != 0;
}

// The bits of "no mask words" (mask 0: a Buffer not in shrink mode, where no rank is ever masked).
static __device__ const unsigned long long kNoMaskBits = 0ull;

// The mask as a bitmask of ranks (< 64, the LL kernels' limit), read once by the block into shared
// memory: every thread of the block must call it (contains __syncthreads, except with mask 0, which
// reads nothing and returns at once). The pointer form lets a kernel short of registers read the bits
// where it needs them.
// NOTES: without shrink mode no rank is ever masked, so the host passes mask 0 and the kernels read
// no mask words and pass no extra block barriers at their start.
UCCL_DEVICE const unsigned long long* block_mask_bits_shared(uint64_t mask, int num_ranks) {
  __shared__ unsigned long long s_mask_bits;
  if (mask == 0) return &kNoMaskBits;  // a kernel parameter: uniform over the block
  if (threadIdx.x == 0) s_mask_bits = 0ull;
  __syncthreads();
  for (int r = threadIdx.x; r < num_ranks && r < 64; r += blockDim.x)
    if (rank_masked(mask, r)) atomicOr(&s_mask_bits, 1ull << r);
  __syncthreads();
  return &s_mask_bits;
}

UCCL_DEVICE int64_t block_mask_bits(uint64_t mask, int num_ranks) {
  return mask == 0 ? 0 : int64_t(*block_mask_bits_shared(mask, num_ranks));
}

// A bounded wait on `peer` expired: in shrink mode mask the peer (another rank's only: a wait on
// this rank's own work is never the peer's fault), else record the error for the host.
UCCL_DEVICE void peer_missed(uint64_t mask, bool shrink, ErrorWord* err, int phase, int rank, int peer, int expert,
                             uint64_t waited_ns) {
  if (shrink && mask != 0 && peer != rank) {
    atomicExch(reinterpret_cast<int*>(mask) + peer, 1);
    __threadfence();  // the mask word before anything this thread does next (other blocks poll it)
  } else {
    raise_error(err, kErrTimeout, phase, rank, peer, expert, waited_ns);
  }
}

// A bounded wait in an LL receive kernel on a peer's 64-bit word (system-scope acquire loads)
// until `ready(value)`, with shrink mode: `result(value)`, or -1 when the wait expired (peer masked
// in shrink mode, else the error recorded), the peer was masked by another wait, or another wait
// failed. `waited` (or null) gets the time spent.
template <class Ready, class Result>
UCCL_DEVICE int64_t wait_peer_word(const uint64_t* word, Ready ready, Result result, uint64_t timeout_ns,
                                   ErrorWord* err, int phase, int rank, int peer, int expert, uint64_t* waited,
                                   uint64_t mask, bool shrink) {
  const uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    const uint64_t v = ld_acquire_sys(word);
    if (ready(v)) {
      if (waited != nullptr) *waited = clock_ns() - start;
      return result(v);
    }
    if ((spins & 1023u) == 1023u) {
      const uint64_t now = clock_ns();
      if (waited != nullptr) *waited = now - start;
      if (now - start > timeout_ns) {
        peer_missed(mask, shrink, err, phase, rank, peer, expert, now - start);
        return -1;
      }
      if (error_raised(err) || (shrink && rank_masked(mask, peer))) return -1;
    }
  }
}

// wait_tagged (wait.cuh) on a peer's signal, with shrink mode (wait_peer_word): the tag's payload.
UCCL_DEVICE int64_t wait_tagged_peer(const uint64_t* signal, uint32_t tag, uint64_t timeout_ns, ErrorWord* err,
                                     int phase, int rank, int peer, int expert, uint64_t* waited, uint64_t mask,
                                     bool shrink) {
  return wait_peer_word(
      signal, [tag](uint64_t v) { return uint32_t(v >> 32) == tag; },
      [](uint64_t v) { return int64_t(v & 0xffffffffu); }, timeout_ns, err, phase, rank, peer, expert, waited, mask,
      shrink);
}

// wait_counter_shared (fifo_device.cuh) on a source's receive counter in an LL proxy-path receive
// kernel, with shrink mode as in wait_tagged_peer. A stopped or failed proxy is this rank's own
// failure: always an error (kErrProxy), never a mask.
UCCL_DEVICE int64_t wait_counter_shared_peer(const int64_t* counter, uint64_t* cache, int* lock, int64_t target,
                                             const uint64_t* status, uint64_t timeout_ns, ErrorWord* err, int phase,
                                             int rank, int peer, int expert, uint64_t* waited, uint64_t mask,
                                             bool shrink) {
  const uint64_t start = clock_ns();
  for (uint32_t spins = 0;; ++spins) {
    int64_t v = int64_t(ld_acquire_gpu(cache));  // as in wait_counter_shared
    if (v < target && atomicCAS(lock, 0, 1) == 0) {
      v = int64_t(ld_acquire_sys(reinterpret_cast<const uint64_t*>(counter)));
      max_release_gpu(cache, uint64_t(v));
      atomicExch(lock, 0);
    }
    if (v >= target) {
      if (waited != nullptr) *waited = clock_ns() - start;
      return v;
    }
    if ((spins & 4095u) == 4095u) {
      const uint64_t now = clock_ns();
      if (waited != nullptr) *waited = now - start;
      // acquire (sys): pairs with the proxy's release of status.
      if (ld_acquire_sys(status) != fifo::kStatusRunning) {
        raise_error(err, kErrProxy, phase, rank, peer, expert, now - start);
        return -1;
      }
      if (now - start > timeout_ns) {
        peer_missed(mask, shrink, err, phase, rank, peer, expert, now - start);
        return -1;
      }
      if (error_raised(err) || (shrink && rank_masked(mask, peer))) return -1;
    }
  }
}

// Lane k (< num_topk) of a warp holding expert e of one top-k row: whether a lower lane holds the
// same expert (e >= 0). Every lane of the warp must call it.
UCCL_DEVICE bool repeats_lower_lane(int e, int lane, int num_topk) {
  bool dup = false;
  for (int k2 = 0; k2 < num_topk; ++k2) {
    const int e2 = shfl_idx(e, k2);
    dup = dup || (k2 < lane && e >= 0 && e2 == e);
  }
  return dup;
}

// A low-latency top-k row selects expert `expert` twice (token `token`): the host raises
// InvalidArgument naming them (kernel_abi.h, kErrTopkDuplicate); the kernel drops the repeat and
// keeps every write inside its slab.
UCCL_DEVICE void duplicate_expert(ErrorWord* err, int phase, int rank, int token, int expert) {
  raise_error(err, kErrTopkDuplicate, phase, rank, token, expert, 0);
}

}  // namespace uccl_ep::dev
