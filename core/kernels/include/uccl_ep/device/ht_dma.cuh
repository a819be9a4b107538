// The copy role of the normal-mode proxy kernels: the `ipc` transport's "kernel" copy engine
// (dma_ring.h) run by extra blocks of the very kernel whose Writes it copies.
//
// Why inside the kernel: a normal-mode stream gets credits back only for rows its receiver
// consumed, and those rows arrive only once copied, so the copies must run while the kernel that
// pushed them runs. Extra blocks of the same grid are resident with it (the grid fits the device),
// which a second kernel on another stream would not guarantee.
//
// Per proxy thread (one copy ring each), `blocks_per_ring` blocks:
//   fetcher  warp 0 of the ring's first block: takes posted descriptors from the host ring (up to a
//            warp's width per PCIe round trip), cuts each into units of at most unit_bytes, publishes
//            them (HtDmaRing::units, release; none for a skip descriptor, whose bytes only count:
//            dma_ring.h), and publishes `done` to the ring header in ring order
//            once every piece of a descriptor is copied (a system-scope release, which the proxy
//            acquires before it hands the Write's immediate to the receiving proxy). It knows the
//            launch's work is complete once every main-block sender signalled (HtDmaContext::signals:
//            their pushes and byte counts are final then) and the descriptors taken cover the bytes
//            they pushed on its thread's FIFOs; then it sets `stop` and leaves.
//   workers  every other warp: claims a unit (one device atomic), waits for it to be published (or for
//            `stop`), copies it, fences its stores at system scope and counts its descriptor's pieces
//            down; the warp that copies the last piece marks the descriptor finished.
// Positions are cumulative over launches (HtDmaRing), like the rings' own.
//
// NOTES: units of one descriptor go to several warps and many descriptors are in flight at once, so
// the copy rate does not hang on one descriptor's fences; only the fetcher reads host memory (one
// batch per round trip, then the next slot's seq alone while nothing is posted: reads polled back to
// back at lines the proxy writes slow both sides).
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/dma_ring.h"
#include "uccl_ep/fifo_device.cuh"
#include "uccl_ep/kernel_abi.h"

namespace uccl_ep::dev {

UCCL_DEVICE const HtDmaContext* dma_context(uint64_t p) { return reinterpret_cast<const HtDmaContext*>(p); }

// A sender: the bytes of a Write about to be pushed on FIFO `fifo` (its proxy thread's copy ring
// will carry them). Before the push; no-op without a copy role.
UCCL_DEVICE void dma_count_push(const HtDmaContext* d, int fifo, uint64_t bytes) {
  if (d == nullptr || bytes == 0) return;
  atomicAdd(reinterpret_cast<unsigned long long*>(d->pushed) + fifo % int(d->num_rings), (unsigned long long)bytes);
}

// A main-block thread that pushed its last Write: its share of the launch's signals. Every pusher
// signals after its pushes (the kernels: lane 0 of every warp of the main blocks, as it leaves).
UCCL_DEVICE void dma_signal(const HtDmaContext* d) {
  if (d == nullptr) return;
  __threadfence();  // its byte counts (dma_count_push) before the signal the fetcher acquires
  atomicAdd(reinterpret_cast<unsigned long long*>(d->signals), 1ull);
}

namespace ht_dma_detail {

UCCL_DEVICE uint64_t shfl64(uint64_t v, int src) {
  const uint32_t lo = uint32_t(shfl_idx(int(uint32_t(v)), src));
  const uint32_t hi = uint32_t(shfl_idx(int(uint32_t(v >> 32)), src));
  return uint64_t(lo) | (uint64_t(hi) << 32);
}

UCCL_DEVICE uint64_t ld_volatile64(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }
UCCL_DEVICE uint32_t ld_volatile32(const uint32_t* p) { return *reinterpret_cast<const volatile uint32_t*>(p); }

// One warp copies [src, +len) to dst: 8 loads in flight per lane, around L1 (the source is staging
// written by other SMs of this GPU); bytes when anything is unaligned.
constexpr int kInFlight = 8;
UCCL_DEVICE void warp_copy_unit(uint8_t* dst, const uint8_t* src, uint64_t len) {
  const int lane = lane_id();
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | len) & 15u) != 0) {
    for (uint64_t i = uint64_t(lane); i < len; i += kWarpSize) dst[i] = src[i];
    return;
  }
  const uint64_t n = len / 16;
  uint64_t i = uint64_t(lane);
  for (; i + uint64_t(kInFlight - 1) * kWarpSize < n; i += uint64_t(kInFlight) * kWarpSize) {
    Vec16 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) v[k] = ld16_cg(src + (i + uint64_t(k) * kWarpSize) * 16);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) st16(dst + (i + uint64_t(k) * kWarpSize) * 16, v[k]);
  }
  for (; i < n; i += kWarpSize) st16(dst + i * 16, ld16_cg(src + i * 16));
}

