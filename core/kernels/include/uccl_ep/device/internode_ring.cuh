// The host executor's ring streams (csrc/executor/ring_engine.cc), run by a group of warps:
// one (peer, ring) stream of fixed-size messages through the CPU proxy.
//
//   send_stream: rounds of up to `chunk` messages: the leader waits (bounded) for credits
//                (counter HEAD(ring) from the receiver), every warp stages its share of the
//                round into the staging ring, then the leader pushes ONE ordered Write
//                (counter TAIL(ring), increment = messages) that the proxy copies into the
//                receiver's ring at the same slot
//   recv_stream: the leader waits (bounded) for TAIL(ring) to cover the next message, every
//                warp consumes its share of what landed, then the leader returns credits with
//                an unfenced Atomic HEAD(ring) (lazily: at least half a ring, or the end)
//
// Positions are cumulative per (peer, ring) across ops (HTProxyState), so nothing is reset.
//
// A node mate's area-1 stream (RingArgs::mates) skips the proxy: the sender stages straight into
// the mate's receive ring over NVLink and stores TAIL into the mate's HTProxyState (mate_tail), the
// receiver stores HEAD into the sender's (mate_head); positions and credits mean what they mean
// through the proxy.
// NOTES: credits are returned once a sender's round (`chunk` messages) is consumed, at most half a
// ring (credit_batch), and the sender's rounds are at most half a ring (ring_spec: chunk <=
// slots / 2), so the message a receiver waits for is always within the sender's credit: the lazy
// return cannot deadlock a stream. Returning them per round rather than per half ring keeps the
// sender's window near the whole ring (bandwidth x round trip) instead of between half and all of it.
#pragma once

#include "uccl_ep/device/arch.cuh"
#include "uccl_ep/device/block.cuh"
#include "uccl_ep/device/ht_dma.cuh"
#include "uccl_ep/device/wait.cuh"
#include "uccl_ep/fifo_device.cuh"
#include "uccl_ep/kernel_abi.h"
#include "uccl_ep/kernel_abi_internode.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep::dev {

// Warps [first, first + members) of a block working on one stream, synchronised through an
// arrival counter in shared memory (portable: HIP has no named barriers).
// NOTES: the spin in group_sync needs no deadline of its own: between two syncs a warp only
// stages or consumes slots (no wait), and every wait on a peer (credits, TAIL) is the leader's,
// bounded, and ends with a value every warp reads after the next sync -- so all members always
// reach the same syncs and leave together.
struct WarpGroup {
  int* arrive;      // shared, zeroed before first use
  int members;
  int index;        // this warp's index in the group
  unsigned epoch;   // syncs passed by this warp
};

// Zeroes a block's group arrival counters and per-stream words (threads < kHTProxyMaxRanks) before
// first use; the caller's next __syncthreads publishes them.
UCCL_DEVICE void clear_group_words(int* arrive, int64_t* word) {
  if (threadIdx.x < kHTProxyMaxRanks) {
    arrive[threadIdx.x] = 0;
    word[threadIdx.x] = 0;
  }
}

UCCL_DEVICE void group_sync(WarpGroup& g) {
  sync_warp();
  g.epoch += 1;
  if (lane_id() == 0) {
    __threadfence_block();  // this warp's accesses before its arrival (block scope suffices: the
                            // group is one block; system visibility is the caller's fence)
    atomicAdd(g.arrive, 1);
    const int target = int(g.epoch) * g.members;
    while (ld_volatile(g.arrive) < target) {
    }
    __threadfence_block();  // the other warps' accesses before whatever this warp does next
  }
  sync_warp();
}

UCCL_DEVICE bool group_leader(const WarpGroup& g) { return g.index == 0 && lane_id() == 0; }

UCCL_DEVICE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// What every stream of one op needs, from any of the HTProxy*Params.
struct RingArgs {
  uint8_t* region;
  const FifoLayout* fifos;
  const int64_t* counters;
  const uint64_t* status;
  HTProxyState* state;
  ErrorWord* err;
  const HtDmaContext* dma;  // the launch's copy role, or nullptr (Writes' bytes counted per proxy thread)
  const uint64_t* mates;    // area 1: u64 [R][2] node mates' (region, HTProxyState*) as mapped here, or nullptr
  int rank;
  int num_rings;  // channels
  int num_fifos;
  int peer_div, peer_mod;  // the rows of the area's rings (HTRingGeometry)
  int64_t msg, slots, chunk, recv_base, send_base, first_ring, head_base, num_counters;
  uint64_t timeout_ns;
};

