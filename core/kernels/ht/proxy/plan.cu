// The plan of a fresh normal-mode dispatch through the CPU proxy (one rank per node, every rank
// through the proxy on one node, or several ranks per node with forwarding): the matrices
// uccl_ep/cuda/ht_proxy_plan.py defines, computed on the device in two launches (three with
// forwarding) instead of a few dozen small tensor operations on the host.
//
//   ht_proxy_plan_send (before the notify kernel), block j < R = destination rank j:
//     send_head[t][j]   index of token t among this rank's tokens to j, or -1
//     send_prefix[j][c] this rank's tokens to j in channels 0..c (DeepEP's contiguous channel ranges)
//     records[j]        the notify record for j: [tokens per rank (R) | tokens to j per channel (C) |
//                       counts of j's experts (E_loc) | (forwarding) tokens to j's node per channel (C) |
//                       message bytes] (ht_proxy_plan.records)
//   with several ranks per node, block R + n = node n (a token goes to n if any of its ranks wants it):
//     send_rdma_head[t][n], node_send_prefix[n][c], and the node columns of the records of n's ranks
//   ht_proxy_plan_recv (after the notify kernel filled meta_out with every source's record for me):
//     recv_end[i]       end row of source i's block (rows by source, then channel, then token)
//     recv_prefix[i][c] first row of (source i, channel c)
//     (forwarding) recv_count[i][c], and what this rank receives as its node's forwarder from each
//     node's rail source: rdma_count[n][c], rdma_end[n], rdma_prefix[n][c] (ht_proxy_plan.recv_layout)
//     and, where given, the handle's matrices and per-row items: the channel prefix of what each
//     source sends me (recv_rdma_channel_prefix_matrix), the rank prefix matrix (counts summed over
//     sources), copies DeepEP's handle keeps apart, recv_src_meta (source node, NVL mask 1) and
//     send_nvl_head (the row itself, -1 past the real rows: num_worst_tokens)
//   ht_proxy_forward_handle (with forwarding, after the forwarding dispatch kernel recorded the NVL
//   masks): the handle items ht_proxy_plan.forward_handle defines
//     block b < ceil(rdma_rows / kHandleRows): the b-th chunk of the tokens this rank received as
//       its node's forwarder (by source node: segment s ends at rdma_end[s]), send_nvl_head[k][g] =
//       local rank g's row of token k (g's rows from earlier sources + k's rank among segment s's
//       tokens with bit g of rdma_mask), or -1 (bit clear, or past the real rows: num_worst_tokens)
//     the blocks after them, per received row: recv_src_meta (source node, NVL mask; zero past the
//       real rows); and recv_rdma_prefix, rdma_rank_prefix
//
// NOTES: the host knows `num_rows` only after waiting for the notify kernel (or from
// num_worst_tokens), so the per-row items belong to the second launch; everything the dispatch
// kernel reads is written before it starts (same stream). The forwarding handle needs the masks
// the dispatch kernel records, so it is a third launch after it.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/kernel_abi.h"
#include "uccl_ep/kernel_abi_internode.h"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

constexpr int kPlanThreads = 256;
constexpr int kMaxChannels = 64;

