// uccl_ep wire protocol, part 4: the copy ring of the `ipc` transport's "kernel" copy engine (a
// stand-in for a NIC's DMA engine on a host without NICs).
//
// The sending proxy thread does not copy: it writes one descriptor {dst, src, len} per Write into
// a ring in host memory and goes on; a GPU kernel of the sender (ll_proxy_dma.cu, launched by the
// LL proxy path right after each send kernel) reads the descriptors in order, copies the bytes
// over NVLink into the receiver's region, and publishes how many descriptors are complete. The
// proxy then hands the Write's immediate to the receiving proxy, as an RDMA write with immediate.
//
//   header.done     descriptors complete (every index < done): written by the consumer with
//                   release (the GPU: st.release.sys after its copies), read by the proxy with
//                   acquire before it delivers immediates. header.done_ns (diagnostics): when.
//   slots[capacity] descriptors; the proxy fills dst, src, len, then release-stores seq = index + 1
//                   (so a stale slot of the previous lap never matches); the consumer acquire-loads
//                   seq before reading the rest.
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
  uint64_t pad[6];
};
static_assert(sizeof(DmaRingHeader) == 64, "DmaRingHeader is part of the host/device ABI");

// Descriptors per ring (power of two); above any transport's outstanding-write bound (8192).
constexpr uint64_t kDmaRingCapacity = 8192;

// Bytes of one ring: header, then the slots.
constexpr uint64_t dma_ring_bytes() { return sizeof(DmaRingHeader) + kDmaRingCapacity * sizeof(DmaDesc); }

}  // namespace uccl_ep