struct RingView {
  HtDmaRing* st;
  DmaRingHeader* header;
  const DmaDesc* slots;
  uint32_t* left;
  uint32_t* finish;
  uint64_t* unit_end;
  HtDmaUnit* units;
};

UCCL_DEVICE RingView ring_view(const HtDmaContext* d, int g) {
  RingView v;
  v.st = reinterpret_cast<HtDmaRing*>(d->state) + g;
  v.header = reinterpret_cast<DmaRingHeader*>(reinterpret_cast<const uint64_t*>(d->rings)[g]);
  v.slots = reinterpret_cast<const DmaDesc*>(v.header + 1);
  v.left = reinterpret_cast<uint32_t*>(d->left) + int64_t(g) * int64_t(kDmaRingCapacity);
  v.finish = reinterpret_cast<uint32_t*>(d->finish) + int64_t(g) * int64_t(kDmaRingCapacity);
  v.unit_end = reinterpret_cast<uint64_t*>(d->unit_end) + int64_t(g) * int64_t(kDmaRingCapacity);
  v.units = reinterpret_cast<HtDmaUnit*>(d->units) + int64_t(g) * int64_t(kHtDmaUnitCapacity);
  return v;
}

// The fetcher (one whole warp) of ring g; returns after setting `stop`.
UCCL_DEVICE void fetch_and_publish(const HtDmaContext* d, int g, int64_t senders, ErrorWord* err) {
  const RingView r = ring_view(d, g);
  const int lane = lane_id();
  const uint64_t cap_mask = kDmaRingCapacity - 1, unit_mask = kHtDmaUnitCapacity - 1;
  const uint64_t U = uint64_t(d->unit_bytes);
  const uint64_t* pushed = reinterpret_cast<const uint64_t*>(d->pushed) + g;
  // this warp is the only writer of these while the launch runs
  uint64_t idx = ld_volatile64(&r.st->base_idx), bytes = ld_volatile64(&r.st->base_bytes);
  uint64_t done = idx, units = ld_volatile64(&r.st->units), retired = units;
  uint64_t target = ~uint64_t(0);  // bytes every sender of this launch pushed to this ring (once known)
  bool found_none = false, failed = false;
  uint64_t last_progress = clock_ns();
  // diagnostics (HtDmaRing): cycles per stage (every lane counts; lane 0 adds its own to the ring's
  // sums as the fetcher leaves)
  uint64_t passes = 0, c_read = 0, c_take = 0, c_scan = 0, c_publish = 0;
  const uint64_t first_ns = clock_ns(), first_cycles = uint64_t(clock64());
  uint64_t stamp = first_cycles;
  auto lap = [&](uint64_t& sum) {
    const uint64_t now = uint64_t(clock64());
    sum += now - stamp;
    stamp = now;
  };
  for (uint32_t spins = 1;; ++spins) {
    bool progress = false;
    ++passes;
    stamp = uint64_t(clock64());
    if (target == ~uint64_t(0)) {
      uint64_t t = ~uint64_t(0);
      // acquire (gpu): the senders' signals come after their byte counts (dma_signal)
      if (lane == 0 && ld_acquire_gpu(reinterpret_cast<const uint64_t*>(d->signals)) >= uint64_t(senders))
        t = ld_volatile64(pushed);
      target = shfl64(t, 0);
    }
    if (bytes < target) {
      int look = 1;
      if (found_none && lane == 0) look = ld_volatile64(&r.slots[idx & cap_mask].seq) == idx + 1;
      if (shfl_idx(look, 0)) {
        const uint64_t k = idx + uint64_t(lane);
        const DmaDesc* slot = r.slots + (k & cap_mask);
        uint64_t dst, src, len, seq;
        ld_volatile_v2(&slot->dst, dst, src);
        ld_volatile_v2(&slot->len, len, seq);
        const uint64_t tag = dma_tag(k);
        const bool posted = seq == k + 1 && (dst & ~kDmaFieldMask) == tag && (src & ~kDmaFieldMask) == tag &&
                            (len & ~kDmaFieldMask) == tag;
        const uint64_t run = warp_ballot(posted);
        int n = ffs64(~run) == 0 ? kWarpSize : ffs64(~run) - 1;  // posted slots in a row from idx
        dst &= kDmaFieldMask, src &= kDmaFieldMask, len &= kDmaFieldMask;
        // a skip descriptor (a Write the proxy dropped, dma_ring.h): its bytes count, no units
        const int pieces = lane < n && dst != kDmaSkipDst ? int((len + U - 1) / U) : 0;
        int total = 0;
        const int before = warp_exclusive_scan(pieces, &total);
        // room: never more than the unit ring holds beyond the units of finished descriptors
        const bool fits = lane < n && units + uint64_t(before + pieces) - retired <= kHtDmaUnitCapacity;
        const uint64_t fit = warp_ballot(fits);
        n = ffs64(~fit) == 0 ? kWarpSize : ffs64(~fit) - 1;
        found_none = n == 0 && run == 0;
        lap(c_read);
        if (n > 0) {
          // acquire: the proxy released seq after the fields, having acquired the senders' command
          // (and so their staged bytes); the units below carry that to the workers.
          fence_release_sys();
          if (lane < n) {
            const uint64_t s = k & cap_mask;
            r.left[s] = uint32_t(pieces);
            r.unit_end[s] = units + uint64_t(before + pieces);
            for (int q = 0; q < pieces; ++q) {
              HtDmaUnit* e = r.units + ((units + uint64_t(before + q)) & unit_mask);
              const uint64_t at = uint64_t(q) * U;
              e->dst = dst + at;
              e->src = src + at;
              e->len = len - at < U ? len - at : U;
              e->desc = k;
            }
            if (pieces == 0) r.finish[s] = uint32_t(k + 1);
          }
          const int taken_units = shfl_idx(before + pieces, n - 1);
          uint64_t taken_bytes = lane < n ? len : 0;
          for (int o = kWarpSize / 2; o > 0; o /= 2) {
            const uint32_t lo = uint32_t(shfl_xor(int(uint32_t(taken_bytes)), o));
            const uint32_t hi = uint32_t(shfl_xor(int(uint32_t(taken_bytes >> 32)), o));
            taken_bytes += uint64_t(lo) | (uint64_t(hi) << 32);
          }
          sync_warp();
          units += uint64_t(taken_units);
          if (lane == 0) {
            __threadfence();  // the entries, counts and finish marks before the release below
            st_release_gpu(&r.st->units, units);
            // diagnostics (dma_ring.h): the last descriptor taken and when; the proxy reads them once
            // it sees that descriptor done (posted -> seen on the host clock, ipc_copy.cc)
            st_relaxed_sys(&r.header->seen_idx, idx + uint64_t(n) - 1);
            st_relaxed_sys(&r.header->seen_ns, clock_ns());
          }
          idx += uint64_t(n);
          bytes += taken_bytes;
          progress = true;
          lap(c_take);
        }
      }
    }
    // `done` in ring order: every descriptor below it fully copied.
    uint64_t d_new = done;
    if (lane == 0)
      while (d_new < idx && ld_volatile32(r.finish + (d_new & cap_mask)) == uint32_t(d_new + 1)) ++d_new;
    d_new = shfl64(d_new, 0);
    lap(c_scan);
    if (d_new > done) {
      if (lane == 0) {
        retired = ld_volatile64(r.unit_end + ((d_new - 1) & cap_mask));
        // One fence both acquires the workers' finish marks (after their system-scope fences) and
        // releases their copies with `done` (fence + relaxed store: a release pattern).
        st_relaxed_sys(&r.header->done_ns, clock_ns());  // diagnostics; ordered before done by the fence
        fence_release_sys();
        st_relaxed_sys(&r.header->done, d_new);
        r.st->descs += d_new - done;
      }
      retired = shfl64(retired, 0);
      done = d_new;
      progress = true;
      lap(c_publish);
    }
    if (target != ~uint64_t(0) && bytes >= target && done == idx) {
      if (bytes > target && lane == 0)  // descriptors this launch's senders never counted
        raise_error(err, kErrProtocol, kPhaseHTProxyCopy, int(d->rank), int(d->rank), g, 0);
      break;
    }
    const uint64_t now = progress ? clock_ns() : 0;
    if (progress) {
      last_progress = now;
      continue;
    }
    pause_ns(found_none ? 200 : 50);
    if ((spins & 255u) == 0) {
      int ok = 1;
      // bounded: twice the wait budget without progress (a sender's own waits give up first and
      // name the peer they waited for), or the proxy stopped, or another wait's error
      if (lane == 0)
        ok = proxy_wait_ok(last_progress, reinterpret_cast<const uint64_t*>(d->status), 2 * uint64_t(d->timeout_ns),
                           err, kPhaseHTProxyCopy, int(d->rank), int(d->rank), g);
      if (!shfl_idx(ok, 0)) {
        failed = true;
        break;
      }
    }
  }
  if (lane == 0) {
    r.st->passes += passes;
    r.st->read_cycles += c_read;
    r.st->take_cycles += c_take;
    r.st->scan_cycles += c_scan;
    r.st->publish_cycles += c_publish;
    r.st->pass_ns += clock_ns() - first_ns;
    r.st->pass_cycles += uint64_t(clock64()) - first_cycles;
    r.st->base_idx = idx;
    r.st->base_bytes = bytes;
    __threadfence();
    // workers whose claim is at or past `units` leave (all of them after a failure)
    *reinterpret_cast<volatile uint64_t*>(&r.st->stop) = failed ? 0 : units;
  }
  sync_warp();
}