// Whether token t goes to column `col`: rank col, or (node) any rank of node col.
UCCL_DEVICE bool wanted(const uint8_t* in_rank, int64_t t, int R, int col, int G, bool node) {
  if (!node) return in_rank[t * R + col] != 0;
  bool any = false;
  for (int g = 0; g < G; ++g) any = any || in_rank[t * R + col * G + g] != 0;
  return any;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kPlanThreads) ht_proxy_plan_send(const UCCL_GRID_CONSTANT HTProxyPlanSendParams p) {
  __shared__ int s_scan[2 * kPlanThreads];
  __shared__ int s_channel[kMaxChannels];
  const int R = int(p.num_ranks), C = int(p.num_channels), G = int(p.ranks_per_node), tid = threadIdx.x;
  const bool node = int(blockIdx.x) >= R;  // a node column (forwarding), else a rank column
  const int col = node ? int(blockIdx.x) - R : int(blockIdx.x), cols = node ? R / G : R;
  const int64_t T = p.num_tokens;
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  for (int c = tid; c < C; c += blockDim.x) s_channel[c] = 0;
  // each thread a contiguous run of tokens: count, scan, then number them in order
  const int64_t run = (T + blockDim.x - 1) / blockDim.x;
  const int64_t t0 = min(T, int64_t(tid) * run), t1 = min(T, t0 + run);
  int mine = 0;
  for (int64_t t = t0; t < t1; ++t) mine += wanted(in_rank, t, R, col, G, node);
  int total = 0;
  int next = block_exclusive_scan(mine, s_scan, &total);  // (its __syncthreads also orders the zeroing)
  const int64_t per = C > 0 ? (T + C - 1) / C : 1;
  auto* head = reinterpret_cast<int*>(node ? p.send_rdma_head : p.send_head);
  for (int64_t t = t0; t < t1; ++t) {
    const bool in = wanted(in_rank, t, R, col, G, node);
    head[t * cols + col] = in ? next++ : -1;
    if (in) atomicAdd(&s_channel[t / per], 1);
  }
  __syncthreads();
  auto* records = reinterpret_cast<int64_t*>(p.records);
  if (node) {  // the node's prefix, and its counts in the records of each of its ranks
    if (tid == 0) {
      auto* prefix = reinterpret_cast<int*>(p.node_send_prefix) + int64_t(col) * C;
      int sum = 0;
      for (int c = 0; c < C; ++c) prefix[c] = sum += s_channel[c];
    }
    for (int k = tid; k < G * C; k += blockDim.x)
      records[int64_t(col * G + k / C) * p.record_ints + p.node_col + k % C] = s_channel[k % C];
    return;
  }
  const int j = col;
  auto* rec = records + int64_t(j) * p.record_ints;
  if (tid == 0) {
    auto* prefix = reinterpret_cast<int*>(p.send_prefix) + int64_t(j) * C;
    int sum = 0;
    for (int c = 0; c < C; ++c) {
      sum += s_channel[c];
      prefix[c] = sum;
      rec[R + c] = s_channel[c];
    }
    rec[p.record_ints - 1] = p.msg_bytes;
  }
  const auto* per_rank = reinterpret_cast<const int*>(p.num_tokens_per_rank);
  const auto* per_expert = reinterpret_cast<const int*>(p.num_tokens_per_expert);
  const int E_loc = int(p.num_local_experts);
  for (int r = tid; r < R; r += blockDim.x) rec[r] = per_rank[r];
  for (int e = tid; e < E_loc; e += blockDim.x) rec[R + C + e] = per_expert[int64_t(j) * E_loc + e];
}

