// Intranode (NVLink) combine with the copy engines moving the rows (Tuning.ht_combine_ce).
//
// At EP R a rank's combine input x holds, per source rank j, one contiguous run of rows: the rows
// of j's tokens, in j's token order. So "send the rows back" is R - 1 plain copies, which the
// copy engines do (uccl_ep/cuda/ht_ce.py issues them on a side stream, in chunks, each chunk
// followed by an 8-byte copy of the epoch into the receiver's flags[me][chunk]), and every SM of
// the combine sums: nothing but local reads (own rows in x, peers' rows in the staging buffer)
// and the output stores.
//
//   ht_ce_begin (ht/nvlink/dispatch_ce.cu; 1 thread): epoch += 1; epoch_src = epoch; wait until
//     every peer has freed this rank's rows of the previous epoch (freed[j] >= epoch - 1) so its
//     staging region can be overwritten. Runs before the copies (stream order).
//   ht_combine_ce (all blocks): warp w of W takes tokens w, w + W, ... (every warp walks the
//     rows in order, so the chunks are needed in the order the copy engine lands them); for token
//     t of channel c and each rank j (ascending) that received it: j == me: x row
//     recv_channel_prefix[me][c] + send_head[t][me]; else staging region j, row
//     channel_prefix[j][c - 1] + send_head[t][j] (the rank's tokens sent to j before channel c,
//     plus its place in the channel), once flags[j][row / chunk_rows] reached the epoch.
//     out[t] = (bias0 + bias1) + row_0 + row_1 + ... in fp32 as ht/nvlink/combine.cu (bit-exact
//     with uccl_ep.refs). The last block to finish tells every peer j freed[me] = epoch.
//
// NOTES: why: the ring combine moves every remote row on the SMs twice (sender: x -> the receiver's
// ring; receiver: ring -> the sum), and with half of the SMs as senders the receivers (3 row
// transfers per token) bound it at few SMs. Here the SMs only sum, and the NVLink bytes cross on
// copy engines (NCCL's path); docs/benchmarks.md has both paths' numbers.
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/combine_sum.cuh"
#include "uccl_ep/device/ht_tuning.cuh"
#include "uccl_ep/device/numeric.cuh"
#include "uccl_ep/device/wait.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