// Default hooks of a stager / consumer (see send_stream and recv_stream).
struct StreamHooks {
  // Leader lane only, once a round [k0, k1) is known and before any warp touches it; false
  // aborts the stream (the error word is filled).
  UCCL_DEVICE bool prepare(int64_t, int64_t, int64_t) { return true; }
  // Leader lane only, after every warp finished the round (and, when sending, after its push).
  UCCL_DEVICE bool finish(int64_t, int64_t, int64_t) { return true; }
  // Most messages one round takes.
  UCCL_DEVICE int64_t max_round() const { return int64_t(1) << 40; }
};

// One area's rings (kernel_abi_internode.h HTRingGeometry) into a stream's arguments.
UCCL_DEVICE void set_geometry(RingArgs& a, const HTRingGeometry& g) {
  a.msg = g.msg_bytes;
  a.slots = g.ring_slots;
  a.chunk = g.chunk;
  a.recv_base = g.recv_base;
  a.send_base = g.send_base;
  a.first_ring = g.first_ring;
  a.peer_div = int(g.peer_div);
  a.peer_mod = int(g.peer_mod);
}

// The row of peer r's rings in an area (HTRingGeometry::peer_div / peer_mod).
UCCL_DEVICE int ring_row(const RingArgs& a, int r) { return (r / a.peer_div) % a.peer_mod; }

// Byte offset of slot `slot` of the ring (peer r's row, channel c) of the rings at `base`.
UCCL_DEVICE uint64_t ring_slot(const RingArgs& a, int64_t base, int r, int c, int64_t slot) {
  return ht_ring_slot(uint64_t(base), ring_row(a, r), c, a.num_rings, a.slots, slot, a.msg);
}

// The area-0 rings (hop 1 / hop B) of a proxy params struct.
template <class P>
UCCL_DEVICE RingArgs ring_args(const P& p) {
  RingArgs a;
  a.region = reinterpret_cast<uint8_t*>(p.region);
  a.fifos = reinterpret_cast<const FifoLayout*>(p.fifos);
  a.counters = reinterpret_cast<const int64_t*>(p.counters);
  a.status = reinterpret_cast<const uint64_t*>(p.status);
  a.state = reinterpret_cast<HTProxyState*>(p.state);
  a.err = reinterpret_cast<ErrorWord*>(p.error);
  a.dma = p.dma_blocks > 0 ? dma_context(p.dma) : nullptr;
  a.mates = nullptr;
  a.rank = int(p.rank);
  a.num_rings = int(p.num_channels);
  a.num_fifos = int(p.num_fifos);
  set_geometry(a, p.ring);
  a.head_base = p.head_base;
  a.num_counters = p.num_counters;
  a.timeout_ns = uint64_t(p.timeout_ns);
  return a;
}

// The area-1 rings (hop 2 / hop A) of the forward kernels' params.
template <class P>
UCCL_DEVICE RingArgs nvl_ring_args(const P& p) {
  RingArgs a = ring_args(p);
  set_geometry(a, p.nvl_ring);
  a.mates = reinterpret_cast<const uint64_t*>(p.mates);
  return a;
}

// Node mate r's region as mapped here when stream (me, r) of these rings goes over NVLink, else nullptr.
UCCL_DEVICE uint8_t* mate_region(const RingArgs& a, int r) {
  return a.mates != nullptr ? reinterpret_cast<uint8_t*>(a.mates[2 * r]) : nullptr;
}
UCCL_DEVICE HTProxyState* mate_state(const RingArgs& a, int r) {
  return reinterpret_cast<HTProxyState*>(a.mates[2 * r + 1]);
}

