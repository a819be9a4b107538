// What a block of the two forward kernels stands on (ht/proxy/forward_dispatch.cu and
// ht/proxy/forward_combine.cu): the job as nodes of local ranks, the block's channel and role, and
// the two shapes of work both kernels share: the warp groups facing the other local ranks (dispatch
// hop 2, combine hop A) and the forwarder's pass over its rail sources.
#pragma once

#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/internode_ring.cuh"

namespace uccl_ep::dev {

// R ranks as N nodes of G local ranks; this rank `me` is local rank `me_local` of node `node`;
// 3 blocks per channel: block 3c + role; the channel's tokens [t_begin, t_end).
struct ForwardBlock {
  int R, C, G, N, me, me_local, node, c, role, t_begin, t_end;
};

template <class P>
UCCL_DEVICE ForwardBlock forward_block(const P& p) {
  ForwardBlock b;
  b.R = int(p.num_ranks);
  b.C = int(p.num_channels);
  b.G = int(p.ranks_per_node);
  b.N = b.R / b.G;
  b.me = int(p.rank);
  b.me_local = b.me % b.G;
  b.node = b.me / b.G;
  b.c = int(blockIdx.x / 3);
  b.role = int(blockIdx.x % 3);
  const TokenRange t = channel_tokens(int(p.num_tokens), b.C, b.c);
  b.t_begin = t.begin;
  b.t_end = t.end;
  return b;
}

// This warp's group among the block's warps split over the G - 1 other local ranks: group `grp`
// faces local rank f (local index f_local); n is the messages of the stream between this rank and
// f in channel c, summed over f's rail sources (recv_count [R][C]: what each source sent here).
struct MateGroup {
  WarpGroup g;
  int grp, f, f_local;
  int64_t n;
};

// False when this warp has no group (a single local rank, or warps left over).
UCCL_DEVICE bool mate_group(const ForwardBlock& b, const int* recv_count, int* s_arrive, MateGroup& m) {
  if (b.G < 2) return false;
  const int W = num_warps() / (b.G - 1);
  m.grp = warp_id() / W;
  if (W < 1 || m.grp >= b.G - 1) return false;
  m.f_local = m.grp < b.me_local ? m.grp : m.grp + 1;
  m.f = b.node * b.G + m.f_local;
  m.g = WarpGroup{&s_arrive[m.grp], W, warp_id() % W, 0u};
  m.n = 0;
  for (int src = m.f_local; src < b.R; src += b.G) m.n += recv_count[src * b.C + b.c];
  return true;
}

// The forwarder's pass: for every rail source (node m's local rank me_local) in ascending order,
// `stream(m, src, rdma_first, recv_first)` runs that source's stream with all the block's warps
// (rdma_first: the source's first message in channel c of rdma_prefix [N][C]; recv_first: its first
// row here, recv_prefix [R][C]); `self_run` (the shared run of own rows) is cleared before each. False
// as soon as one fails, in every thread alike (s_fail is read after a barrier).
template <class Shared, class Stream>
UCCL_DEVICE bool for_each_rail_source(const ForwardBlock& b, const int* rdma_prefix, const int* recv_prefix,
                                      Shared& sh, int* s_fail, Stream stream) {
  for (int m = 0; m < b.N; ++m) {
    const int src = m * b.G + b.me_local;
    if (threadIdx.x == 0) sh.self_run = 0;
    __syncthreads();
    if (!stream(m, src, int64_t(rdma_prefix[m * b.C + b.c]), int64_t(recv_prefix[src * b.C + b.c]))) *s_fail = 1;
    __syncthreads();
    if (*s_fail) return false;
  }
  return true;
}

}  // namespace uccl_ep::dev
