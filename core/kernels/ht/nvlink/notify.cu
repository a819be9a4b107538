// Fresh intranode dispatch, step 1: exchange counts so every receiver knows its row layout.
//
// One block. Each rank counts its tokens per (destination, channel), writes to every peer j's
// notify area {my per-rank counts, my per-channel counts toward j, my counts of j's experts},
// raises a tagged signal there, waits for every peer's, and computes the handle's prefix
// matrices, per-expert totals (aligned), the number of rows it will receive and every rank's
// tokens per destination (R x R); these go to pinned host memory for the CPU (unless
// num_worst_tokens fixes the row count: then nobody waits on the host and the call is
// graph-capturable).
//
// NOTES: the notify area is double-buffered by the parity of the fresh-dispatch sequence number
// (a device word, so graph replays work); before overwriting a parity slot at a peer, a rank
// waits for that peer's ack of the op two fresh dispatches back.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {
UCCL_DEVICE uint64_t* sig_at(uint64_t buf, int par, int src, int R) {
  return reinterpret_cast<uint64_t*>(buf + kHTNotifyOffset) + par * R + src;
}
UCCL_DEVICE uint64_t* ack_at(uint64_t buf, int peer, int R) {
  return reinterpret_cast<uint64_t*>(buf + kHTNotifyOffset) + 2 * R + peer;
}
UCCL_DEVICE int* payload_at(uint64_t buf, int par, int src, int R) {
  return reinterpret_cast<int*>(buf + kHTNotifyPayloadOffset) + (int64_t(par) * R + src) * kHTNotifyStride;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(512) ht_notify(const UCCL_GRID_CONSTANT HTNotifyParams p) {
  __shared__ int s_cnt[kHTMaxRanks][kHTMaxChannels];
  __shared__ int s_total[kHTMaxRanks];
  __shared__ int s_ok;
  const int R = int(p.num_ranks), C = int(p.num_channels), me = int(p.rank);
  const int E_loc = int(p.num_experts / p.num_ranks);
  const int T = int(p.num_tokens), tid = threadIdx.x;
  const auto* peer = reinterpret_cast<const uint64_t*>(p.peer_buf);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  const uint32_t tag = *reinterpret_cast<const unsigned*>(p.seq) + 1u;
  const int par = tag & 1;
  if (tid == 0) s_ok = 1;

  // a. tokens per (destination, channel).
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  const int per = (T + C - 1) / C;
  for (int c = warp_id(); c < C; c += num_warps()) {
    int cnt[kHTMaxRanks] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int t1 = min(T, (c + 1) * per);
    for (int t = min(T, c * per) + lane_id(); t < t1; t += kWarpSize) {
#pragma unroll
      for (int j = 0; j < kHTMaxRanks; ++j)
        if (j < R) cnt[j] += in_rank[int64_t(t) * R + j];
    }
#pragma unroll
    for (int j = 0; j < kHTMaxRanks; ++j) {
      int v = cnt[j];
      for (int m = kWarpSize / 2; m >= 1; m >>= 1) v += shfl_xor(v, m);
      if (lane_id() == 0 && j < R) s_cnt[j][c] = v;
    }
  }
  __syncthreads();
  if (tid < R) {
    int acc = 0;
    for (int c = 0; c < C; ++c) {
      acc += s_cnt[tid][c];
      reinterpret_cast<int*>(p.channel_prefix)[tid * C + c] = acc;
    }
    s_total[tid] = acc;
  }
  __syncthreads();

  // b. wait until each peer consumed our notify two ops back, then write its payload.
  if (tid < R && tag > 2) {
    const uint64_t* ack = ack_at(peer[me], tid, R);
    if (wait_tagged_at_least(ack, tag - 2, uint64_t(p.timeout_ns), err, kPhaseHTNotify, me, tid) < 0) s_ok = 0;
  }
  __syncthreads();
  const auto* ntpe = reinterpret_cast<const int*>(p.num_tokens_per_expert);
  for (int j = 0; j < R; ++j) {
    int* dst = payload_at(peer[j], par, me, R);
    for (int i = tid; i < R + C + E_loc; i += blockDim.x) {
      int v;
      if (i < R) v = s_total[i];
      else if (i < R + C) v = s_cnt[j][i - R];
      else v = ntpe[j * E_loc + (i - R - C)];
      dst[i] = v;
    }
  }
  __syncthreads();
  if (tid < R) {
    fence_system();
    st_release_sys(sig_at(peer[tid], par, me, R), uint64_t(tag) << 32);
  }
  // c. wait for every peer's payload.
  if (tid < R) {
    if (wait_tagged(sig_at(peer[me], par, tid, R), tag, uint64_t(p.timeout_ns), err, kPhaseHTNotify, me, tid, -1,
                    nullptr) < 0)
      s_ok = 0;
  }
  __syncthreads();

  // d. the handle's matrices and the host-visible counts.
  auto* host = reinterpret_cast<int*>(p.host);
  if (tid == 0) {
    for (int j = 0; j < R; ++j) {
      int acc = 0;
      for (int i = 0; i < R; ++i) {
        acc += payload_at(peer[me], par, i, R)[j];
        reinterpret_cast<int*>(p.rank_prefix)[i * R + j] = acc;
      }
    }
  }
  if (tid < R) {
    const int* pl = payload_at(peer[me], par, tid, R);
    int start = 0;
    for (int i = 0; i < tid; ++i) start += payload_at(peer[me], par, i, R)[me];
    for (int c = 0; c < C; ++c) {
      reinterpret_cast<int*>(p.recv_channel_prefix)[tid * C + c] = start;
      start += pl[R + c];
    }
    host[2 + tid] = pl[me];
  }
  for (int i = tid; i < R * R; i += blockDim.x)  // every rank's tokens per destination (the copy-engine combine's sizes)
    host[2 + R + E_loc + i] = payload_at(peer[me], par, i / R, R)[i % R];
  for (int e = tid; e < E_loc; e += blockDim.x) {
    int64_t sum = 0;
    for (int i = 0; i < R; ++i) sum += payload_at(peer[me], par, i, R)[R + C + e];
    const int64_t a = p.expert_alignment;
    host[2 + R + e] = int((sum + a - 1) / a * a);
  }
  __syncthreads();
  if (tid == 0) {
    int num_recv = 0;
    for (int i = 0; i < R; ++i) num_recv += payload_at(peer[me], par, i, R)[me];
    host[1] = s_ok ? num_recv : -1;
    if (p.num_worst_tokens > 0 && num_recv > p.num_worst_tokens)
      raise_error(err, kErrProtocol, kPhaseHTNotify, me, -1, num_recv, 0);
    fence_system();
    st_release_sys(host, int(p.host_tag));
  }
  // e. acknowledge the payloads (read above) to their senders; bump the sequence.
  if (tid < R) {
    fence_system();
    st_release_sys(ack_at(peer[tid], me, R), uint64_t(tag) << 32);
  }
  if (tid == 0) *reinterpret_cast<unsigned*>(p.seq) = tag;
}
