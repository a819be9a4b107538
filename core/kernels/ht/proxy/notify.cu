// Start of every normal-mode op through the CPU proxy: the host executor's exchange_meta
// (uccl_ep/host/ht_common.py), carried out by one block.
//
// Fresh dispatch: each rank copies its record for destination d (counts per rank, its tokens to d
// per channel, its counts of d's experts, with several ranks per node its tokens to d's node per
// channel, the message size) into its meta send slot
// [parity][d], pushes a counted Write into d's receive slot [parity][me] and a fenced Atomic
// (value 2: "one write, then add 2") on counter META(parity), waits until every source's META
// counter grew by 2, copies the records it received to `meta_out`, checks that every rank uses
// the same message size, and publishes to pinned host memory the rows it will receive and the
// aligned per-expert counts, and with several ranks per node the rows it receives as its node's
// forwarder (unless num_worst_tokens fixes the rows: then nobody waits on them).
// Cached dispatch and combine: a bare handshake (fenced Atomic of value 1, no write), where needed.
//
// NOTES: an op may start sending into an area's rings only after every peer finished reading what
// earlier ops wrote there in another geometry (message size, slots, bases: slots would overlap
// unread ones), while positions continue from op to op; the handshake proves it (every peer started
// this op). Where the op uses its areas in the geometry they were used in since the last handshake,
// positions and credits simply continue and the handshake is skipped: decided here, from
// HTProxyState::area_geometry, so CUDA-graph replays decide as eager calls do, and every rank alike
// (same calls, same shapes). A skipped handshake leaves the op counter (parity) unchanged. The
// double-buffers the meta slots exactly as the host executor does (an op starts only after
// every peer's record of the previous op arrived, so slot [parity] is never overwritten early).
#include "uccl_ep/device/internode_ring.cuh"

using namespace uccl_ep;
using namespace uccl_ep::dev;

