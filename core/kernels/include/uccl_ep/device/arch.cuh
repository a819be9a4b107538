// One warp/wavefront abstraction for uccl_ep kernels: CUDA (nvcc) and HIP (hipcc).
//
// Kernels include only this header for everything that differs between vendors: warp size,
// lane shuffles, memory-order loads/stores at system scope, fences, a nanosecond clock, 128-bit
// vector types, hardware number conversions, asynchronous copies and the by-value kernel parameter
// attribute. Code above this layer never names a vendor intrinsic.
//
// NOTES: kernels are written for any warp size that is a multiple of 8 (the FP8 cast reduces over
// groups of 8 lanes); on AMD a "warp" is a 64-lane wavefront.
#pragma once

#include <stdint.h>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define UCCL_EP_HIP 1
#else
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#define UCCL_EP_CUDA 1
#endif

#define UCCL_DEVICE __device__ __forceinline__

// Kernel parameter structs are passed by value as __grid_constant__ where CUDA has it.
#if UCCL_EP_HIP
#define UCCL_GRID_CONSTANT
#else
#define UCCL_GRID_CONSTANT __grid_constant__
#endif

namespace uccl_ep::dev {

#if UCCL_EP_HIP
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;
#endif

UCCL_DEVICE int lane_id() { return threadIdx.x % kWarpSize; }
UCCL_DEVICE int warp_id() { return threadIdx.x / kWarpSize; }
UCCL_DEVICE int num_warps() { return blockDim.x / kWarpSize; }

UCCL_DEVICE float shfl_xor(float v, int mask) {
#if UCCL_EP_HIP
  return __shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

UCCL_DEVICE int shfl_xor(int v, int mask) {
#if UCCL_EP_HIP
  return __shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

// Sum of v over the warp (every lane must call), in every lane.
UCCL_DEVICE int warp_sum(int v) {
#pragma unroll
  for (int m = kWarpSize / 2; m >= 1; m >>= 1) v += shfl_xor(v, m);
  return v;
}

UCCL_DEVICE uint64_t warp_ballot(bool pred) {
#if UCCL_EP_HIP
  return __ballot(pred);
#else
  return __ballot_sync(0xffffffffu, pred);
#endif
}

UCCL_DEVICE int popc64(uint64_t v) { return __popcll(v); }
UCCL_DEVICE int ffs64(uint64_t v) { return __ffsll((unsigned long long)v); }  // 1-based, 0 if none
UCCL_DEVICE uint64_t lanemask_lt() { return (uint64_t(1) << lane_id()) - 1; }

UCCL_DEVICE int shfl_idx(int v, int src) {
#if UCCL_EP_HIP
  return __shfl(v, src);
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

// Sleeps the calling thread for about `ns` nanoseconds (a polling loop's pause; sm_70+, on HIP
// the shortest s_sleep steps).
UCCL_DEVICE void pause_ns(unsigned ns) {
#if UCCL_EP_HIP
#if defined(__HIP_DEVICE_COMPILE__)
  if (ns < 100) __builtin_amdgcn_s_sleep(1);
  else __builtin_amdgcn_s_sleep(2);
#endif
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(ns);
#endif
}

UCCL_DEVICE int shfl_up(int v, int delta) {
#if UCCL_EP_HIP
  return __shfl_up(v, delta);
#else
  return __shfl_up_sync(0xffffffffu, v, delta);
#endif
}

// Exclusive prefix sum of v over the warp's lanes (every lane must call); *total gets the warp sum.
UCCL_DEVICE int warp_exclusive_scan(int v, int* total) {
  int inclusive = v;
#pragma unroll
  for (int off = 1; off < kWarpSize; off <<= 1) {
    const int up = shfl_up(inclusive, off);
    if (lane_id() >= off) inclusive += up;
  }
  *total = shfl_idx(inclusive, kWarpSize - 1);
  return inclusive - v;
}

UCCL_DEVICE void sync_warp() {
#if UCCL_EP_CUDA
  __syncwarp();
#endif
}

// ---- memory order at system scope (peer GPUs over NVLink, mapped host memory) ------------------
UCCL_DEVICE uint64_t ld_acquire_sys(const uint64_t* p) {
#if UCCL_EP_HIP
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#endif
}

UCCL_DEVICE void st_release_sys(uint64_t* p, uint64_t v) {
#if UCCL_EP_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

// A plain system-scope store (no fence): for progress words whose only ordering need is that
// this warp's earlier *loads* were consumed (their values already fed later instructions).
UCCL_DEVICE void st_relaxed_sys(uint64_t* p, uint64_t v) {
#if UCCL_EP_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

UCCL_DEVICE int ld_acquire_sys(const int* p) {
#if UCCL_EP_HIP
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  int v;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}

UCCL_DEVICE void st_release_sys(int* p, int v) {
#if UCCL_EP_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

// 16-byte stores at system scope of {w0, w1} to 16-byte aligned p (the proxy FIFO's commit: the
// reader acquires w1, then reads w0). CUDA only: HIP has no 16-byte store with an ordering, so
// fifo_device.cuh publishes w0 with st_relaxed_sys and then w1 with st_release_sys there.
#if UCCL_EP_CUDA
// Release: what this thread wrote (and observed through a fence) is visible before {w0, w1}.
UCCL_DEVICE void st16_release_sys(void* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.release.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}
// Strong, unordered (after fence_release_sys, which orders it).
UCCL_DEVICE void st16_relaxed_sys(void* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}
#endif

// ---- memory order at GPU scope (words only this GPU's threads share) ---------------------------
UCCL_DEVICE uint64_t ld_relaxed_gpu(const uint64_t* p) {  // e.g. a FIFO's cached tail
#if UCCL_EP_HIP
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#endif
}

UCCL_DEVICE uint64_t ld_acquire_gpu(const uint64_t* p) {
#if UCCL_EP_HIP
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#else
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#endif
}

// *p = max(*p, v) with release semantics: what this thread saw before (an acquired host word and
// the data it guards) is visible to a thread that acquires the new value.
UCCL_DEVICE void max_release_gpu(uint64_t* p, uint64_t v) {
#if UCCL_EP_HIP
  __hip_atomic_fetch_max(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#else
  asm volatile("red.release.gpu.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

// *p += v with release semantics at system scope: what this thread stored or observed is visible
// to a thread (of any GPU) that acquires the sum (an LL hybrid NVLink signal, device/proxy_ll.cuh).
UCCL_DEVICE void add_release_sys(uint64_t* p, uint64_t v) {
#if UCCL_EP_HIP
  __hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

UCCL_DEVICE void st_release_gpu(uint64_t* p, uint64_t v) {
#if UCCL_EP_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#else
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

UCCL_DEVICE int ld_volatile(const int* p) { return *reinterpret_cast<const volatile int*>(p); }

// Two adjacent words of (mapped host) memory in one 16-byte load, 16-byte aligned: one PCIe round
// trip for a copy-ring descriptor's half (dma_ring.h). HIP: two 8-byte loads.
UCCL_DEVICE void ld_volatile_v2(const uint64_t* p, uint64_t& a, uint64_t& b) {
#if UCCL_EP_HIP
  a = reinterpret_cast<const volatile uint64_t*>(p)[0];
  b = reinterpret_cast<const volatile uint64_t*>(p)[1];
#else
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
#endif
}

// NOTES: fence.sc.sys (MEMBAR.SC.SYS) also joins a single global order of every SC fence and costs
// microseconds while NVLink traffic is in flight; publishing (stores, then a flag) needs only
// release semantics, which st_release_sys gives by itself (MEMBAR.ALL.SYS + a strong store): the
// LL NVLink kernels publish with it alone.
UCCL_DEVICE void fence_system() { __threadfence_system(); }

// Release fence at system scope (fence.acq_rel.sys: MEMBAR.ALL.SYS, without the SC order of
// fence_system): followed by strong (relaxed) stores it publishes like st_release_sys, once for
// several stores (fifo_push_batch).
UCCL_DEVICE void fence_release_sys() {
#if UCCL_EP_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "");  // "": system scope (gfx942: buffer_wbl2 sc0 sc1)
#else
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

// Lets the kernel launched after this one with programmatic stream serialization (the LL receive
// phases, uccl_ep/cuda/ll.py) start once every block of this grid has called this or exited.
// NOTES: a no-op without such a dependent, and on HIP / before sm_90. A caller must have read
// everything the dependent may change (the LL op counter) before calling it.
UCCL_DEVICE void allow_dependent_launch() {
#if UCCL_EP_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until every grid this one was launched to overlap (programmatic dependent launch) has
// completed and its memory operations are visible; returns at once without such a grid.
// NOTES: the LL receive kernels call it last: they synchronize with their send kernel through flags,
// but a receive kernel must not complete while the send kernel still runs (it may still read the
// caller's input, e.g. the combine's `x`), or the caller's next kernel, ordered only after the
// receive kernel, could overwrite that input under it.
UCCL_DEVICE void wait_overlapped_grids() {
#if UCCL_EP_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Nanoseconds from a device-wide clock (only differences are used).
UCCL_DEVICE uint64_t clock_ns() {
#if UCCL_EP_HIP
#if defined(__HIP_DEVICE_COMPILE__)
  return uint64_t(__builtin_amdgcn_s_memrealtime()) * 10ull;  // NOTES: 100 MHz wall clock on gfx9
#else
  return 0;
#endif
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
#endif
}

// ---- 16-byte vectors -------------------------------------------------------------------------
struct alignas(16) Vec16 {
  uint32_t w[4];
};

UCCL_DEVICE Vec16 ld16(const void* p) { return *reinterpret_cast<const Vec16*>(p); }
UCCL_DEVICE void st16(void* p, const Vec16& v) { *reinterpret_cast<Vec16*>(p) = v; }

// 16-byte load that skips L1 (L2 is coherent with peers' NVLink writes; L1 is not): for memory
// that other GPUs write while this kernel runs.
UCCL_DEVICE Vec16 ld16_cg(const void* p) {
#if UCCL_EP_CUDA
  int4 v = __ldcg(reinterpret_cast<const int4*>(p));
  Vec16 r = {{uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)}};
  return r;
#else
  const volatile uint32_t* q = reinterpret_cast<const volatile uint32_t*>(p);
  Vec16 r = {{q[0], q[1], q[2], q[3]}};
  return r;
#endif
}

// 4-byte load that skips L1, for the same memory as ld16_cg (message fields, combine weights).
UCCL_DEVICE uint32_t ld_u32_cg(const uint8_t* p) { return *reinterpret_cast<const volatile uint32_t*>(p); }

// ---- hardware number conversions (numeric.cuh converts in software where these are absent) ------
// NOTES: AMD's gfx942 converts to FP8 in the fnuz encoding, not the OCP e4m3fn DeepEP uses; the
// software conversion is exact on every target.
#if UCCL_EP_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define UCCL_EP_HAS_HW_E4M3X2 1
// Two fp32 -> two e4m3fn bytes (low byte = a), round to nearest even, saturating.
UCCL_DEVICE uint32_t hw_float2_to_e4m3x2(float a, float b) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}
#else
#define UCCL_EP_HAS_HW_E4M3X2 0
#endif

#if UCCL_EP_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define UCCL_EP_HAS_HW_BF16X2 1
// Two floats -> packed bf16 pair (lo in the low half), round to nearest even (NaN: canonical 0x7fff).
UCCL_DEVICE uint32_t hw_pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#else
#define UCCL_EP_HAS_HW_BF16X2 0
#endif

// ---- asynchronous copies global -> shared (cp.async, sm_80+; a plain copy elsewhere) -----------
#if UCCL_EP_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define UCCL_EP_HAS_CP_ASYNC 1
#else
#define UCCL_EP_HAS_CP_ASYNC 0
#endif

// 16 bytes global -> shared without registers, through L2 only (as ld16_cg), sm_80+.
UCCL_DEVICE void cp_async16_cg(void* smem, const void* gmem) {
#if UCCL_EP_HAS_CP_ASYNC
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<Vec16*>(smem) = ld16_cg(gmem);
#endif
}

UCCL_DEVICE void cp_async_commit() {
#if UCCL_EP_HAS_CP_ASYNC
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
UCCL_DEVICE void cp_async_wait() {
#if UCCL_EP_HAS_CP_ASYNC
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

}  // namespace uccl_ep::dev
