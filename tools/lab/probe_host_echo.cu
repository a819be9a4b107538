// Probe (not shipped, not a test): GPU <-> CPU round trip through mapped pinned host memory. One GPU
// thread stores a command word, a CPU thread spinning on it (pinned to CPU argv[1]) echoes it into
// another host word, the GPU thread polls that; 200 round trips per case, timed on the GPU clock.
// Cases: the GPU store (relaxed, the LL push's release fence + relaxed store, release, volatile,
// mmio), the GPU load, an idle gap before each push, other blocks polling host lines meanwhile.
// argv[2]: 0 cudaHostAlloc (every case); 1 malloc + cudaHostRegister for both words (the proxy's
// memory); 2 the echo word registered; 3 the CPU side yields when idle (as the proxy may);
// 9 CPU costs only (clocksource, clock_gettime, sched_yield). Results: docs/benchmarks.md (LL
// forced proxy path). Build (PyPI nvcc, static cudart), run on the GPU machine:
//   N=.venv/lib/python3.11/site-packages/nvidia/cu13
//   $N/bin/nvcc -O2 -std=c++17 -arch=sm_90 -I$N/include -L$N/lib -cudart static \
//       -o probe_host_echo tools/lab/probe_host_echo.cu -lpthread -ldl -lrt
//   ./probe_host_echo 20 0
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

__device__ __forceinline__ uint64_t gtimer() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

__device__ __forceinline__ void gpu_store(int kind, uint64_t* p, uint64_t v) {
  switch (kind) {
    case 0: asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v), "l"(v) : "memory"); break;
    case 1: asm volatile("fence.acq_rel.sys;" ::: "memory");
            asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v), "l"(v) : "memory"); break;
    case 2: asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p + 1), "l"(v) : "memory");
            asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); break;
    case 3: asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v), "l"(v) : "memory");
            asm volatile("fence.acq_rel.sys;" ::: "memory"); break;
    case 4: asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v), "l"(v) : "memory"); break;
    case 5: asm volatile("st.mmio.relaxed.sys.global.u64 [%0], %1;" ::"l"(p + 1), "l"(v) : "memory");
            asm volatile("st.mmio.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); break;
  }
}

__device__ __forceinline__ uint64_t gpu_load(int kind, const uint64_t* p) {
  uint64_t v;
  switch (kind) {
    case 0: v = *reinterpret_cast<const volatile uint64_t*>(p); break;
    case 1: asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
    case 2: asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
    default: asm volatile("ld.mmio.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
  }
  return v;
}

// block 0 thread 0: the round trips; other blocks (if any): poll `noise` lines of host memory
__global__ void pingpong(int store_kind, int load_kind, uint64_t* cmd, const uint64_t* echo, uint64_t* out,
                         int iters, uint64_t gap_ns, uint64_t base, const uint64_t* noise, volatile int* stop,
                         uint64_t* polls) {
  if (blockIdx.x != 0) {
    if (threadIdx.x != 0) return;
    uint64_t n = 0;
    const uint64_t* line = noise + 16 * blockIdx.x;
    while (*stop == 0) {
      (void)gpu_load(0, line);
      ++n;
      __nanosleep(200);
    }
    atomicAdd(reinterpret_cast<unsigned long long*>(polls), (unsigned long long)n);
    return;
  }
  if (threadIdx.x != 0) return;
  for (int i = 1; i <= iters; ++i) {
    if (gap_ns) { const uint64_t s = gtimer(); while (gtimer() - s < gap_ns) {} }
    const uint64_t v = base + uint64_t(i);
    const uint64_t t0 = gtimer();
    gpu_store(store_kind, cmd, v);
    uint64_t spins = 0;
    while (gpu_load(load_kind, echo) < v) { if (++spins > (1ull << 32)) break; }
    out[i - 1] = gtimer() - t0;
  }
  *stop = 1;
}

static double time_ns(void (*f)(), int n) {
  timespec a, b; clock_gettime(CLOCK_MONOTONIC_RAW, &a);
  for (int i = 0; i < n; ++i) f();
  clock_gettime(CLOCK_MONOTONIC_RAW, &b);
  return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}
static void f_mono() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); asm volatile("" ::"r"(t.tv_nsec)); }
static void f_real() { timespec t; clock_gettime(CLOCK_REALTIME, &t); asm volatile("" ::"r"(t.tv_nsec)); }
static void f_steady() { auto t = std::chrono::steady_clock::now(); asm volatile("" ::"r"(t.time_since_epoch().count())); }
static void f_yield() { sched_yield(); }
static void f_pause() { __builtin_ia32_pause(); }