extern "C" __global__ void __launch_bounds__(kPlanThreads) ht_proxy_plan_recv(const UCCL_GRID_CONSTANT HTProxyPlanRecvParams p) {
  __shared__ int s_end[kHTProxyMaxRanks];
  const int R = int(p.num_ranks), C = int(p.num_channels), me = int(p.rank), tid = threadIdx.x;
  const int64_t L = p.record_ints;
  const auto* meta = reinterpret_cast<const int64_t*>(p.meta_out);
  if (tid == 0) {
    int sum = 0;
    for (int i = 0; i < R; ++i) s_end[i] = sum += int(meta[i * L + me]);
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    auto* end = reinterpret_cast<int*>(p.recv_end);
    for (int i = tid; i < R; i += blockDim.x) {
      end[i] = s_end[i];
      if (p.recv_end_copy != 0) reinterpret_cast<int*>(p.recv_end_copy)[i] = s_end[i];
    }
    for (int i = tid; i < R; i += blockDim.x) {  // one source per thread: its channels in order
      int row = s_end[i] - int(meta[i * L + me]), sent = 0;
      for (int c = 0; c < C; ++c) {
        const int n = int(meta[i * L + R + c]);
        reinterpret_cast<int*>(p.recv_prefix)[i * C + c] = row;
        row += n;
        sent += n;
        if (p.channel_prefix != 0) reinterpret_cast<int*>(p.channel_prefix)[i * C + c] = sent;
      }
    }
    if (p.rank_prefix != 0) {  // [i][j]: tokens sources 0..i send rank j
      for (int col = tid; col < R; col += blockDim.x) {
        int sum = 0;
        for (int i = 0; i < R; ++i) reinterpret_cast<int*>(p.rank_prefix)[i * R + col] = sum += int(meta[i * L + col]);
      }
    }
    if (p.send_prefix_copy != 0)
      for (int k = tid; k < R * C; k += blockDim.x)
        reinterpret_cast<int*>(p.send_prefix_copy)[k] = reinterpret_cast<const int*>(p.send_prefix)[k];
    if (p.recv_count != 0)
      for (int k = tid; k < R * C; k += blockDim.x)
        reinterpret_cast<int*>(p.recv_count)[k] = int(meta[(k / C) * L + R + k % C]);
    if (p.node_col >= 0 && tid == 0) {  // one thread: N nodes x C channels, a few hundred values
      const int G = int(p.ranks_per_node), N = R / G;
      int row = 0;
      for (int n = 0; n < N; ++n) {
        const int64_t* rail = meta + int64_t(n * G + me % G) * L + p.node_col;
        for (int c = 0; c < C; ++c) {
          reinterpret_cast<int*>(p.rdma_prefix)[n * C + c] = row;
          reinterpret_cast<int*>(p.rdma_count)[n * C + c] = int(rail[c]);
          row += int(rail[c]);
        }
        reinterpret_cast<int*>(p.rdma_end)[n] = row;
      }
    }
  }
  const int total = R > 0 ? s_end[R - 1] : 0;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + tid; row < p.num_rows; row += int64_t(gridDim.x) * blockDim.x) {
    const bool valid = row < total;
    int src = 0;
    while (src < R && s_end[src] <= row) ++src;  // searchsorted(recv_end, row, right=True)
    if (p.recv_src_meta != 0) {
      reinterpret_cast<int*>(p.recv_src_meta)[2 * row] = valid ? src : 0;
      reinterpret_cast<int*>(p.recv_src_meta)[2 * row + 1] = valid ? 1 : 0;
    }
    if (p.nvl_head != 0) reinterpret_cast<int*>(p.nvl_head)[row] = valid ? int(row) : -1;
  }
}

