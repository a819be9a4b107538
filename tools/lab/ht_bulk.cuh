// Bulk (TMA) copies for lab probes (probe_nvlink_store.cu): PTX wrappers for cp.async.bulk and
// mbarriers, and CopyStream, a per-warp staging ring that lane 0 drives to move rows global ->
// shared -> global with several chunks in flight and no registers holding data.
//
// NOTES: why a probe would use it. The HT kernels copy with 16-byte loads, 8 per lane in flight, so
// one warp has 4 KiB outstanding; a bulk copy keeps a whole chunk in flight from one instruction,
// loads of the next chunks overlap the stores of the previous ones, and a bulk store to a peer is
// posted. Kernels built on it lost to the 16-byte copies (docs/benchmarks.md, "HT kernel variants"),
// so it lives here, not among the kernel headers.
//
// CUDA only (sm_90 and newer): AMD has no cp.async.bulk.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/wait.cuh"

#if !UCCL_EP_CUDA
#error "ht_bulk.cuh: cp.async.bulk (TMA) is NVIDIA sm_90+ only"
#endif

// Pipeline geometry (-D... to change it). Shared memory per warp = kStreamAreaBytes.
#ifndef UCCL_EP_HT_CHUNK
#define UCCL_EP_HT_CHUNK 2048     // bytes per bulk copy (multiple of 128)
#endif
#ifndef UCCL_EP_HT_STAGES
#define UCCL_EP_HT_STAGES 6       // chunk buffers per warp
#endif
#ifndef UCCL_EP_HT_LOOKAHEAD
#define UCCL_EP_HT_LOOKAHEAD 4    // loads in flight ahead of the oldest store (< STAGES)
#endif
#ifndef UCCL_EP_HT_PUBLISH
#define UCCL_EP_HT_PUBLISH 8      // own tokens between progress publications (before ring caps it)
#endif
#ifndef UCCL_EP_RANKS
#define UCCL_EP_RANKS 8           // ranks the combine's per-rank register arrays are sized for
#endif

namespace uccl_ep::dev::bulk {

constexpr uint32_t kChunk = UCCL_EP_HT_CHUNK;
constexpr int kStages = UCCL_EP_HT_STAGES;
constexpr int kLook = UCCL_EP_HT_LOOKAHEAD;
constexpr int kPublishEvery = UCCL_EP_HT_PUBLISH;
static_assert(kChunk % 128 == 0 && kChunk >= 128, "UCCL_EP_HT_CHUNK: a multiple of 128 bytes");
static_assert(kStages >= 2 && kStages <= 16, "UCCL_EP_HT_STAGES out of range");
static_assert(kLook >= 1 && kLook < kStages, "UCCL_EP_HT_LOOKAHEAD: 1 .. STAGES-1");
static_assert(kPublishEvery >= 1, "UCCL_EP_HT_PUBLISH >= 1");
constexpr int kRanks = UCCL_EP_RANKS;
static_assert(kRanks >= 1 && kRanks <= kHTMaxRanks, "UCCL_EP_RANKS: 1 .. kHTMaxRanks");

// Control words of one stream: per stage an mbarrier, the store destination, its length and a tag.
constexpr uint32_t kCtrlBytes = (uint32_t(kStages) * (8 + 8 + 8 + 4) + 127) / 128 * 128;
// Bytes of shared memory each warp owns (the combine receiver lays the same bytes out its own way).
constexpr uint32_t kStreamAreaBytes = uint32_t(kStages) * kChunk + kCtrlBytes;

// ---- PTX -------------------------------------------------------------------------------------------
UCCL_DEVICE uint32_t saddr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

UCCL_DEVICE uint32_t dynamic_smem_bytes() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
  return v;
}

UCCL_DEVICE void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(bar)), "r"(arrivals) : "memory");
}

// Makes mbarrier.init visible to the async proxy (the copy engine completes transactions on it).
UCCL_DEVICE void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival plus `bytes` of expected transactions; the phase completes when both are in.
UCCL_DEVICE void arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bar)), "r"(bytes) : "memory");
}

// Acquire (CTA scope, the default of try_wait): a true result makes the copy engine's writes
// into shared memory visible to this thread.
UCCL_DEVICE bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(saddr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// global -> shared, completing `bytes` transactions on `bar`. 16-byte aligned, multiple of 16.
UCCL_DEVICE void load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   saddr(smem)),
               "l"(gmem), "r"(bytes), "r"(saddr(bar))
               : "memory");
}

// shared -> global (local or a peer's NVLink-mapped memory), tracked by bulk groups.
UCCL_DEVICE void store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem), "r"(saddr(smem)),
               "r"(bytes)
               : "memory");
}

UCCL_DEVICE void commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Every bulk group but the N most recent has finished READING its shared memory source.
template <int N>
UCCL_DEVICE void wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Every bulk group but the N most recent has COMPLETED (its writes are performed).
template <int N>
UCCL_DEVICE void wait_done() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Orders this thread's async-proxy (bulk copy) global accesses against its generic-proxy ones:
// after wait_done, before a release that publishes the stored rows; after an acquire, before
// bulk-loading what the acquire made visible.
UCCL_DEVICE void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// Where a bounded wait reports to (the same error word and phases as the default kernels).
struct WaitSite {
  ErrorWord* err;
  uint64_t timeout_ns;
  int phase, rank, peer, channel;
};