// Staging slot of message position `pos` of stream (dst, channel c), and receive slot of
// stream (src, c), as device pointers. The stream to this rank itself stages straight into its
// receive ring (HTProxyState::self_tail).
UCCL_DEVICE uint8_t* staging_slot(const RingArgs& a, int dst, int c, int64_t pos) {
  if (uint8_t* mate = dst != a.rank ? mate_region(a, dst) : nullptr)  // the mate's receive ring itself
    return mate + ring_slot(a, a.recv_base, a.rank, c, pos % a.slots);
  const uint64_t base = uint64_t(dst == a.rank ? a.recv_base : a.send_base);
  return a.region + ring_slot(a, int64_t(base), dst, c, pos % a.slots);
}
UCCL_DEVICE const uint8_t* receive_slot(const RingArgs& a, int src, int c, int64_t pos) {
  return a.region + ring_slot(a, a.recv_base, src, c, pos % a.slots);
}

UCCL_DEVICE const int64_t* proxy_counter(const RingArgs& a, int src, int64_t c) {
  return a.counters + int64_t(src) * a.num_counters + c;
}

// Waits (bounded) until a device word reaches `target`: one of this rank's stream to itself (peer =
// this rank; the other side's st_release_gpu) or one a node mate stores over NVLink (its
// st_release_sys); the value, or -1 (error word filled, naming `peer`).
UCCL_DEVICE int64_t wait_word(const uint64_t* word, int64_t target, const RingArgs& a, int phase, int peer, int c) {
  const uint64_t start = clock_ns();
  for (uint32_t spins = 1;; ++spins) {
    const int64_t v = int64_t(peer == a.rank ? ld_acquire_gpu(word) : ld_acquire_sys(word));
    if (v >= target) return v;
    if ((spins & 1023u) == 0) {
      const uint64_t now = clock_ns();
      if (now - start > a.timeout_ns) {
        raise_error(a.err, kErrTimeout, phase, a.rank, peer, c, now - start);
        return -1;
      }
      if (error_raised(a.err)) return -1;
    }
  }
}
UCCL_DEVICE int64_t wait_self(const uint64_t* word, int64_t target, const RingArgs& a, int phase, int c) {
  return wait_word(word, target, a, phase, a.rank, c);
}

// One thread: waits (bounded) until HEAD of this rank's stream (dst, c) covers `target` messages
// (credits: the proxy's counter, or the device word of the stream to itself or to a node mate).
UCCL_DEVICE int64_t wait_head(const RingArgs& a, int dst, int c, int64_t target, int phase) {
  const int64_t ring = a.first_ring + c;
  if (dst == a.rank) return wait_self(&a.state->self_head[ring], target, a, phase, c);
  if (mate_region(a, dst) != nullptr) return wait_word(&a.state->mate_head[dst][ring], target, a, phase, dst, c);
  return wait_counter(proxy_counter(a, dst, a.head_base + ring), target, a.status, a.timeout_ns, a.err, phase, a.rank,
                      dst, c, nullptr);
}

// Leader only, after the round's stores into a node mate's ring were fenced at system scope: TAIL of
// stream (me -> dst, c) = `pos` messages, in the mate's HTProxyState.
UCCL_DEVICE void publish_to_mate(const RingArgs& a, int dst, int c, int64_t pos) {
  st_release_sys(&mate_state(a, dst)->mate_tail[a.rank][a.first_ring + c], uint64_t(pos));
}

// Every warp that staged a round, before the leader publishes it: only a reader outside
// this GPU's threads -- a NIC, the driver's copy engine, a node mate -- needs the stores fenced at
// system scope; the copy role (a.dma) reads them on this GPU after acquiring what the leader's
// system-scope release published, so a GPU-scope fence orders them (release is cumulative).
// NOTES: fence.sc.sys waits for this warp's outstanding NVLink traffic too and costs microseconds
// per round while the copy role streams.
UCCL_DEVICE void fence_staged(bool local_reader) {
  if (local_reader) __threadfence();
  else fence_system();
}

// One thread: waits (bounded) until TAIL of stream (src, c) covers `target` messages (the proxy's
// counter, or the device word of the stream to itself); the value, or -1 (error word filled).
UCCL_DEVICE int64_t wait_tail(const RingArgs& a, int src, int c, int64_t target, int phase) {
  if (src == a.rank) return wait_self(&a.state->self_tail[a.first_ring + c], target, a, phase, c);
  if (mate_region(a, src) != nullptr)  // acquire: the mate's stores into the ring before its release
    return wait_word(&a.state->mate_tail[src][a.first_ring + c], target, a, phase, src, c);
  // acquire (inside wait_counter): the receiving proxy bumps TAIL with release after the copies it
  // accounts for landed in this rank's region.
  return wait_counter(proxy_counter(a, src, a.first_ring + c), target, a.status, a.timeout_ns, a.err, phase, a.rank,
                      src, c, nullptr);
}