// A worker warp of ring g: units until `stop`.
UCCL_DEVICE void copy_units(const HtDmaContext* d, int g, ErrorWord* err) {
  const RingView r = ring_view(d, g);
  const int lane = lane_id();
  const uint64_t start = clock_ns();
  for (;;) {
    uint64_t u = 0;
    int go = 0;
    if (lane == 0) {
      u = atomicAdd(reinterpret_cast<unsigned long long*>(&r.st->claimed), 1ull);
      for (uint32_t spins = 1;; ++spins) {
        if (ld_acquire_gpu(&r.st->units) > u) {  // acquire: pairs with the fetcher's release
          go = 1;
          break;
        }
        if (ld_volatile64(&r.st->stop) <= u) break;
        // the fetcher always sets stop before it leaves; this is a backstop only
        if ((spins & 1023u) == 0 && (error_raised(err) || clock_ns() - start > 4 * uint64_t(d->timeout_ns))) break;
        pause_ns(64);
      }
    }
    if (!shfl_idx(go, 0)) return;
    u = shfl64(u, 0);
    const HtDmaUnit* e = r.units + (u & (kHtDmaUnitCapacity - 1));
    const uint64_t dst = ld_volatile64(&e->dst), src = ld_volatile64(&e->src), len = ld_volatile64(&e->len),
                   desc = ld_volatile64(&e->desc);
    warp_copy_unit(reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(src), len);
    sync_warp();  // every lane's stores issued before lane 0's fence
    if (lane == 0) {
      fence_release_sys();  // this warp's copy, system-wide, before its count
      const uint64_t s = desc & (kDmaRingCapacity - 1);
      if (atomicSub(r.left + s, 1u) == 1u) {
        __threadfence();  // the other pieces' counted copies before the finish mark
        atomicExch(r.finish + s, uint32_t(desc + 1));
      }
    }
  }
}

}  // namespace ht_dma_detail

