// `ipc` transport: same-host peers, where the SENDING proxy copies the bytes into the receiver's
// registered region and only then hands the immediate to the receiving proxy -- the contract of an
// RDMA write with immediate, carried out by a copy engine instead of a NIC.
//
//   sender proxy thread                                   receiver proxy thread
//   write(): bounds check, CopyEngine::submit()  ---->    (bytes land in its region)
//   poll():  copy of that op done? append the record
//            {imm, remote range, source} to the
//            receiver's inbox ring (shared memory)  ---->  poll(): record -> kRemoteImm
//            then report kLocalDone(ctx)
//
// Copy engines (ipc_copy.cc): with Options::ipc_copy == "kernel", descriptors in a host ring that
// a GPU kernel of the sender executes (dma_ring.h; the LL proxy path); otherwise picked by what the
// registered region is:
// - CUDA: the region is device memory (the LL buffer of the cuda executor); peers' regions are
//   opened through CUDA IPC handles and copied into with cuMemcpyDtoDAsync on one proxy-owned
//   stream per peer, completion seen by event queries (never blocking on one peer);
// - host: the region is host memory in named shared memory (the proxy allocates it there); a
//   worker thread copies with memcpy. Used only when regions are host memory, so that CPU-only CI
//   runs the transport's protocol logic (ordering, immediates, bounds, back-pressure, liveness)
//   through this very code. The GPU copy itself is verified only on a GPU machine.
#pragma once

#include <stdint.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace uccl_ep {
namespace transport {
namespace ipc {

// Moves bytes from our region into a peer's mapped region. Copies to one peer complete in the
// order they were submitted; copies to different peers are independent.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* kind() const = 0;  // "cuda" or "host"
  // Starts a copy and returns at once; false (with *error) if it could not be started.
  virtual bool submit(int peer, uint64_t dst, uint64_t src, uint64_t len, std::string* error) = 0;
  // The "kernel" engine: one more copy to `peer` (completed() covers it in order) that moves
  // nothing, a skip descriptor (dma_ring.h): its consumer counts the bytes of every pushed Write,
  // so a Write the proxy dropped must still reach it as `len` bytes. false (with *error) if it could
  // not be queued. The other engines have no such consumer and are never asked.
  virtual bool skip(int peer, uint64_t len, std::string* error) {
    (void)peer, (void)len;
    if (error) *error = std::string("ipc: the ") + kind() + " copy engine has no skip descriptors";
    return false;
  }
  // How many copies submitted to `peer` have completed (monotone); -1 (with *error) once a copy
  // failed.
  virtual int64_t completed(int peer, std::string* error) = 0;
  // Called on the proxy thread before its first submit/completed (CUDA: context, capture mode).
  virtual void bind_thread() {}
  // The "kernel" engine: {host address, bytes, capacity} of its copy ring (dma_ring.h); else empty.
  virtual std::vector<uint64_t> ring() const { return {}; }
  // Named diagnostics (safe from any thread).
  virtual std::vector<std::pair<std::string, uint64_t>> counters() const { return {}; }
};

// memcpy on one worker thread (host regions).
std::unique_ptr<CopyEngine> make_host_engine(int num_peers);
// Descriptors in a host ring (dma_ring.h) for an outside consumer: the LL proxy path's DMA kernel
// on the GPU (transport/copy_ring.cu), or a test's emulator on the CPU. Regions of either kind.
std::unique_ptr<CopyEngine> make_kernel_engine(int num_peers);
// cuMemcpyDtoDAsync on per-peer streams of `device` (device regions). Throws TransportError when
// the CUDA driver is unusable.
std::unique_ptr<CopyEngine> make_cuda_engine(int device, int num_peers);

// Device memory of one peer, opened once per process (CUDA refuses to open one IPC handle twice
// in a process), shared by every proxy thread; released with the last user.
uint64_t open_peer_memory(int device, const std::string& handle, std::string* error);
void close_peer_memory(int device, const std::string& handle);

}  // namespace ipc
}  // namespace transport
}  // namespace uccl_ep
