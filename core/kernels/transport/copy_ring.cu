// The copy kernel of the ipc transport's "kernel" engine (dma_ring.h): the stand-in for a NIC's DMA
// engine when the LL proxy path runs between GPUs of one host.
//
// Launched on the caller's stream right after each proxy-path send kernel. Warp 1 of each block waits
// for the send kernels (griddepcontrol.wait; at once when launched plainly) and reads `pushed`, the
// bytes of every Write they pushed per proxy thread, now final; meanwhile warp 0 polls the ring
// lightly for the first descriptor (step 1). The proxy
// threads turn those Writes into descriptors in their copy rings, one ring per thread; this kernel
// runs blocks_per_ring blocks on each ring and returns once the ring's descriptors cover the counted
// bytes:
//   1. warp 0 of every block of the group waits (bounded, proxy status checked) for descriptor
//      idx (seq == idx + 1, acquire), which one thread at a time copies from the host ring into a
//      device mirror (fetch_descriptor), and reads {dst, src, len} there;
//   2. each block copies its share of the bytes (16-byte units interleaved over the group's
//      blocks) into the peer's region over NVLink (nothing for a skip descriptor, dma_ring.h);
//   3. the block's stores are fenced system-wide and counted in finish[idx]; the group's last
//      block for idx publishes, in ring order, done = idx + 1 to the ring header (a release fence,
//      then a relaxed system-scope store), which the proxy acquires before it delivers the Write's
//      immediate to the receiving proxy.
// Ring positions persist across launches in DmaConsumer (device memory): the group's last block
// to leave records where the next launch starts.
//
// NOTES: this kernel only moves bytes the proxy asked for, in the proxy's order; the command queue,
// the proxies, the inbox hand-off and the receive counters are the same as with a NIC. What a NIC
// would not cost: the SMs this kernel holds for the length of the copies (idle groups leave at once).
#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/proxy_ll.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/dma_ring.h"
#include "uccl_ep/fifo_device.cuh"
#include "uccl_ep/kernel_abi.h"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

UCCL_DEVICE unsigned long long ld_volatile_u64(const unsigned long long* p) {
  return *reinterpret_cast<const volatile unsigned long long*>(p);
}


// Copies [src, +len) to dst: this block's share of 16-byte units (block b of nb takes every nb-th
// span of blockDim.x units), kInFlight loads in flight per thread; bytes when anything is unaligned.
// NOTES: with 4 loads in flight this loop alone moves 3.7 MB to the peer in 11.4 us with 8 blocks
// (332 GB/s) and 10.9 us with 132 (the copy-loop probe of tools/lab/probe_copy_ring.cu): a few blocks per ring reach the
// link (Tuning.ipc_copy_blocks, 16 by default: 0.5-1 us shorter per LL op than 8).
// The ~100 GB/s once measured around it was the ring's host reads (fetch_descriptor).
constexpr int kInFlight = 4;

UCCL_DEVICE void copy_share(uint8_t* dst, const uint8_t* src, uint64_t len, int b, int nb) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | len) & 15u) != 0) {
    for (uint64_t i = uint64_t(b) * blockDim.x + threadIdx.x; i < len; i += uint64_t(nb) * blockDim.x) dst[i] = src[i];
    return;
  }
  const uint64_t units = len / 16, stride = uint64_t(nb) * blockDim.x;
  uint64_t u = uint64_t(b) * blockDim.x + threadIdx.x;
  for (; u + (kInFlight - 1) * stride < units; u += kInFlight * stride) {
    Vec16 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) v[k] = ld16(src + (u + k * stride) * 16);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) st16(dst + (u + k * stride) * 16, v[k]);
  }
  for (; u < units; u += stride) st16(dst + u * 16, ld16(src + u * 16));
}