// A reducer's round of tokens [tb, tb_end) reads, from each source, up to the last message one of
// its tokens has there. `need_of(u)`: the stream position of token u's message from the source, or
// -1 when u has none there. Returns the round's last such position, or -1.
template <class NeedOf>
UCCL_DEVICE int64_t round_last_need(int tb, int tb_end, NeedOf need_of) {
  for (int u = tb_end - 1; u >= tb; --u) {
    const int64_t need = need_of(u);
    if (need >= 0) return need;
  }
  return -1;
}

// One thread per source: waits (bounded) until stream (src, c) covers position `need` (-1: nothing
// needed), `*tail` caching the TAIL last seen; false on a timeout (error word filled).
UCCL_DEVICE bool wait_round_tail(const RingArgs& a, int src, int c, int64_t need, int64_t* tail, int phase) {
  if (need < 0 || need < *tail) return true;
  const int64_t got = wait_tail(a, src, c, need + 1, phase);
  if (got < 0) return false;
  *tail = got;
  return true;
}

// Whole warp: lane 0 waits (bounded) until TAIL of stream (src, c) covers position `pos`; every
// lane gets the TAIL value, or -1 after an error (the error word is filled).
UCCL_DEVICE int64_t warp_wait_tail(const RingArgs& a, int src, int c, int64_t pos, int phase) {
  int64_t got = 0;
  if (lane_id() == 0) got = wait_tail(a, src, c, pos + 1, phase);
  // the warp barrier orders lane 0's acquire before the other lanes' reads of the slots it covers
  sync_warp();
  return int64_t(uint64_t(uint32_t(shfl_idx(int(uint64_t(got) & 0xffffffffu), 0))) |
                 (uint64_t(uint32_t(shfl_idx(int(uint64_t(got) >> 32), 0))) << 32));
}

// Messages a receiver consumes before it returns their credits: a sender's round, at most half a ring.
UCCL_DEVICE int64_t credit_batch(const RingArgs& a) {
  const int64_t half = a.slots / 2, n = a.chunk < half ? a.chunk : half;
  return n > 1 ? n : 1;
}

// Leader only: an unfenced Atomic HEAD(ring) += n to `src` (credits for its stream).
UCCL_DEVICE bool push_credit(const RingArgs& a, int src, int c, int64_t n, int phase) {
  const int64_t ring = a.first_ring + c;
  return fifo_push(a.fifos[ring % a.num_fifos],
                   protocol::make_atomic(uint32_t(src), uint32_t(a.head_base + ring), int32_t(n), false), a.timeout_ns,
                   a.err, PushSite{phase, a.rank, src, c});
}

// Credits of stream (src, c): `n` more messages consumed, `consumed` of them in all (the position).
// The stream to this rank itself publishes the position in device memory (HTProxyState::self_head),
// a node mate's in the mate's (mate_head).
UCCL_DEVICE bool return_credit(const RingArgs& a, int src, int c, int64_t consumed, int64_t n, int phase) {
  if (src == a.rank) {
    st_release_gpu(&a.state->self_head[a.first_ring + c], uint64_t(consumed));  // the slots' reads before it
    return true;
  }
  if (mate_region(a, src) != nullptr) {
    st_release_sys(&mate_state(a, src)->mate_head[a.rank][a.first_ring + c], uint64_t(consumed));
    return true;
  }
  return push_credit(a, src, c, n, phase);
}

