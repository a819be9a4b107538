// uccl_ep wire protocol, part 4: the copy ring of the `ipc` transport's "kernel" copy engine (a
// stand-in for a NIC's DMA engine on a host without NICs).
//
// The sending proxy thread does not copy: it writes one descriptor {dst, src, len} per Write into
// a ring in host memory and goes on; a GPU kernel of the sender (transport/copy_ring.cu, launched by the
// LL proxy path right after each send kernel) reads the descriptors in order, copies the bytes
// over NVLink into the receiver's region, and publishes how many descriptors are complete. The
// proxy then hands the Write's immediate to the receiving proxy, as an RDMA write with immediate.
//
//   header.done     descriptors complete (every index < done): written by the consumer with
//                   release (the GPU: st.release.sys after its copies), read by the proxy with
//                   acquire before it delivers immediates. header.done_ns (diagnostics): when.
//   slots[capacity] descriptors; the proxy fills dst, src, len, then release-stores seq = index + 1
//                   (so a stale slot of the previous lap never matches). dst, src and len each carry
//                   the descriptor's lap tag in their top bits (dma_tag), so every word says by
//                   itself which lap wrote it: the consumer reads all four words at once, without
//                   ordering between them, and takes the slot only when seq and the three tags
//                   match (a word read before the proxy rewrote it carries the previous lap's tag).
//
// Skip descriptors: dst == kDmaSkipDst (0, with its lap tag) stands for a Write the proxy dropped
// (its target failed or left: transport.h discard). The consumers count bytes -- the copy kernel
// returns once its ring's descriptors cover the bytes the send kernels pushed, the normal-mode copy
// role likewise -- so a dropped Write must still arrive as `len` bytes: the consumer counts them,
// copies nothing and publishes `done` as for any descriptor. No region is at address 0.
//
// Single producer (the proxy thread owning the endpoint), single logical consumer. The producer
// never has more than `capacity` descriptors not done: the transport's outstanding-write bound is
// below it (checked at set-up), so a slot is reused only after its copy completed.
//
// NOTES: why a ring in host memory read by a kernel, and not cuMemcpyDtoDAsync from the proxy
// thread (the "cuda" engine): every CUDA call the proxy makes can wait inside the driver behind
// the application thread (which may itself wait for a kernel that waits for this very copy);
// measured on 2 x H200, posting-to-delivery averaged 120-660 us per Write that way. A NIC takes
// descriptors from host memory without any driver call; so does this ring.
#pragma once

#include <stdint.h>

#include "uccl_ep/protocol.h"  // UCCL_EP_HOST_DEVICE