// The copy role for block `b` of the launch's `dma_blocks` copy blocks (blocks_per_ring per ring).
// `senders`: the signals the main blocks give this launch. Contains __syncthreads (every thread of
// the block calls it).
UCCL_DEVICE void ht_dma_role(const HtDmaContext* d, int b, int dma_blocks, int64_t senders, ErrorWord* err) {
  const int n = int(d->num_rings);
  const int per = dma_blocks / n;
  const int g = b / per;
  if (g < n) {
    if (b % per == 0 && warp_id() == 0) ht_dma_detail::fetch_and_publish(d, g, senders, err);
    else ht_dma_detail::copy_units(d, g, err);
  }
  __syncthreads();
  if (threadIdx.x != 0 || g >= n) return;
  HtDmaRing* st = reinterpret_cast<HtDmaRing*>(d->state) + g;
  __threadfence();
  if (atomicAdd(reinterpret_cast<unsigned long long*>(&st->exited), 1ull) + 1 != (unsigned long long)per) return;
  // The ring's last block to leave: every worker of it is gone, the next launch claims from `units`.
  st->claimed = ld_acquire_gpu(&st->units);
  st->stop = kHtDmaRunning;
  st->exited = 0;
  __threadfence();
  auto* exited = reinterpret_cast<unsigned long long*>(d->exited);
  if (atomicAdd(exited, 1ull) + 1 == (unsigned long long)n) {  // every ring done: signals of the next launch from 0
    *reinterpret_cast<volatile uint64_t*>(d->signals) = 0;
    *exited = 0;
    __threadfence();
  }
}

// Kernel prologue: true (after running the copy role) when this block is one of the launch's copy
// blocks, the last `dma_blocks` of the grid.
template <class P>
UCCL_DEVICE bool ht_dma_block(const P& p) {
  if (p.dma_blocks <= 0 || int64_t(blockIdx.x) < int64_t(gridDim.x) - p.dma_blocks) return false;
  ht_dma_role(dma_context(p.dma), int(int64_t(blockIdx.x) - (int64_t(gridDim.x) - p.dma_blocks)), int(p.dma_blocks),
              p.dma_senders, reinterpret_cast<ErrorWord*>(p.error));
  return true;
}

// Kernel epilogue of a main block: lane 0 of each warp signals once its warp is done (its pushes too).
template <class P>
UCCL_DEVICE void ht_dma_warp_done(const P& p) {
  if (p.dma_blocks > 0 && lane_id() == 0) dma_signal(dma_context(p.dma));
}

}  // namespace uccl_ep::dev
