// Compile-time tuning of the default HT intranode kernels (ht/nvlink/dispatch.cu,
// ht/nvlink/combine.cu). The engine (uccl_ep/cuda/ht.py) passes UCCL_EP_HT_THREADS from
// Tuning.ht_warps; the others come from Tuning.ht_defines (experiments only: a setting that wins
// on the GPU becomes the default here, with its measurement in a NOTES line).
#pragma once

#include "uccl_ep/device/ring.cuh"

#ifndef UCCL_EP_HT_THREADS
#define UCCL_EP_HT_THREADS 512  // threads per block = warps per block * 32 (<= kHTMaxWarps warps)
#endif
#ifndef UCCL_EP_HT_PUBLISH_EVERY
#define UCCL_EP_HT_PUBLISH_EVERY 4  // a producer warp's own rows between progress publications
#endif
#ifndef UCCL_EP_HT_HEAD_SLACK
#define UCCL_EP_HT_HEAD_SLACK 16  // combine receiver: positions a head may lag before republishing
#endif
// NOTES: combine rows are staged through shared memory by cp.async (warp_combine_rows_staged), 2
// chunks of 4 vectors per lane in flight per warp, 16 warps per block: the receivers are bound by
// loads in flight, and staging keeps more of them in flight per SM than the register pipeline can,
// which was best at 24 warps and still slower. More stages, a smaller unroll or more warps with
// staging were slower (the tuning matrix and its numbers: docs/benchmarks.md; tools/lab/run_device.sh
// tune re-measures them). GPUs before sm_80 have no cp.async: register pipeline.
#ifndef UCCL_EP_HT_COMBINE_STAGES
#if UCCL_EP_CUDA && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define UCCL_EP_HT_COMBINE_STAGES 2  // >= 2: combine rows staged by cp.async; 0: register pipeline
#else
#define UCCL_EP_HT_COMBINE_STAGES 0
#endif
#endif
#ifndef UCCL_EP_HT_COMBINE_UNROLL  // 16-byte vectors per lane per chunk (the register pipeline spills at 4)
#define UCCL_EP_HT_COMBINE_UNROLL (UCCL_EP_HT_COMBINE_STAGES ? 4 : 2)
#endif
#ifndef UCCL_EP_HT_PROF
#define UCCL_EP_HT_PROF 0  // 1: account each warp's cycles spent waiting on the other side (HTProf)
#endif
// NOTES: consumers publish heads without a fence (warp_publish_consumed): a release drained each
// receiver warp's output stores before every head update, which cost the combine far more than it
// cost dispatch (docs/benchmarks.md). A freed slot was only read, so no store needs ordering.
#ifndef UCCL_EP_HT_RELAXED_HEAD
#define UCCL_EP_HT_RELAXED_HEAD 1
#endif

// Register arrays of the intranode kernels are sized for this many ranks; the JIT builds one
// variant per group size.
#ifndef UCCL_EP_RANKS
#define UCCL_EP_RANKS kHTMaxRanks
#endif

namespace uccl_ep::dev {

constexpr int kRanks = UCCL_EP_RANKS;
static_assert(kRanks >= 1 && kRanks <= kHTMaxRanks, "UCCL_EP_RANKS out of range");
constexpr int kHTThreads = UCCL_EP_HT_THREADS;
static_assert(kHTThreads % kWarpSize == 0 && kHTThreads / kWarpSize <= kHTMaxWarps,
              "UCCL_EP_HT_THREADS: whole warps (wavefronts on AMD), <= kHTMaxWarps");
constexpr int kPublishEvery = UCCL_EP_HT_PUBLISH_EVERY;
constexpr int kHeadSlack = UCCL_EP_HT_HEAD_SLACK;
constexpr int kCombineUnroll = UCCL_EP_HT_COMBINE_UNROLL;
constexpr int kCombineStages = UCCL_EP_HT_COMBINE_STAGES;
static_assert(kCombineStages == 0 || kCombineStages >= 2, "UCCL_EP_HT_COMBINE_STAGES: 0 or >= 2");
static_assert(kPublishEvery >= 1 && kHeadSlack >= 1 && kCombineUnroll >= 1, "HT tuning values must be >= 1");

// A consumer's head counter: the positions below `value` were only read by this warp.
UCCL_DEVICE void publish_head(uint64_t* counter, uint64_t value) {
#if UCCL_EP_HT_RELAXED_HEAD
  warp_publish_consumed(counter, value);
#else
  warp_publish(counter, value);
#endif
}

// ---- cycle accounting (UCCL_EP_HT_PROF=1; a measurement build, never the default) --------------
// Each warp counts the SM cycles it spends in up to three named sections (bucket 0: waits on the
// other side; 1, 2: per kernel, e.g. row copy / sum and progress publication) and its cycles in
// total; lane 0 adds them to a module global at exit. The next launch's thread (0, 0) prints and
// clears the totals, so a run prints one line per launch describing the launch before it
// (approximately: blocks of the new launch that finish before the clear land in the old line).
constexpr bool kHTProf = UCCL_EP_HT_PROF != 0;
constexpr int kProfBuckets = 3;
#if UCCL_EP_HT_PROF
__device__ unsigned long long g_ht_prof[2][kProfBuckets + 2];  // [sender, receiver][buckets, total, warps]
#endif

struct HTProf {
  long long start = 0, spent[kProfBuckets] = {0, 0, 0};
  UCCL_DEVICE void begin() {
    if constexpr (kHTProf) start = clock64();
  }
  UCCL_DEVICE long long mark() const { return kHTProf ? clock64() : 0; }
  UCCL_DEVICE void add(int bucket, long long since) {
    if constexpr (kHTProf) spent[bucket] += clock64() - since;
  }
  UCCL_DEVICE void waited(long long since) { add(0, since); }
  UCCL_DEVICE void end(bool sender) {
#if UCCL_EP_HT_PROF
    if (lane_id() == 0) {
      auto* g = g_ht_prof[sender ? 0 : 1];
      for (int b = 0; b < kProfBuckets; ++b) atomicAdd(&g[b], (unsigned long long)spent[b]);
      atomicAdd(&g[kProfBuckets], (unsigned long long)(clock64() - start));
      atomicAdd(&g[kProfBuckets + 1], 1ull);
    }
#endif
  }
};

// Thread (0, 0) at kernel start: print and clear the previous launch's totals, per role: cycles
// per warp (thousands) and each bucket's share of them.
UCCL_DEVICE void ht_prof_report(const char* kernel, int rank) {
#if UCCL_EP_HT_PROF
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double v[2][kProfBuckets + 2];
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < kProfBuckets + 2; ++i) v[r][i] = double(atomicExch(&g_ht_prof[r][i], 0ull));
  if (v[0][kProfBuckets + 1] == 0 || v[1][kProfBuckets + 1] == 0) return;
  const double ts = v[0][kProfBuckets], tr = v[1][kProfBuckets];
  printf("HTPROF %s rank %d sender %.0f kcyc/warp [%.1f%% %.1f%% %.1f%%] receiver %.0f kcyc/warp [%.1f%% %.1f%% %.1f%%]\n",
         kernel, rank, ts / v[0][kProfBuckets + 1] / 1000, 100 * v[0][0] / ts, 100 * v[0][1] / ts, 100 * v[0][2] / ts,
         tr / v[1][kProfBuckets + 1] / 1000, 100 * v[1][0] / tr, 100 * v[1][1] / tr, 100 * v[1][2] / tr);
#else
  (void)kernel;
  (void)rank;
#endif
}

}  // namespace uccl_ep::dev