namespace {

// Bounded wait (lane 0 spins, the warp follows) until *flag >= epoch; false on timeout / error.
UCCL_DEVICE bool warp_wait_epoch(const uint64_t* flag, uint64_t epoch, const HTCombineCEParams& p, int peer, int chunk) {
  int ok = 1;
  if (lane_id() == 0)
    ok = wait_u64_at_least(flag, epoch, uint64_t(p.timeout_ns), reinterpret_cast<ErrorWord*>(p.error),
                           kPhaseHTCombineRecv, int(p.rank), peer, chunk);
  return shfl_idx(ok, 0) != 0;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kHTThreads, 1) ht_combine_ce(const UCCL_GRID_CONSTANT HTCombineCEParams p) {
  const int R = int(p.num_ranks), C = int(p.num_channels), me = int(p.rank);
  const int T = int(p.num_tokens);
  const int64_t H = p.hidden, K = p.num_topk;
  const int per = (T + C - 1) / C;
  const int lane = lane_id(), warp = warp_id(), nw = num_warps();
  const int W = int(gridDim.x) * nw, gw = int(blockIdx.x) * nw + warp;
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(ce_word(p.stage, kCEEpochOffset));
  const auto* in_rank = reinterpret_cast<const uint8_t*>(p.is_token_in_rank);
  const auto* send_head = reinterpret_cast<const int*>(p.send_head);
  const auto* chp = reinterpret_cast<const int*>(p.channel_prefix);
  const auto* rcp = reinterpret_cast<const int*>(p.recv_channel_prefix);
  const int64_t w_off = p.cap_rows * H * 2;  // a region: rows, then weights
  int ready[kRanks];  // highest chunk of source j seen landed (chunks land in order)
#pragma unroll
  for (int j = 0; j < kRanks; ++j) ready[j] = -1;
  bool failed = false;

  for (int tb = gw; tb < T && !failed; tb += W * kWarpSize) {
    // lane l holds token tb + l * W's row in each source (-1: not routed there)
    const int tl = tb + lane * W;
    const int cl = tl < T ? tl / per : 0;
    int row_of_lane[kRanks];
#pragma unroll
    for (int j = 0; j < kRanks; ++j) {
      int v = -1;
      if (j < R && tl < T && in_rank[int64_t(tl) * R + j]) {
        const int sh = send_head[int64_t(tl) * R + j];
        v = j == me ? rcp[me * C + cl] + sh : (cl > 0 ? chp[j * C + cl - 1] : 0) + sh;
      }
      row_of_lane[j] = v;
    }
    for (int o = 0; o < kWarpSize; ++o) {
      const int t = tb + o * W;
      if (t >= T) break;
      const uint8_t* rows[kRanks];
      const float* wrows[kRanks];
      int nsrc = 0;
#pragma unroll
      for (int j = 0; j < kRanks; ++j) {
        if (j >= R) continue;
        const int r = shfl_idx(row_of_lane[j], o);
        if (r < 0) continue;
        if (j == me) {
          rows[nsrc] = reinterpret_cast<const uint8_t*>(p.x) + int64_t(r) * H * 2;
          wrows[nsrc++] = p.out_weights != 0 ? reinterpret_cast<const float*>(p.topk_weights) + int64_t(r) * K : nullptr;
          continue;
        }
        const int chunk = int(r / p.chunk_rows);
        if (chunk > ready[j]) {
          if (!warp_wait_epoch(ce_word(p.stage, kCEFlagsOffset + 8ull * (uint64_t(j) * kCEMaxChunks + chunk)), epoch,
                               p, j, chunk)) {
            failed = true;
            break;
          }
          ready[j] = chunk;
        }
        const uint64_t region = p.stage + kCEDataOffset + uint64_t(ce_region_slot(j, me)) * uint64_t(p.region_bytes);
        rows[nsrc] = reinterpret_cast<const uint8_t*>(region) + int64_t(r) * H * 2;
        // NOTES: the peer's weights are there whenever this combine has weights, even when this
        // rank's own topk_weights is empty (no rows received: its pointer is 0)
        wrows[nsrc++] = p.out_weights != 0 ? reinterpret_cast<const float*>(region + w_off) + int64_t(r) * K : nullptr;
      }
      if (failed) break;
      auto* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(t) * H * 2;
      warp_combine_token(out, rows, nsrc, H, p.bias0, p.bias1, t);
      if (p.out_weights != 0) {
        for (int kk = lane; kk < K; kk += kWarpSize) {
          float acc = 0.0f;
          for (int s = 0; s < nsrc; ++s)
            acc = __fadd_rn(acc, __uint_as_float(ld_u32_cg(reinterpret_cast<const uint8_t*>(wrows[s] + kk))));
          reinterpret_cast<float*>(p.out_weights)[int64_t(t) * K + kk] = acc;
        }
      }
      sync_warp();
    }
  }
  // Every read of the staging buffer done in this block: count it; the last block frees the
  // peers' regions for their next epoch (after an error the peers time out in their begin kernel).
  __syncthreads();
  if (threadIdx.x == 0 && !failed) {
    __threadfence();
    auto* done = reinterpret_cast<unsigned*>(p.stage + kCEDoneOffset);
    if (atomicAdd(done, 1u) + 1 == gridDim.x) {
      *done = 0u;
      const auto* peers = reinterpret_cast<const uint64_t*>(p.peer_stage);
      for (int j = 0; j < R; ++j)
        if (j != me) st_release_sys(ce_word(peers[j], kCEFreedOffset + 8ull * me), epoch);
    }
  }
}