int main(int argc, char** argv) {
  const int iters = 200;
  if (argc > 2 && atoi(argv[2]) == 9) {
    FILE* f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    char cs[64] = "?"; if (f) { if (!fgets(cs, sizeof cs, f)) cs[0] = 0; fclose(f); }
    printf("clocksource %s", cs);
    printf("ns per call: CLOCK_MONOTONIC %.1f  CLOCK_REALTIME %.1f  steady_clock %.1f  sched_yield %.1f  pause %.1f\n",
           time_ns(f_mono, 200000), time_ns(f_real, 200000), time_ns(f_steady, 200000), time_ns(f_yield, 20000),
           time_ns(f_pause, 200000));
    return 0;
  }
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  uint64_t *cmd, *echo, *noise;
  const int mode = argc > 2 ? atoi(argv[2]) : 0;  // 0: cudaHostAlloc; 1: both registered; 2: echo registered
  auto reg = [](uint64_t** p) {
    void* m = nullptr; if (posix_memalign(&m, 4096, 1 << 16) != 0) exit(2);
    memset(m, 0, 1 << 16);
    CK(cudaHostRegister(m, 1 << 16, cudaHostRegisterPortable | cudaHostRegisterMapped));
    *p = static_cast<uint64_t*>(m);
  };
  if (mode == 1) reg(&cmd); else CK(cudaHostAlloc(&cmd, 4096, cudaHostAllocMapped));
  if (mode == 1 || mode == 2) reg(&echo); else CK(cudaHostAlloc(&echo, 4096, cudaHostAllocMapped));
  printf("mode %d (0: cudaHostAlloc, 1: both malloc + cudaHostRegister, 2: echo registered)\n", mode);
  CK(cudaHostAlloc(&noise, 1 << 16, cudaHostAllocMapped));
  memset(cmd, 0, 4096); memset(echo, 0, 4096); memset(noise, 0, 1 << 16);
  uint64_t *dcmd, *decho, *dnoise;
  CK(cudaHostGetDevicePointer(&dcmd, cmd, 0));
  CK(cudaHostGetDevicePointer(&decho, echo, 0));
  CK(cudaHostGetDevicePointer(&dnoise, noise, 0));
  uint64_t* dout; int* dstop; uint64_t* dpolls;
  CK(cudaMalloc(&dout, iters * 8)); CK(cudaMalloc(&dstop, 4)); CK(cudaMalloc(&dpolls, 8));
  std::atomic<bool> quit{false};
  const int cpu = argc > 1 ? atoi(argv[1]) : 2;
  std::thread echoer([&] {
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s);
    uint64_t last = 0;
    while (!quit.load(std::memory_order_relaxed)) {
      const uint64_t v = __atomic_load_n(cmd, __ATOMIC_ACQUIRE);
      if (v != last) { last = v; __atomic_store_n(echo, v, __ATOMIC_RELEASE); }
      else if (mode == 3) sched_yield();
      else __builtin_ia32_pause();
    }
  });
  uint64_t base = 0;
  std::vector<uint64_t> h(iters);
  struct V { int st, ld; uint64_t gap; int noise; const char* name; };
  const V all[] = {
      {0, 0, 0, 0, "st.relaxed.sys v2 / ld.volatile"},
      {1, 0, 0, 0, "fence.sys + st.relaxed.sys (the batched push) / ld.volatile"},
      {2, 0, 0, 0, "st.release.sys x2 / ld.volatile"},
      {3, 0, 0, 0, "st.relaxed.sys + fence.sys after / ld.volatile"},
      {4, 0, 0, 0, "st.volatile v2 / ld.volatile"},
      {5, 0, 0, 0, "st.mmio.relaxed.sys x2 / ld.volatile"},
      {1, 1, 0, 0, "batched push / ld.acquire.sys"},
      {1, 2, 0, 0, "batched push / ld.relaxed.sys"},
      {1, 3, 0, 0, "batched push / ld.mmio.relaxed.sys"},
      {1, 0, 20000, 0, "batched push / ld.volatile, 20 us gap"},
      {1, 0, 100000, 0, "batched push / ld.volatile, 100 us gap"},
      {3, 0, 20000, 0, "store + fence after, 20 us gap"},
      {1, 0, 0, 8, "batched push, 8 other blocks polling host lines"},
      {1, 0, 0, 32, "batched push, 32 other blocks polling host lines"},
      {1, 0, 20000, 32, "batched push, 20 us gap, 32 pollers"},
  };
  const int first = mode == 0 ? 0 : 1, count = mode == 0 ? int(sizeof all / sizeof all[0]) : 1;
  const V vs_extra[] = {{1, 0, 0, 0, ""}, {1, 0, 20000, 0, "batched push, 20 us gap"}, {1, 0, 0, 32, "batched push, 32 pollers"}};
  std::vector<V> vs(all + first, all + first + count);
  if (mode != 0) { vs.push_back(vs_extra[1]); vs.push_back(vs_extra[2]); }
  for (const V& v : vs) {
    CK(cudaMemset(dstop, 0, 4)); CK(cudaMemset(dpolls, 0, 8));
    pingpong<<<1 + v.noise, 32>>>(v.st, v.ld, dcmd, decho, dout, iters, v.gap, base, dnoise, dstop, dpolls);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    base += iters;
    CK(cudaMemcpy(h.data(), dout, iters * 8, cudaMemcpyDeviceToHost));
    uint64_t polls = 0; CK(cudaMemcpy(&polls, dpolls, 8, cudaMemcpyDeviceToHost));
    std::vector<uint64_t> s(h.begin() + 10, h.end());
    std::sort(s.begin(), s.end());
    printf("RTT ns p10 %6llu  p50 %6llu  p90 %6llu  max %7llu   %s (noise polls %llu)\n",
           (unsigned long long)s[s.size() / 10], (unsigned long long)s[s.size() / 2],
           (unsigned long long)s[s.size() * 9 / 10], (unsigned long long)s.back(), v.name, (unsigned long long)polls);
  }
  quit = true;
  echoer.join();
  return 0;
}