// Makes descriptor idx available in `mirror` (device memory); called by a whole warp. One warp of
// the ring's blocks at a time -- the holder of fetch_lock -- reads the host ring and copies every
// posted descriptor it finds (up to kFetchBatch, a lane per slot) into the mirror, then raises
// `fetched` with a release; the others only poll `fetched` in L2. Bounded like every wait.
// Returns false once the error word is filled.
// NOTES: host memory costs a PCIe round trip per dependent read. Each block's thread 0 used to
// read the ring itself (seq, then dst, src, len): at 8 blocks per ring those reads cost more than
// the copy (27 us per 3.7 MB descriptor where the copy loop alone takes 11.4). Now a lane reads
// its slot in two 16-byte loads and checks each word by the lap tags (dma_ring.h): one round trip
// per fetch. Four 8-byte loads per slot over 32 lanes cost ~2-3 us more per op (the send kernel's
// push -> descriptor seen 10.5-12 -> 8.1-9.2 us on 2 x H200); alone (probe_proxy_rtt.py: no send
// kernel, one thread polling) push -> seen is 2.2-2.5 us, of which the proxy thread is a fraction.
// Polling: the first read is a batch (a descriptor posted before the kernel came finds it in one
// round trip); once a batch found nothing the lock holder reads only the next slot's seq until it is
// posted (one PCIe read in flight), then the batch. With `light` (non-zero while the send kernel may
// still run: the overlapped start) it returns kFetchStopped once *light reads 0. NOTES: batch reads
// polled back to back while the proxy writes those lines cost 35 us per D+C on 2 x H200 through a
// running send kernel, and ~14 us right after it.
constexpr uint64_t kFetchBatch = 4;
enum FetchResult { kFetchError = 0, kFetchGot = 1, kFetchStopped = 2 };
UCCL_DEVICE int fetch_descriptor(DmaConsumer* st, DmaRingHeader* header, DmaDesc* mirror, uint64_t idx,
                                 const LLProxyDmaParams& p, int g, ErrorWord* err,
                                 const volatile int* light = nullptr) {
  const auto* slots = reinterpret_cast<const DmaDesc*>(header + 1);
  const int lane = lane_id();
  const uint64_t start = clock_ns();
  uint64_t* fetched = reinterpret_cast<uint64_t*>(&st->fetched);
  bool found_none = false;  // this warp's last batch read found nothing posted
  for (uint32_t spins = 0;; ++spins) {
    // lane 0 decides for the warp: 1 = already fetched, 2 = the warp holds the lock, 0 = poll again
    int state = 0;
    const bool polling_lightly = light != nullptr && *light != 0;
    if (lane == 0) {
      if (ld_acquire_gpu(fetched) > idx) state = 1;
      else if (light != nullptr && !polling_lightly) state = 3;
      else if (atomicCAS(&st->fetch_lock, 0ull, 1ull) == 0ull) state = 2;
    }
    state = shfl_idx(state, 0);
    if (state == 1) return kFetchGot;
    if (state == 3) return kFetchStopped;
    uint64_t from = 0;
    if (state == 2) {
      from = ld_acquire_gpu(fetched);  // stable while this warp holds the lock: only the holder raises it
      int posted_next = 1;
      if (found_none && lane == 0)
        posted_next = *reinterpret_cast<const volatile uint64_t*>(&slots[from & (kDmaRingCapacity - 1)].seq) == from + 1;
      if (!shfl_idx(posted_next, 0)) {
        if (lane == 0) atomicExch(&st->fetch_lock, 0ull);
        state = 0;  // poll again below (paused)
      }
    }
    if (state == 2) {
      const uint64_t k = from + uint64_t(lane);
      const DmaDesc* d = slots + (k & (kDmaRingCapacity - 1));
      // Two independent 16-byte loads per slot (one round trip); each word is checked by itself (seq,
      // lap tags). Only kFetchBatch lanes read: an LL op posts one descriptor per ring.
      uint64_t dst = 0, src = 0, len = 0, seq = 0;
      if (uint64_t(lane) < kFetchBatch) {
        ld_volatile_v2(&d->dst, dst, src);
        ld_volatile_v2(&d->len, len, seq);
      }
      const uint64_t tag = dma_tag(k);
      const bool posted = uint64_t(lane) < kFetchBatch && seq == k + 1 && (dst & ~kDmaFieldMask) == tag &&
                          (src & ~kDmaFieldMask) == tag && (len & ~kDmaFieldMask) == tag;
      const uint64_t run = warp_ballot(posted);
      const int n = ffs64(~run) == 0 ? kWarpSize : ffs64(~run) - 1;  // posted slots in a row from `from`
      found_none = n == 0;
      if (lane < n) {
        DmaDesc* m = mirror + (k & (kDmaRingCapacity - 1));
        m->dst = dst & kDmaFieldMask;
        m->src = src & kDmaFieldMask;
        m->len = len & kDmaFieldMask;
        __threadfence();  // the mirror entry before lane 0's release of the count
      }
      sync_warp();
      if (lane == 0) {
        if (n > 0) {
          max_release_gpu(fetched, from + uint64_t(n));
          // diagnostics for the proxy (posted stores; it reads them after `done`): ipc_copy.cc
          *reinterpret_cast<volatile uint64_t*>(&header->seen_idx) = from + uint64_t(n) - 1;
          *reinterpret_cast<volatile uint64_t*>(&header->seen_ns) = clock_ns();
          *reinterpret_cast<volatile uint64_t*>(&header->push_ns) = ld_volatile_u64(&st->push_ns);
        }
        atomicExch(&st->fetch_lock, 0ull);
      }
      if (from + uint64_t(n) > idx) return kFetchGot;
    }
    if (state == 0) pause_ns(polling_lightly || found_none ? 200 : 50);  // the lock holder reads; the others wait in L2
    int ok = 1;
    if (lane == 0 && (spins & 1023u) == 1023u)
      ok = proxy_wait_ok(start, reinterpret_cast<const uint64_t*>(p.status), uint64_t(p.timeout_ns), err,
                         kPhaseLLProxyCopy, int(p.rank), -1, g);
    if (!shfl_idx(ok, 0)) return kFetchError;
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512) ll_proxy_dma(const UCCL_GRID_CONSTANT LLProxyDmaParams p) {
  __shared__ unsigned long long s_desc[3];
  __shared__ int s_ok;
  const int nb = int(p.blocks_per_ring);
  const int g = int(blockIdx.x) / nb, b = int(blockIdx.x) % nb;
  auto* st = reinterpret_cast<DmaConsumer*>(p.state) + g;
  auto* ring = reinterpret_cast<uint8_t*>(reinterpret_cast<const uint64_t*>(p.rings)[g]);
  auto* header = reinterpret_cast<DmaRingHeader*>(ring);
  DmaDesc* mirror = reinterpret_cast<DmaDesc*>(p.mirror) + int64_t(g) * int64_t(kDmaRingCapacity);
  unsigned* finish = reinterpret_cast<unsigned*>(p.finish) + int64_t(g) * int64_t(kDmaRingCapacity);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  // Stable during this launch: only the group's last block to leave moves them (below).
  unsigned long long idx = ld_volatile_u64(&st->base_idx), bytes = ld_volatile_u64(&st->base_bytes);
  const uint64_t began = clock_ns();  // diagnostics (GPU clock)
  // The receive kernel may start now (programmatic launch, ll_proxy.py): it changes nothing this
  // kernel reads, and waits for this grid (griddepcontrol.wait) before it completes.
  allow_dependent_launch();
  __shared__ unsigned long long s_target, s_pushed_at, s_early_seen;
  __shared__ volatile int s_sending;  // 1 until warp 1 saw the send kernels complete
  if (threadIdx.x == 0) {
    s_sending = 1;
    s_early_seen = 0;
    s_ok = 1;
  }
  __syncthreads();
  if (warp_id() == 1) {
    wait_overlapped_grids();  // the send kernels completed, their memory visible (at once if not overlapped)
    if (lane_id() == 0) {
      s_target = ld_volatile_u64(reinterpret_cast<const unsigned long long*>(p.pushed) + g);  // final now
      s_pushed_at = ld_volatile_u64(&st->push_ns);  // diagnostics: their last push to this ring
      __threadfence_block();
      s_sending = 0;
    }
  } else if (warp_id() == 0) {  // the first descriptor, while the send kernels run
    const int got = fetch_descriptor(st, header, mirror, idx, p, g, err, &s_sending);
    if (threadIdx.x == 0) {
      if (got == kFetchError) s_ok = 0;
      if (got == kFetchGot) s_early_seen = clock_ns();
    }
  }
  __syncthreads();
  if (!s_ok) return;  // error word filled
  const unsigned long long target = s_target;
  const uint64_t pushed_at = s_pushed_at;
  uint64_t seen = 0;  // thread 0 (diagnostics): when it saw the current descriptor
  bool first = true;

  while (bytes < target) {
    const uint64_t slot = idx & (kDmaRingCapacity - 1);
    if (warp_id() == 0) {
      const uint64_t asked = clock_ns();
      const bool got = fetch_descriptor(st, header, mirror, idx, p, g, err) == kFetchGot;
      if (threadIdx.x == 0) s_ok = got;
      seen = clock_ns();
      if (threadIdx.x == 0 && b == 0) {
        atomicAdd(&st->wait_ns, (unsigned long long)(seen - asked));
        if (first && got && pushed_at != 0) {  // signed (two's complement): an overlapped launch starts first
          const uint64_t first_seen = s_early_seen != 0 ? s_early_seen : seen;
          atomicAdd(&st->push_seen_ns, (unsigned long long)(first_seen - pushed_at));
          atomicAdd(&st->push_start_ns, (unsigned long long)(began - pushed_at));
          atomicAdd(&st->launches, 1ull);
        }
      }
      first = false;
      if (threadIdx.x == 0 && got) {  // after fetched's acquire; read around L1 (the slot is rewritten every lap)
        const DmaDesc* m = mirror + slot;
        s_desc[0] = *reinterpret_cast<const volatile unsigned long long*>(&m->dst);
        s_desc[1] = *reinterpret_cast<const volatile unsigned long long*>(&m->src);
        s_desc[2] = *reinterpret_cast<const volatile unsigned long long*>(&m->len);
      }
    }
    __syncthreads();
    if (!s_ok) return;  // error word filled; this launch's state is void (the Buffer is failed)
    const uint64_t len = s_desc[2];
    // A skip descriptor (a Write the proxy dropped: its target failed; dma_ring.h) counts its
    // bytes and copies nothing.
    if (s_desc[0] != kDmaSkipDst)
      copy_share(reinterpret_cast<uint8_t*>(s_desc[0]), reinterpret_cast<const uint8_t*>(s_desc[1]), len, b, nb);
    __syncthreads();  // every thread's stores issued (and ordered before thread 0's fence below)
    if (threadIdx.x == 0) {
      fence_release_sys();  // this block's share (ordered by the barrier) released with its count
      if (atomicAdd(finish + slot, 1u) + 1 == unsigned(nb)) {
        finish[slot] = 0u;
        // Ring order: the previous descriptor's last block publishes first (all blocks are resident).
        const uint64_t start = clock_ns();
        while (ld_volatile_u64(&st->done) != idx) {
          if (clock_ns() - start > uint64_t(p.timeout_ns)) {
            raise_error(err, kErrTimeout, kPhaseLLProxyCopy, int(p.rank), -1, g, clock_ns() - start);
            break;
          }
        }
        header->done_ns = clock_ns();  // diagnostics (dma_ring.h); ordered before done by the fence
        // One fence both acquires every block's counted share (their fenced adds to finish, read by
        // ours) and releases them with done: fence + relaxed store is a release pattern.
        // NOTES: was fence_system() then st_release_sys(), two system fences in a row on every
        // descriptor's critical path (a system fence costs ~0.6 us alone on 2 x H200, more
        // behind NVLink stores).
        fence_release_sys();
        st_relaxed_sys(reinterpret_cast<uint64_t*>(&header->done), uint64_t(idx + 1));
        *reinterpret_cast<volatile unsigned long long*>(&st->done) = idx + 1;
        atomicAdd(&st->copy_ns, (unsigned long long)(clock_ns() - seen));
        atomicAdd(&st->descs, 1ull);
      }
    }
    bytes += len;
    ++idx;
    __syncthreads();  // s_desc is rewritten by the next round
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&st->exited, 1ull) + 1 == (unsigned long long)nb) {  // every block of the group left
      st->base_idx = idx;
      st->base_bytes = bytes;
      st->exited = 0;
      __threadfence();
    }
  }
}

// The copy rings change consumers (CopyRingHandoverParams, proxy_session.py): launched on the stream
// before a consumer's launch when the session's rings have two; after every earlier launch on the
// stream, so plain loads see the positions they left.
extern "C" __global__ void __launch_bounds__(64) copy_ring_handover(const UCCL_GRID_CONSTANT CopyRingHandoverParams p) {
  for (int64_t g = threadIdx.x; g < p.num_rings; g += blockDim.x) {
    auto* own = reinterpret_cast<unsigned long long*>(p.own) + g * p.own_stride;
    const unsigned long long at = reinterpret_cast<const unsigned long long*>(p.other)[g * p.other_stride];
    if (at <= *own) continue;
    const int64_t words[3] = {p.word0, p.word1, p.word2};
#pragma unroll
    for (int k = 0; k < 3; ++k)
      if (words[k] >= 0) own[words[k]] = at;
  }
}