namespace uccl_ep {

struct DmaDesc {
  uint64_t dst;  // destination address as the consumer sees it (the peer's mapped region)
  uint64_t src;  // source address (this rank's region)
  uint64_t len;  // bytes
  uint64_t seq;  // index + 1 once the fields above are valid (release)
};
static_assert(sizeof(DmaDesc) == 32, "DmaDesc is part of the host/device ABI");

struct DmaRingHeader {
  uint64_t done;     // descriptors complete
  uint64_t done_ns;  // diagnostics: the consumer's clock when it last published done (GPU: %globaltimer,
                     // which the driver keeps near the host's CLOCK_REALTIME); written before done
  // diagnostics, written by the consumer when it takes descriptors (plain stores, read by the
  // producer once it sees them done): the last one taken, the consumer's clock then, and the
  // consumer's clock of the push that asked for it (the send kernels' stamp, DmaConsumer::push_ns)
  uint64_t seen_idx;
  uint64_t seen_ns;
  uint64_t push_ns;
  uint64_t pad[3];
};
static_assert(sizeof(DmaRingHeader) == 64, "DmaRingHeader is part of the host/device ABI");

// The consumer's state per ring, in device memory next to the rings' table (ll_proxy.py lays it
// out: ring table u64[n] | pushed bytes u64[n] | DmaConsumer[n] | ...), zero at start. Written by
// the copy kernel, except push_ns, which the send kernels stamp after their pushes (diagnostics).
struct DmaConsumer {
  unsigned long long base_idx;    // first descriptor of the next launch
  unsigned long long base_bytes;  // bytes of the descriptors before it
  unsigned long long done;        // descriptors published as complete (mirror of the ring header's)
  unsigned long long exited;      // blocks of this launch that left
  // diagnostics, summed over launches (read by the host between ops: ProxyLowLatencyEngine)
  unsigned long long wait_ns;     // block 0 waiting for descriptors (the proxy posting them)
  unsigned long long copy_ns;     // descriptor seen -> completion published (its last block's view)
  unsigned long long descs;       // descriptors completed
  unsigned long long fetched;     // descriptors copied into the device mirror (fetch_descriptor)
  unsigned long long fetch_lock;  // 1 while a warp reads the host ring (fetch_descriptor)
  unsigned long long push_ns;     // GPU clock of the last send kernel's pushes to this ring's proxy thread
  unsigned long long push_seen_ns;   // summed per launch: that push -> the launch's first descriptor seen
  unsigned long long push_start_ns;  // summed per launch: that push -> this kernel started (launch gap)
  unsigned long long launches;       // launches that found a push stamp and a descriptor
  unsigned long long pad[3];
};
static_assert(sizeof(DmaConsumer) == 128, "DmaConsumer is part of the host/device ABI (ll_proxy.py)");

// dst of a skip descriptor (see above).
constexpr uint64_t kDmaSkipDst = 0;

// Descriptors per ring (power of two); above any transport's outstanding-write bound (8192).
constexpr uint64_t kDmaRingCapacity = 8192;

// Lap tags (see the header comment): bits [57, 64) of dst, src and len hold (lap + 1) mod 128 of
// the descriptor's index, lap = index / capacity; + 1 so that the zeroed ring of lap 0 never
// matches. Device addresses and lengths stay below 2^57 (the producer refuses others).
// NOTES: one PCIe round trip per fetch instead of two (seq with acquire, then the fields). On
// 2 x H200 that did not shorten the copy kernel's pick-up (the descriptor seen ~10 us after the
// push either way, ~7 of them after the kernel's launch; docs/benchmarks.md), so the cost there is
// not the count of dependent reads; the tags stay as the simpler protocol.
constexpr int kDmaTagShift = 57;
constexpr uint64_t kDmaFieldMask = (uint64_t(1) << kDmaTagShift) - 1;
UCCL_EP_HOST_DEVICE constexpr uint64_t dma_tag(uint64_t index) {
  return ((index / kDmaRingCapacity + 1) & 0x7f) << kDmaTagShift;
}

// Bytes of one ring: header, then the slots.
constexpr uint64_t dma_ring_bytes() { return sizeof(DmaRingHeader) + kDmaRingCapacity * sizeof(DmaDesc); }

// ---- the copy role of the normal-mode proxy kernels (device/ht_dma.cuh) ----------------------------
// Normal mode's ring streams need their Writes copied while the kernel that pushed them still runs
// (credits come back only for copied rows), so the copy work runs inside those kernels: extra blocks
// of the same grid. Per ring, one fetcher warp takes descriptors from the host ring, cuts each into
// units of at most unit_bytes and publishes them; every other warp of the ring's blocks claims units,
// copies them and counts the descriptor's pieces down; the fetcher publishes `done` in ring order.

// Per ring, in device memory; zero at set-up except `stop` (kHtDmaRunning).
struct HtDmaRing {
  uint64_t base_idx;       // first descriptor of the next launch
  uint64_t base_bytes;     // bytes of every descriptor before it
  uint64_t units;          // units published (cumulative; release by the fetcher)
  uint64_t claimed;        // units claimed by workers (runs past `units` by the idle claims; reset at exit)
  uint64_t stop;           // workers whose claim is >= stop leave (kHtDmaRunning while the launch runs)
  uint64_t exited;         // blocks of this launch that left
  uint64_t descs;          // diagnostics, summed over launches: descriptors copied
  // diagnostics, summed over launches: the fetcher's passes and their SM cycles by stage (reading
  // the host ring's slots, taking descriptors, scanning finish marks, publishing done), and the
  // passes' wall time (%globaltimer ns: cycles per ns on the host's side)
  uint64_t passes;
  uint64_t read_cycles;
  uint64_t take_cycles;
  uint64_t scan_cycles;
  uint64_t publish_cycles;
  uint64_t pass_ns;
  uint64_t pass_cycles;
  uint64_t pad[2];
};
static_assert(sizeof(HtDmaRing) == 128, "HtDmaRing is part of the host/device ABI (ht_proxy.py)");
constexpr uint64_t kHtDmaRunning = ~uint64_t(0);

// One unit of copy work: bytes [src, +len) to dst, piece of descriptor `desc`.
struct HtDmaUnit {
  uint64_t dst, src, len, desc;
};
static_assert(sizeof(HtDmaUnit) == 32, "HtDmaUnit is part of the host/device ABI");

// Units per ring (power of two). The fetcher never publishes more than this many units beyond the
// last descriptor published done, so a unit slot is rewritten only after its copy completed.
constexpr uint64_t kHtDmaUnitCapacity = 32768;

// What the copy role needs, in device memory, written once at set-up (ht_proxy.py).
struct HtDmaContext {
  uint64_t rings;       // u64[n]: device address of each proxy thread's copy ring (DmaRingHeader + slots)
  uint64_t pushed;      // u64[n]: bytes of the Writes pushed to each proxy thread (cumulative, by senders)
  uint64_t state;       // HtDmaRing[n]
  uint64_t left;        // u32[n][kDmaRingCapacity]: pieces of a descriptor still to copy
  uint64_t finish;      // u32[n][kDmaRingCapacity]: low 32 bits of index + 1 once the descriptor is copied
  uint64_t unit_end;    // u64[n][kDmaRingCapacity]: units published up to the end of the descriptor
  uint64_t units;       // HtDmaUnit[n][kHtDmaUnitCapacity]
  uint64_t signals;     // u64: main-block signals of the running launch (senders that finished pushing)
  uint64_t exited;      // u64: copy blocks of the running launch that left (the last resets `signals`)
  uint64_t status;      // a FIFO status word of the proxy (mapped host memory)
  int64_t num_rings;    // proxy threads (one copy ring each); FIFO f belongs to thread f % num_rings
  int64_t unit_bytes;   // largest unit (multiple of 16)
  int64_t rank;
  int64_t timeout_ns;
  int64_t pad[2];
};
static_assert(sizeof(HtDmaContext) == 128, "HtDmaContext is part of the host/device ABI (ht_proxy.py)");

}  // namespace uccl_ep