namespace {

constexpr int kMaxLocal = 8;  // ranks per node (ht_proxy_plan.MAX_LOCAL: the engine refuses more)
// ht_proxy_forward_handle: threads of a block and forwarder rows per chunk (ht_proxy_forward.py
// mirrors both). A warp takes kHandleItems runs of kWarpSize consecutive rows (coalesced loads,
// one ballot numbers a run), so a chunk is kHandleRows rows whatever the warp size.
constexpr int kHandleThreads = 512;
constexpr int kHandleRows = 1024;
constexpr int kHandleItems = kHandleRows / kHandleThreads;
constexpr int kCountLoads = 8;  // 16-byte loads in flight per thread in count_bits

// Bits 0..3 of x moved to the low bit of bytes 0..3.
UCCL_DEVICE uint32_t spread4(uint32_t x) { return ((x & 0xFu) * 0x00204081u) & 0x01010101u; }

// Adds to count[g] the rows of mask[from, to) with bit g, this thread's share of the block's.
// NOTES: a chunk's first segment may start far before it (a skewed source: up to every forwarder
// row), so this is the kernel's long pole: four rows a 16-byte load, kCountLoads loads in flight (a
// load at a time leaves it waiting on latency), and each row's 8 bits spread into the bytes of two
// words (a few operations a row instead of three per bit), emptied before a byte can overflow.
UCCL_DEVICE void count_bits(const int* mask, int64_t from, int64_t to, int (&count)[kMaxLocal]) {
  const int tid = threadIdx.x, threads = blockDim.x;
  uint32_t low = 0, high = 0;  // bytes: rows with bits 0..3, 4..7
  const auto add = [&](uint32_t w) {
    low += spread4(w);
    high += spread4(w >> 4);
  };
  const auto empty = [&]() {
#pragma unroll
    for (int g = 0; g < 4; ++g) count[g] += (low >> (8 * g)) & 0xFF, count[g + 4] += (high >> (8 * g)) & 0xFF;
    low = high = 0;
  };
  const int64_t head = int64_t((16 - (reinterpret_cast<uintptr_t>(mask + from) & 15)) & 15) / 4;
  const int64_t a = from + head < to ? from + head : to, b = a + (to - a) / 4 * 4;  // [a, b): 16-byte loads
  if (from + tid < a) add(uint32_t(mask[from + tid]));
  const auto* vec = reinterpret_cast<const int4*>(mask + a);
  const int64_t vecs = (b - a) / 4;
  int added = 1;
  for (int64_t j = tid; j < vecs; j += kCountLoads * threads) {
    int4 q[kCountLoads];
#pragma unroll
    for (int u = 0; u < kCountLoads; ++u) q[u] = j + u * threads < vecs ? vec[j + u * threads] : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kCountLoads; ++u)
      add(uint32_t(q[u].x)), add(uint32_t(q[u].y)), add(uint32_t(q[u].z)), add(uint32_t(q[u].w));
    if ((added += 4 * kCountLoads) > 255 - 4 * kCountLoads) empty(), added = 0;
  }
  if (b + tid < to) add(uint32_t(mask[b + tid]));
  empty();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kHandleThreads) ht_proxy_forward_handle(const UCCL_GRID_CONSTANT HTProxyForwardHandleParams p) {
  __shared__ int s_out[kHandleRows * kMaxLocal];  // the chunk's rows of send_nvl_head, stored out whole
  __shared__ int s_col[kHTProxyMaxRanks * kMaxLocal];  // [i][g]: tokens source i sends local rank g
  __shared__ int s_count[kHTProxyMaxRanks * kHTProxyMaxChannels];  // rdma_count
  __shared__ int s_base[kHTProxyMaxRanks * kMaxLocal];  // [s][g]: g's rows from sources before s's rail rank
  __shared__ int64_t s_first[kHTProxyMaxRanks], s_last[kHTProxyMaxRanks];  // segment s: rows [first, last)
  __shared__ int s_warp[kHandleThreads / kWarpSize][kMaxLocal];    // rows with bit g per warp (this pass)
  __shared__ int s_before[kHandleThreads / kWarpSize][kMaxLocal];  // ... of the segment before the chunk
  __shared__ int s_end[kHTProxyMaxRanks];
  const int R = int(p.num_ranks), G = int(p.ranks_per_node), N = R / G, C = int(p.num_channels), me = int(p.rank);
  const int tid = threadIdx.x, warp = warp_id(), lane = lane_id(), warps = num_warps();
  const auto* rdma_end = reinterpret_cast<const int*>(p.rdma_end);
  const auto* rdma_count = reinterpret_cast<const int*>(p.rdma_count);
  const int64_t chunks = (p.rdma_rows + kHandleRows - 1) / kHandleRows;
  if (G > kMaxLocal) return;  // the shared arrays' bound (the engine never launches it so)
  for (int k = tid; k < N * C; k += blockDim.x) s_count[k] = rdma_count[k];
  if (int64_t(blockIdx.x) < chunks) {  // forwarder rows [c0, c1): send_nvl_head
    // NOTES: segment s (node s's rail source) starts where forward_handle starts it (rdma_end - its
    // row count); a row's value at local rank g is g's rows from sources before node s's rail rank
    // (counts.cumsum(0) - counts over the received records' rank columns) + its rank among the
    // segment's rows with bit g. Chunks rather than a block per segment, so a skewed source's rows
    // spread over the grid; a block counts its first segment's rows before the chunk itself (no
    // other block to wait for), and stages its rows in shared memory to store them whole (stored
    // by column, 4-byte writes from many blocks into the same lines cost more than the scan).
    const int64_t c0 = int64_t(blockIdx.x) * kHandleRows;
    const int64_t c1 = c0 + kHandleRows < p.rdma_rows ? c0 + kHandleRows : p.rdma_rows;
    const auto* meta = reinterpret_cast<const int64_t*>(p.meta_out);
    const auto* mask = reinterpret_cast<const int*>(p.rdma_mask);
    for (int k = tid; k < R * G; k += blockDim.x) s_col[k] = int(meta[(k / G) * p.record_ints + (me / G) * G + k % G]);
    for (int k = tid; k < kHandleRows * G; k += blockDim.x) s_out[k] = -1;  // rows of no segment keep it
    int word[kHandleItems];  // the chunk's masks, loads in flight during the set-up
    const int64_t run0 = c0 + int64_t(warp) * kHandleItems * kWarpSize + lane;
#pragma unroll
    for (int i = 0; i < kHandleItems; ++i) word[i] = run0 + i * kWarpSize < c1 ? mask[run0 + i * kWarpSize] : 0;
    __syncthreads();
    for (int k = tid; k < N * G; k += blockDim.x) {
      int sum = 0;
      for (int i = 0; i < (k / G) * G + me % G; ++i) sum += s_col[i * G + k % G];
      s_base[k] = sum;
    }
    for (int s = tid; s < N; s += blockDim.x) {
      int rows = 0;
      for (int c = 0; c < C; ++c) rows += s_count[s * C + c];
      s_first[s] = int64_t(rdma_end[s]) - rows;
      s_last[s] = rdma_end[s] < p.rdma_rows ? int64_t(rdma_end[s]) : p.rdma_rows;
    }
    __syncthreads();
    for (int s = 0; s < N; ++s) {  // the segments the chunk overlaps (block-uniform bounds)
      const int64_t lo = s_first[s] > c0 ? s_first[s] : c0, hi = s_last[s] < c1 ? s_last[s] : c1;
      if (lo >= hi) continue;
      int before[kMaxLocal] = {};  // the segment's rows with bit g before row k (this thread's so far)
      if (s_first[s] < lo) count_bits(mask, s_first[s], lo, before);
#pragma unroll
      for (int g = 0; g < kMaxLocal; ++g) {
        if (g >= G) break;
        int in_warp = 0;
#pragma unroll
        for (int i = 0; i < kHandleItems; ++i) {
          const int64_t k = run0 + i * kWarpSize;
          in_warp += popc64(warp_ballot(k >= lo && k < hi && ((word[i] >> g) & 1) != 0));
        }
        const int earlier = warp_sum(before[g]);
        if (lane == 0) s_warp[warp][g] = in_warp, s_before[warp][g] = earlier;
      }
      __syncthreads();
#pragma unroll
      for (int g = 0; g < kMaxLocal; ++g) {
        if (g >= G) break;
        before[g] = s_base[s * G + g];
        for (int w = 0; w < warps; ++w) before[g] += s_before[w][g] + (w < warp ? s_warp[w][g] : 0);
      }
#pragma unroll
      for (int i = 0; i < kHandleItems; ++i) {
        const int64_t k = run0 + i * kWarpSize;
        const bool row = k >= lo && k < hi;
#pragma unroll
        for (int g = 0; g < kMaxLocal; ++g) {
          if (g >= G) break;
          const bool in = row && ((word[i] >> g) & 1) != 0;
          const uint64_t bits = warp_ballot(in);
          if (in) s_out[(k - c0) * G + g] = before[g] + popc64(bits & lanemask_lt());
          before[g] += popc64(bits);
        }
      }
      __syncthreads();  // s_warp and s_before are the next segment's
    }
    auto* nvl_head = reinterpret_cast<int*>(p.send_nvl_head) + c0 * G;
    for (int64_t e = tid; e < (c1 - c0) * G; e += blockDim.x) nvl_head[e] = s_out[e];
    return;
  }
  // the per-row items: grid-stride over the blocks after the chunks
  const int64_t block = int64_t(blockIdx.x) - chunks, stride = (int64_t(gridDim.x) - chunks) * blockDim.x;
  for (int i = tid; i < R; i += blockDim.x) s_end[i] = reinterpret_cast<const int*>(p.recv_end)[i];
  __syncthreads();
  const int total = s_end[R - 1];
  const auto* recv_mask = reinterpret_cast<const int*>(p.recv_mask);
  auto* src_meta = reinterpret_cast<int*>(p.recv_src_meta);
  for (int64_t row = block * blockDim.x + tid; row < p.num_rows; row += stride) {
    const bool valid = row < total;
    int src = 0;
    while (src < R && s_end[src] <= row) ++src;  // searchsorted(recv_end, row, right=True)
    src_meta[2 * row] = valid ? src / G : 0;
    src_meta[2 * row + 1] = valid ? recv_mask[row] : 0;
  }
  if (block == 0) {
    for (int k = tid; k < N * C; k += blockDim.x) {  // one (node, channel) per thread
      int sum = 0;
      for (int c = 0; c <= k % C; ++c) sum += s_count[k - k % C + c];
      reinterpret_cast<int*>(p.recv_rdma_prefix)[k] = sum;
    }
    for (int n = tid; n < N; n += blockDim.x) reinterpret_cast<int*>(p.rdma_rank_prefix)[n] = rdma_end[n];
  }
}