// Bounded wait for an mbarrier phase (a local copy completing: only a broken copy or a fault
// elsewhere outlives it). Every thread that reads the copied shared memory calls it.
UCCL_DEVICE bool wait_bar(uint64_t* bar, uint32_t parity, const WaitSite& site) {
  if (try_wait(bar, parity)) return true;
  const uint64_t start = clock_ns();
  for (uint32_t spins = 1;; ++spins) {
    if (try_wait(bar, parity)) return true;
    if ((spins & 1023u) == 0) {
      const uint64_t now = clock_ns();
      if (now - start > site.timeout_ns) {
        raise_error(site.err, kErrTimeout, site.phase, site.rank, site.peer, site.channel, now - start);
        return false;
      }
      if (error_raised(site.err)) return false;
    }
  }
}

// The whole warp waits for a phase: lane 0 with the bound, then every other lane acquires the
// (already completed) phase itself, so each sees the copied bytes. Same result in every lane.
UCCL_DEVICE bool warp_wait_bar(uint64_t* bar, uint32_t parity, const WaitSite& site) {
  bool ok = true;
  if (lane_id() == 0) ok = wait_bar(bar, parity, site);
  ok = shfl_idx(ok ? 1 : 0, 0) != 0;
  if (ok && lane_id() != 0) (void)wait_bar(bar, parity, site);  // returns at once: the phase completed
  return ok;
}

// ---- the per-warp staging ring ------------------------------------------------------------------
// Lane 0 of the owning warp is the only caller of everything but init/area.
//   push(src, dst, n, tag): bulk-load n bytes (<= kChunk) of src into the next stage; once kLook
//     loads are outstanding, first pops the oldest: waits for its load and bulk-stores it to its
//     dst (dst 0: nothing stored, the load only fed the tag).
//   tags: a nonzero tag rides with a chunk; when the chunk is popped, *done = tag. Callers tag
//     the last chunk of a token with (its ring position + 1), so *done says "every token of this
//     warp below this position has been loaded, and its stores issued".
//   flush: pop everything. Stores are still in flight until wait_done<0>().
// Stage reuse: the stage loaded by push #n was last stored by pop #(n - kStages); at least
// kStages - kLook stores were issued after that one, so wait_read<kStages - kLook> frees it.
struct CopyStream {
  uint8_t* buf;       // kStages * kChunk, 128-aligned
  uint64_t* bar;      // kStages mbarriers
  uint64_t* dst;      // per stage: store destination (0 = none)
  uint64_t* tag;      // per stage: tag delivered when popped (0 = none)
  uint32_t* len;      // per stage: bytes
  uint32_t loaded, stored;

  // All lanes call; `area` = this warp's kStreamAreaBytes of shared memory, 128-aligned.
  UCCL_DEVICE void init(uint8_t* area) {
    buf = area;
    bar = reinterpret_cast<uint64_t*>(area + kStages * kChunk);
    dst = bar + kStages;
    tag = dst + kStages;
    len = reinterpret_cast<uint32_t*>(tag + kStages);
    loaded = stored = 0;
    if (lane_id() == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(bar + s, 1);
      fence_mbar_init();
    }
    sync_warp();
  }

  UCCL_DEVICE bool pop(uint64_t* done, const WaitSite& site) {
    const int s = int(stored % kStages);
    if (!wait_bar(bar + s, (stored / kStages) & 1u, site)) return false;
    if (dst[s] != 0) store(reinterpret_cast<void*>(dst[s]), buf + s * kChunk, len[s]);
    commit();  // one group per pop, even when empty: wait_read's count relies on it
    if (tag[s] != 0) *done = tag[s];
    ++stored;
    return true;
  }

  UCCL_DEVICE bool push(const void* src, void* to, uint32_t bytes, uint64_t tg, uint64_t* done,
                        const WaitSite& site) {
    if (loaded - stored >= uint32_t(kLook) && !pop(done, site)) return false;
    wait_read<kStages - kLook>();
    const int s = int(loaded % kStages);
    dst[s] = reinterpret_cast<uint64_t>(to);
    tag[s] = tg;
    len[s] = bytes;
    arrive_expect(bar + s, bytes);
    load(buf + s * kChunk, src, bytes, bar + s);
    ++loaded;
    return true;
  }

  // A row of `bytes` (multiple of 16) in kChunk pieces; the last piece carries `tg`.
  UCCL_DEVICE bool push_row(const uint8_t* src, uint8_t* to, int64_t bytes, uint64_t tg, uint64_t* done,
                            const WaitSite& site) {
    for (int64_t off = 0; off < bytes; off += kChunk) {
      const uint32_t n = uint32_t(bytes - off < int64_t(kChunk) ? bytes - off : kChunk);
      if (!push(src + off, to != nullptr ? to + off : nullptr, n, off + kChunk >= bytes ? tg : 0, done, site))
        return false;
    }
    return true;
  }

  UCCL_DEVICE bool flush(uint64_t* done, const WaitSite& site) {
    while (stored < loaded)
      if (!pop(done, site)) return false;
    return true;
  }
};

// Shared memory of warp `warp` (dynamic shared memory base, 1 KiB aligned).
UCCL_DEVICE uint8_t* warp_area(uint8_t* smem, int warp) { return smem + size_t(warp) * kStreamAreaBytes; }

}  // namespace uccl_ep::dev::bulk