// Sends messages [0, n) of stream (dst, c). `stager.stage(k0, k1, base, g)` writes this warp's
// share of messages [k0, k1) into staging_slot(a, dst, c, base + k); its prepare/finish hooks
// (StreamHooks) run on the leader around each round. Returns false after an error (the error
// word is filled); every warp of the group returns together.
template <class Stager>
UCCL_DEVICE bool send_stream(const RingArgs& a, WarpGroup& g, volatile int64_t* s_word, int dst, int c, int64_t n,
                             Stager& stager, int phase) {
  const int64_t ring = a.first_ring + c;
  const int64_t base = int64_t(a.state->send_pos[dst][ring]);  // read by every warp before any round
  const bool local = dst == a.rank;  // staged straight into the own receive ring, no Write
  const bool mate = !local && mate_region(a, dst) != nullptr;  // into the mate's ring over NVLink, no Write
  const bool leader = group_leader(g);
  int64_t credit = 0;  // leader: last credit value read (cumulative, like the positions)
  bool failed = false;
  for (int64_t k0 = 0; k0 < n;) {
    if (leader) {
      const int64_t pos = base + k0;
      int64_t k1 = -1;
      if (!failed) {
        if (pos - credit >= a.slots) credit = wait_head(a, dst, c, pos - a.slots + 1, phase);
        if (credit >= 0) {
          const int64_t room = min64(a.slots - pos % a.slots, a.slots - (pos - credit));
          k1 = k0 + min64(min64(n - k0, a.chunk), min64(room, stager.max_round()));
          if (!stager.prepare(k0, k1, base)) k1 = -1;
        }
      }
      *s_word = k1;
    }
    group_sync(g);
    const int64_t k1 = *s_word;
    if (k1 < 0) return false;
    stager.stage(k0, k1, base, g);
    fence_staged(local || (a.dma != nullptr && !mate));  // this warp's stores before the leader's release
    group_sync(g);
    if (leader && (local || mate)) {
      if (local) st_release_gpu(&a.state->self_tail[ring], uint64_t(base + k1));
      else publish_to_mate(a, dst, c, base + k1);
      failed = !stager.finish(k0, k1, base);
    } else if (leader) {
      const int64_t slot0 = (base + k0) % a.slots;
      const uint64_t from = ring_slot(a, a.send_base, dst, c, slot0);
      const uint64_t to = ring_slot(a, a.recv_base, a.rank, c, slot0);
      const TransferCmd cmd = protocol::make_ordered_write(uint32_t(dst), from, to, uint32_t((k1 - k0) * a.msg),
                                                           uint32_t(ring), uint32_t(k1 - k0));
      dma_count_push(a.dma, int(ring % a.num_fifos), uint64_t((k1 - k0) * a.msg));
      failed = !fifo_push(a.fifos[ring % a.num_fifos], cmd, a.timeout_ns, a.err, PushSite{phase, a.rank, dst, c});
      failed = failed || !stager.finish(k0, k1, base);
    }
    k0 = k1;
  }
  if (leader && !failed && n > 0) a.state->send_pos[dst][ring] = uint64_t(base + n);
  return !failed;
}

// Receives messages [0, n) of stream (src, c). `consumer.consume(k0, k1, base, g)` reads this
// warp's share of messages [k0, k1) from receive_slot(a, src, c, base + k); its hooks
// (StreamHooks) run on the leader around each round, finish before the round's credits.
template <class Consumer>
UCCL_DEVICE bool recv_stream(const RingArgs& a, WarpGroup& g, volatile int64_t* s_word, int src, int c, int64_t n,
                             Consumer& consumer, int phase) {
  const int64_t ring = a.first_ring + c;
  const int64_t base = int64_t(a.state->recv_pos[src][ring]);
  const bool leader = group_leader(g);
  const int64_t lazy = credit_batch(a);
  int64_t tail = 0, credited = base;
  bool failed = false;
  for (int64_t k0 = 0; k0 < n;) {
    if (leader) {
      const int64_t pos = base + k0;
      int64_t k1 = -1;
      if (!failed) {
        if (tail <= pos) tail = wait_tail(a, src, c, pos + 1, phase);
        if (tail >= 0) {
          k1 = k0 + min64(min64(n - k0, tail - pos), consumer.max_round());
          if (!consumer.prepare(k0, k1, base)) k1 = -1;
        }
      }
      *s_word = k1;
    }
    group_sync(g);
    const int64_t k1 = *s_word;
    if (k1 < 0) return false;
    consumer.consume(k0, k1, base, g);
    group_sync(g);  // every read of the slots done before their credit goes back
    if (leader) {
      failed = !consumer.finish(k0, k1, base);
      const int64_t consumed = base + k1;
      if (!failed && (consumed - credited >= lazy || k1 == n)) {
        failed = !return_credit(a, src, c, consumed, consumed - credited, phase);
        credited = consumed;
      }
    }
    k0 = k1;
  }
  if (leader && !failed && n > 0) a.state->recv_pos[src][ring] = uint64_t(base + n);
  return !failed;
}

