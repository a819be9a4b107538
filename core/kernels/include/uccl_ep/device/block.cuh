// Block-level helpers shared by kernels: exclusive scan, the "last block" epilogue, copies.
#pragma once

#include "uccl_ep/device/arch.cuh"

namespace uccl_ep::dev {

// Channel c's contiguous share of T tokens split over C channels (DeepEP's split): [begin, end).
struct TokenRange {
  int begin, end;
};

UCCL_DEVICE TokenRange channel_tokens(int T, int C, int c) {
  const int per = (T + C - 1) / C;
  const int begin = min(T, c * per);
  return {begin, min(T, begin + per)};
}

// Exclusive prefix sum of one int per thread; `scratch` holds 2 * blockDim.x ints.
// Returns the thread's exclusive prefix; *total gets the block sum. Contains __syncthreads.
UCCL_DEVICE int block_exclusive_scan(int v, int* scratch, int* total) {
  const int n = blockDim.x, tid = threadIdx.x;
  int* a = scratch;
  int* b = scratch + n;
  a[tid] = v;
  __syncthreads();
  for (int off = 1; off < n; off <<= 1) {
    b[tid] = tid >= off ? a[tid] + a[tid - off] : a[tid];
    __syncthreads();
    int* t = a;
    a = b;
    b = t;
  }
  int inclusive = a[tid];
  *total = a[n - 1];
  __syncthreads();
  return inclusive - v;
}

// Called by every block at its very end: the last block to finish resets `done` and bumps
// `seq` (so the next use of a buffer set expects the next tag). Contains __syncthreads.
UCCL_DEVICE void last_block_bumps_seq(unsigned* done, unsigned* seq) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned prev = atomicAdd(done, 1u);
    if (prev == gridDim.x - 1) {
      *done = 0u;
      atomicAdd(seq, 1u);
      __threadfence();
    }
  }
}

// Warp-cooperative copy of `bytes` (multiple of 16, 16-byte aligned) from `src` into `num_dst` (at
// most kMaxDst) destinations, with 8 loads per lane in flight (4 KiB per warp): enough bytes
// outstanding to cover NVLink / HBM latency. Each 16-byte piece is loaded once (through L2 only
// with kCg) and stored to every destination; warp_copy16 / warp_copy16_cg are the one-destination
// case.
//
// NOTES: the tail is one more predicated round, not a loop of single loads: a row that is not a
// multiple of 4 KiB (a 7 KiB FP8 row is 1.75 rounds, a 14 KiB BF16 row 3.5) otherwise ends in a
// chain of dependent load -> store steps (6 for FP8, 4 for BF16), and FP8 dispatch ran no faster
// than BF16 at half the bytes. Rounds are ceil(bytes / 4 KiB).
// Several destinations: the copy-engine dispatch writes a token's row to recv_x and to each routed
// peer's staging buffer; at EP2 nearly every token goes to both ranks, so one load per piece
// instead of one per destination halves what the SMs read and the instructions they issue per row.
template <int kMaxDst, bool kCg = false, int kUnroll = 8>
UCCL_DEVICE void warp_copy16_multi(uint8_t* const (&dst)[kMaxDst], int num_dst, const void* src, int64_t bytes) {
  const int lane = lane_id();
  const int64_t n = bytes / 16;
  auto* s = reinterpret_cast<const Vec16*>(src);
  for (int64_t i0 = lane; i0 < n; i0 += kUnroll * kWarpSize) {
    Vec16 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * kWarpSize < n) v[u] = kCg ? ld16_cg(s + i0 + u * kWarpSize) : s[i0 + u * kWarpSize];
#pragma unroll
    for (int d = 0; d < kMaxDst; ++d) {
      if (d >= num_dst) break;
      auto* out = reinterpret_cast<Vec16*>(dst[d]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i0 + u * kWarpSize < n) out[i0 + u * kWarpSize] = v[u];
    }
  }
}

UCCL_DEVICE void warp_copy16(void* dst, const void* src, int64_t bytes) {
  uint8_t* const one[1] = {static_cast<uint8_t*>(dst)};
  warp_copy16_multi<1>(one, 1, src, bytes);
}

// warp_copy16 reading through L2 only (the source is written by peers: see ld16_cg).
UCCL_DEVICE void warp_copy16_cg(void* dst, const void* src, int64_t bytes) {
  uint8_t* const one[1] = {static_cast<uint8_t*>(dst)};
  warp_copy16_multi<1, true>(one, 1, src, bytes);
}

// A u64 word of a copy-engine staging buffer (kernel_abi.h kCE* / kCED* offsets), this rank's or a peer's.
UCCL_DEVICE uint64_t* ce_word(uint64_t stage, uint64_t offset) { return reinterpret_cast<uint64_t*>(stage + offset); }

UCCL_DEVICE bool is_masked(int64_t mask, int r) { return r < 64 && ((mask >> r) & 1); }

// The u64 flags of an LL NVLink receive area (ll/nvlink/dispatch.cu: per slot; ll/nvlink/combine.cu: per row), at
// `flag_off` past both kernels' data (uccl_ep/cuda/ll.py, _Layout.flag_off).
UCCL_DEVICE uint64_t* ll_flags(uint64_t area, int64_t flag_off) { return reinterpret_cast<uint64_t*>(area + flag_off); }

}  // namespace uccl_ep::dev
