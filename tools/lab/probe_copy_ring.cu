// Probe kernels of the ipc transport's copy ring (lab only: compiled by tools/lab/probe_copy_kernel.py
// and probe_proxy_rtt.py through lab_kernels.py, never loaded by the package).
// NOTES: the production source is included whole, so that ll_proxy_dma_probe times the very copy
// loop the copy kernel runs (copy_share, in that file's anonymous namespace) and the RTT probe
// polls the ring with its helpers; the module also holds the production kernels, unused here.
#include "transport/copy_ring.cu"

namespace uccl_ep {

// ll_proxy_dma_probe (diagnostics only, probe_copy_kernel.py): the copy kernel's copy
// loop alone, `reps` times over [src, +len) -> dst, optionally with its per-descriptor system fence.
struct CopyProbeParams {
  uint64_t dst;
  uint64_t src;
  int64_t len;
  int64_t reps;
  int64_t fence;            // 1: every block fences system-wide after each rep, as per descriptor
};

// ll_proxy_rtt_probe (diagnostics only, probe_proxy_rtt.py): one thread times, on the
// GPU clock, a Write pushed into a real FIFO -> the proxy thread's descriptor in its copy ring, then
// plays the copy kernel's part (copies the bytes, publishes done) so the proxy delivers as usual.
struct ProxyRttProbeParams {
  uint64_t fifo;            // FifoLayout* (device address) of the FIFO to push into
  uint64_t ring;            // device address of the copy ring of the proxy thread serving it
  uint64_t out;             // u64 [iters][4]: push ns, push -> seq seen ns, descriptor read ns, copy + done ns
  uint64_t status;          // a FIFO status word of the proxy
  uint64_t error;           // ErrorWord*
  int64_t first_idx;        // the ring's next descriptor index (0 on a fresh buffer)
  int64_t iters;
  int64_t gap_ns;           // idle time before each push
  int64_t dst;              // destination rank
  int64_t len;              // bytes per Write (16-byte multiple)
  int64_t counter;          // receiver counter the Writes count on
  int64_t rank;
  int64_t timeout_ns;
  int64_t read_mode;        // 0: dst, src, len as three 8-byte loads; 1: {dst, src} and {len, seq} as two 16-byte loads
};

}  // namespace uccl_ep

// Diagnostics (CopyProbeParams): copy_share alone over the whole grid, without rings, so a probe can
// tell the copy loop's own rate from what the ring protocol around it costs.
extern "C" __global__ void __launch_bounds__(512) ll_proxy_dma_probe(const UCCL_GRID_CONSTANT CopyProbeParams p) {
  for (int64_t r = 0; r < p.reps; ++r) {
    copy_share(reinterpret_cast<uint8_t*>(p.dst), reinterpret_cast<const uint8_t*>(p.src), uint64_t(p.len),
               int(blockIdx.x), int(gridDim.x));
    if (p.fence) {
      __syncthreads();
      if (threadIdx.x == 0) fence_system();
      __syncthreads();
    }
  }
}

// Diagnostics (ProxyRttProbeParams): push -> descriptor seen through a real proxy thread, timed by one
// thread on the GPU clock, with nothing else running (no send kernel, no other polling): what the
// FIFO, the proxy and the copy ring cost alone.
extern "C" __global__ void __launch_bounds__(32) ll_proxy_rtt_probe(const UCCL_GRID_CONSTANT ProxyRttProbeParams p) {
  if (threadIdx.x != 0) return;
  const auto& fifo = *reinterpret_cast<const FifoLayout*>(p.fifo);
  auto* header = reinterpret_cast<DmaRingHeader*>(p.ring);
  const auto* slots = reinterpret_cast<const DmaDesc*>(header + 1);
  auto* out = reinterpret_cast<uint64_t*>(p.out);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const PushSite site{kPhaseLLProxyCopy, int(p.rank), int(p.dst), -1};
  uint64_t idx = uint64_t(p.first_idx);
  for (int64_t i = 0; i < p.iters; ++i) {
    const uint64_t idle = clock_ns();
    while (clock_ns() - idle < uint64_t(p.gap_ns)) {
    }
    const uint64_t t0 = clock_ns();
    if (push_op(fifo, int(p.dst), 0, 0, uint64_t(p.len), uint64_t(p.len), 1, uint32_t(p.counter), 2, false,
                uint64_t(p.timeout_ns), err, site, nullptr) < 0)
      return;
    const uint64_t t1 = clock_ns();
    const DmaDesc* d = slots + (idx & (kDmaRingCapacity - 1));
    while (ld_volatile_u64(reinterpret_cast<const unsigned long long*>(&d->seq)) != idx + 1) {
      if (clock_ns() - t1 > uint64_t(p.timeout_ns)) {
        raise_error(err, kErrTimeout, kPhaseLLProxyCopy, int(p.rank), int(p.dst), -1, clock_ns() - t1);
        return;
      }
    }
    const uint64_t t2 = clock_ns();
    uint64_t dst, src, len, seq;
    if (p.read_mode == 1) {
      ld_volatile_v2(&d->dst, dst, src);
      ld_volatile_v2(&d->len, len, seq);
    } else {
      dst = ld_volatile_u64(reinterpret_cast<const unsigned long long*>(&d->dst));
      src = ld_volatile_u64(reinterpret_cast<const unsigned long long*>(&d->src));
      len = ld_volatile_u64(reinterpret_cast<const unsigned long long*>(&d->len));
    }
    dst &= kDmaFieldMask, src &= kDmaFieldMask, len &= kDmaFieldMask;
    const uint64_t t2b = clock_ns();
    for (uint64_t b = 0; b + 16 <= len; b += 16) st16(reinterpret_cast<uint8_t*>(dst) + b, ld16(reinterpret_cast<const uint8_t*>(src) + b));
    fence_release_sys();
    st_relaxed_sys(reinterpret_cast<uint64_t*>(&header->done), idx + 1);
    const uint64_t t3 = clock_ns();
    out[4 * i + 0] = t1 - t0;
    out[4 * i + 1] = t2 - t1;
    out[4 * i + 2] = t2b - t2;
    out[4 * i + 3] = t3 - t2b;
    ++idx;
  }
}
