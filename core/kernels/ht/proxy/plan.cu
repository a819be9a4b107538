// The plan of a fresh normal-mode dispatch through the CPU proxy (one rank per node, or every rank
// through the proxy on one node): the matrices uccl_ep/cuda/ht_proxy_plan.py defines, computed on the
// device in two launches instead of a few dozen small tensor operations on the host.
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
//
// NOTES: the host knows `num_rows` only after waiting for the notify kernel (or from
// num_worst_tokens), so the per-row items belong to the second launch; everything the dispatch
// kernel reads is written before it starts (same stream).
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
