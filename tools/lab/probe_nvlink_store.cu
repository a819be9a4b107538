// Probe (not shipped, not a test): how fast can SMs push BF16 rows over NVLink while the peer pushes
// back (the LL combine's NVLink leg)? Rows of `row_bytes` are copied from `src` to either the peer's
// buffer (IPC map) or a local one; row i is remote when remote_every > 0 and i % remote_every == 0;
// optional row-index arrays scatter the rows over a large area (the combine's [expert][token] slabs).
//   probe_warp16: one warp per row, 16-byte loads (8 per lane in flight) then 16-byte stores;
//                 `fence` != 0: lane 0 runs a system fence after every row (what ll_combine_send does).
//   probe_bulk:   one warp per row, lane 0 moves the row global -> shared -> global with cp.async.bulk
//                 (two row buffers per warp, so a row's store overlaps the next row's load).
#include "uccl_ep/device/block.cuh"
#include "ht_bulk.cuh"  // tools/lab, beside this file

using namespace uccl_ep;
using namespace uccl_ep::dev;

struct ProbeParams {
  uint64_t dst_remote, dst_local, src;
  int64_t rows, row_bytes, remote_every, fence;
  uint64_t src_idx, dst_idx;  // int64 row indices (0: row i at i), to scatter rows like the combine
};

UCCL_DEVICE uint8_t* row_dst(const ProbeParams& p, int64_t i) {
  const bool remote = p.remote_every > 0 && i % p.remote_every == 0;
  const int64_t at = p.dst_idx ? reinterpret_cast<const int64_t*>(p.dst_idx)[i] : i;
  return reinterpret_cast<uint8_t*>(remote ? p.dst_remote : p.dst_local) + at * p.row_bytes;
}

UCCL_DEVICE const uint8_t* row_src(const ProbeParams& p, int64_t i) {
  const int64_t at = p.src_idx ? reinterpret_cast<const int64_t*>(p.src_idx)[i] : i;
  return reinterpret_cast<const uint8_t*>(p.src) + at * p.row_bytes;
}

extern "C" __global__ void __launch_bounds__(1024) probe_warp16(const __grid_constant__ ProbeParams p) {
  const int64_t gw = int64_t(blockIdx.x) * num_warps() + warp_id(), nw = int64_t(gridDim.x) * num_warps();
  for (int64_t i = gw; i < p.rows; i += nw) {
    warp_copy16(row_dst(p, i), row_src(p, i), p.row_bytes);
    if (p.fence) {
      sync_warp();
      if (lane_id() == 0) fence_system();
      sync_warp();
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) probe_bulk(const __grid_constant__ ProbeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int w = warp_id();
  const uint32_t rb = uint32_t(p.row_bytes);
  const uint32_t slot = (rb + 127) / 128 * 128;
  uint8_t* buf = smem + size_t(w) * 2 * slot;
  __shared__ __align__(8) uint64_t bars[8][2];
  if (lane_id() == 0) {
    bulk::mbar_init(&bars[w][0], 1);
    bulk::mbar_init(&bars[w][1], 1);
    bulk::fence_mbar_init();
  }
  sync_warp();
  const int64_t gw = int64_t(blockIdx.x) * num_warps() + w, nw = int64_t(gridDim.x) * num_warps();
  if (lane_id() == 0) {
    uint32_t phase[2] = {0, 0};
    int n = 0;
    for (int64_t i = gw; i < p.rows; i += nw, ++n) {
      const int b = n & 1;
      bulk::wait_read<1>();  // the store that used buffer b two rows ago has read it
      bulk::arrive_expect(&bars[w][b], rb);
      bulk::load(buf + b * slot, row_src(p, i), rb, &bars[w][b]);
      while (!bulk::try_wait(&bars[w][b], phase[b])) {}
      phase[b] ^= 1;
      bulk::store(row_dst(p, i), buf + b * slot, rb);
      bulk::commit();
    }
    bulk::wait_done<0>();
    if (p.fence) fence_system();
  }
  sync_warp();
}