extern "C" __global__ void __launch_bounds__(256) ht_proxy_notify(const UCCL_GRID_CONSTANT HTProxyNotifyParams p) {
  if (ht_dma_block(p)) return;  // the copy role's blocks follow block 0 (device/ht_dma.cuh)
  __shared__ int s_ok;
  __shared__ unsigned s_op;
  const int R = int(p.num_ranks), me = int(p.rank), tid = threadIdx.x;
  const int64_t L = p.record_ints;
  const bool handshake = p.handshake != 0;
  auto* state = reinterpret_cast<HTProxyState*>(p.state);
  auto* err = reinterpret_cast<ErrorWord*>(p.error);
  auto* region = reinterpret_cast<uint8_t*>(p.region);
  const auto* counters = reinterpret_cast<const int64_t*>(p.counters);
  const auto* fifos = reinterpret_cast<const FifoLayout*>(p.fifos);
  __shared__ int s_skip;
  const uint64_t geometry[2] = {p.area_geometry0, p.area_geometry1};
  if (tid == 0) {
    s_ok = 1;
    s_op = state->op;
    bool changed = false;
    for (int a = 0; a < 2; ++a)
      changed = changed || (geometry[a] != 0 && state->area_geometry[a] != 0 && state->area_geometry[a] != geometry[a]);
    s_skip = handshake && !changed;
    if (s_skip)
      for (int a = 0; a < 2; ++a)
        if (geometry[a] != 0) state->area_geometry[a] = geometry[a];
  }
  __syncthreads();
  if (s_skip) return;
  const int par = int(s_op & 1u);
  const int64_t counter = kHTProxyMetaCounter + par;

  // a. this rank's records into its send slots.
  if (!handshake) {
    const auto* per_dst = reinterpret_cast<const int64_t*>(p.per_dst);
    for (int64_t i = tid; i < int64_t(R) * L; i += blockDim.x) {
      const int64_t d = i / L, col = i % L;
      auto* slot = reinterpret_cast<int64_t*>(region + ht_meta_send(uint64_t(p.meta_base), p.meta_slot_bytes, R, par, d));
      slot[col] = per_dst[i];
    }
  }
  fence_system();  // the records reach memory the proxy's copy engine reads before any push
  __syncthreads();

  // b. one counted Write (fresh) and one fenced Atomic per destination, on the FIFO of the
  //    META counter (a counter's writes and its fence must share a FIFO, hence a proxy thread).
  if (tid < R) {
    const FifoLayout& f = fifos[counter % p.num_fifos];
    const PushSite site{kPhaseHTNotify, me, tid, -1};
    bool ok = true;
    if (!handshake) {
      const uint64_t from = ht_meta_send(uint64_t(p.meta_base), p.meta_slot_bytes, R, par, tid);
      const uint64_t to = ht_meta_recv(uint64_t(p.meta_base), p.meta_slot_bytes, R, par, me);
      if (p.dma_blocks > 0) dma_count_push(dma_context(p.dma), int(counter % p.num_fifos), uint64_t(L * 8));
      ok = fifo_push(f, protocol::make_counted_write(uint32_t(tid), from, to, uint32_t(L * 8), uint32_t(counter)),
                     uint64_t(p.timeout_ns), err, site);
    }
    ok = ok && fifo_push(f, protocol::make_atomic(uint32_t(tid), uint32_t(counter), handshake ? 1 : 2, true),
                         uint64_t(p.timeout_ns), err, site);
    if (!ok) s_ok = 0;
  }
  if (p.dma_blocks > 0) {  // every push of this launch made: the copy role's one signal
    __syncthreads();
    if (tid == 0) dma_signal(dma_context(p.dma));
  }

  // c. every source's record (or handshake) of this op.
  if (tid < R) {
    const int64_t target = state->seen[par][tid] + (handshake ? 1 : 2);
    const int64_t got = wait_counter(counters + int64_t(tid) * p.num_counters + counter, target,
                                     reinterpret_cast<const uint64_t*>(p.status), uint64_t(p.timeout_ns), err,
                                     kPhaseHTNotify, me, tid, -1, nullptr);
    if (got < 0) s_ok = 0;
    else state->seen[par][tid] = target;
  }
  __syncthreads();
  if (!s_ok) return;  // the error word says why; the buffer is failed from now on

  if (!handshake) {
    // d. the records, by source (written by peers' copy engines: read around L1).
    auto* meta_out = reinterpret_cast<int64_t*>(p.meta_out);
    for (int64_t i = tid; i < int64_t(R) * L; i += blockDim.x) {
      const int64_t s = i / L, col = i % L;
      const uint8_t* slot = region + ht_meta_recv(uint64_t(p.meta_base), p.meta_slot_bytes, R, par, s);
      meta_out[i] = ld_i64_words_cg(slot + 8 * col);
    }
    __syncthreads();
    const auto* per_dst = reinterpret_cast<const int64_t*>(p.per_dst);
    if (tid < R && p.check_col >= 0 && meta_out[int64_t(tid) * L + p.check_col] != per_dst[p.check_col]) {
      // a peer built its rings for another message size: its writes would land on other slots
      raise_error(err, kErrProtocol, kPhaseHTNotify, me, tid, -1, 0);
      s_ok = 0;
    }
    auto* host = reinterpret_cast<int*>(p.host);
    for (int64_t e = tid; e < p.num_local_experts; e += blockDim.x) {
      int64_t sum = 0;
      for (int s = 0; s < R; ++s) sum += meta_out[int64_t(s) * L + p.expert_col + e];
      const int64_t a = p.expert_alignment;
      host[2 + R + e] = int((sum + a - 1) / a * a);
    }
    if (tid < R) host[2 + tid] = int(meta_out[int64_t(tid) * L + me]);
    __syncthreads();
    if (tid == 0) {
      int64_t rows = 0, rdma_rows = 0;
      for (int s = 0; s < R; ++s) rows += meta_out[int64_t(s) * L + me];
      if (p.node_col >= 0) {  // tokens this rank receives as the forwarder of its node (from its rail)
        const int G = int(p.ranks_per_node);
        for (int s = me % G; s < R; s += G)
          for (int64_t c = 0; c < p.num_channels; ++c) rdma_rows += meta_out[int64_t(s) * L + p.node_col + c];
      }
      host[2 + R + p.num_local_experts] = int(rdma_rows);
      const int64_t most = rows > rdma_rows ? rows : rdma_rows;
      if (p.num_worst_tokens > 0 && most > p.num_worst_tokens) {
        raise_error(err, kErrProtocol, kPhaseHTNotify, me, -1, int(most), 0);
        s_ok = 0;
      }
      host[1] = s_ok ? int(rows) : -1;
      fence_system();
      st_release_sys(host, int(p.host_tag));  // release: the counts above before the tag the CPU polls
    }
  }
  if (tid == 0) {
    state->op = s_op + 1u;
    // every peer started this op, so it finished reading every earlier op's rings: the areas are
    // free, but for this op's
    for (int a = 0; a < 2; ++a) state->area_geometry[a] = geometry[a];
  }
}