// A combine's reducer: tokens [t_begin, t_end) of channel c in rounds of B, one warp per token, each
// summed from its messages of S source streams, sources ascending. Source s's stream comes from
// peer `peer_of(s)`; `pos_of(u, s)` is token u's message in it counted from the op's first (at
// s_base[s]), or -1 when u has none there. Before a round, thread s < S waits until its stream covers
// the round's last message from s (one reader per counter and block: many threads polling mapped host
// memory queue behind each other on PCIe); after it, every read done, it returns the credits once
// `lazy` messages (or the channel's last) are consumed, and at the end records where the stream
// stands. `reduce(t, rows, nsrc)` sums one token's rows. s_base / s_tail / s_fail are the block's
// shared words. Every thread of the block calls it; false after an error (the error word is filled).
template <class PosOf, class PeerOf, class Reduce>
UCCL_DEVICE bool reduce_rounds(const RingArgs& a, int c, int t_begin, int t_end, int S, int B, int64_t lazy,
                               const int64_t* s_base, int64_t* s_tail, volatile int* s_fail, int phase,
                               PosOf pos_of, PeerOf peer_of, Reduce reduce) {
  const int warp = warp_id(), tid = threadIdx.x;
  int64_t consumed = 0, credited = 0;  // thread s < S: messages of stream s consumed / credited
  for (int tb = t_begin; tb < t_end; tb += B) {
    const int tb_end = min(tb + B, t_end);
    int64_t need = -1;  // thread s < S: the round's last message in stream s (position), or -1
    if (tid < S) {
      need = round_last_need(tb, tb_end, [&](int u) {
        const int64_t k = pos_of(u, tid);
        return k < 0 ? k : s_base[tid] + k;
      });
      if (!wait_round_tail(a, peer_of(tid), c, need, &s_tail[tid], phase)) *s_fail = 1;
    }
    __syncthreads();  // the waits' acquires before any warp reads the round's slots
    if (*s_fail) return false;
    const int t = tb + warp;
    if (warp < B && t < t_end) {
      const uint8_t* rows[kHTProxyMaxRanks];
      int nsrc = 0;
      for (int s = 0; s < S; ++s) {
        const int64_t k = pos_of(t, s);
        if (k >= 0) rows[nsrc++] = receive_slot(a, peer_of(s), c, s_base[s] + k);
      }
      reduce(int64_t(t), rows, nsrc);
    }
    __syncthreads();  // every read of this round's slots done before their credits go back
    if (tid < S) {
      // NOTES: a stream carries its tokens' messages in token order at consecutive positions, so
      // after a round it is consumed through the round's last message (the CPU emulators check it)
      if (need >= 0) consumed = need - s_base[tid] + 1;
      if (consumed - credited > 0 && (consumed - credited >= lazy || tb_end >= t_end)) {
        if (!return_credit(a, peer_of(tid), c, s_base[tid] + consumed, consumed - credited, phase)) *s_fail = 1;
        credited = consumed;
      }
    }
  }
  if (tid < S && consumed > 0) a.state->recv_pos[peer_of(tid)][a.first_ring + c] = uint64_t(s_base[tid] + consumed);
  return true;
}

// 4-byte-aligned word moves for message fields (see HTDispatchMsg).
UCCL_DEVICE void st_u64_words(uint8_t* p, int64_t v) {
  reinterpret_cast<uint32_t*>(p)[0] = uint32_t(uint64_t(v));
  reinterpret_cast<uint32_t*>(p)[1] = uint32_t(uint64_t(v) >> 32);
}
UCCL_DEVICE int64_t ld_i64_words_cg(const uint8_t* p) {
  return int64_t(uint64_t(ld_u32_cg(p)) | (uint64_t(ld_u32_cg(p + 4)) << 32));
}

}  // namespace uccl_ep::dev
