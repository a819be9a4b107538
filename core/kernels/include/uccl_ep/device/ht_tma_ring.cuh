// Ring progress for the HT "tma" variant: when a warp publishes, what it may publish, and what it
// must do before it blocks. The counters are the default kernels' (ring.cuh): one u64 per warp,
// cumulative positions, "every position below this value that belongs to me is done", readers take
// the minimum; so a rank running the tma variant and a rank running the default kernels still
// agree on every ring between them.
//
// NOTES: what changes is when progress becomes visible. With bulk stores in flight a producer
// cannot publish a token until its stores have completed; waiting for that on every publication
// would drain the warp's pipeline each time. Producer therefore publishes a candidate position
// only once at least kStages newer bulk groups were issued after the candidate's last store, and
// waits with wait_done<kStages> (all but the kStages newest groups complete): by then the
// candidate's writes have usually long landed and the warp does not stall. Both sides still
// publish everything they hold before any blocking wait, as the default kernels do, so a ring
// cannot deadlock on progress that one side has done but not shown.
#pragma once

#include "uccl_ep/device/ht_bulk.cuh"
#include "uccl_ep/device/ring.cuh"

namespace uccl_ep::dev::tma {

using bulk::CopyStream;
using bulk::WaitSite;

// What every HT kernel block derives from its parameters (HTDispatchParams or HTCombineParams):
// channel c = block / 2 owns the contiguous token range c (DeepEP's split); even blocks send.
struct Channel {
  int R, C, G, me, c, t_begin, t_end;
  bool sender;
  int64_t S;
  const uint64_t* peer;
  ErrorWord* err;
};

template <typename Params>
UCCL_DEVICE Channel channel_of(const Params& p) {
  Channel ch;
  ch.R = int(p.num_ranks);
  ch.C = int(p.num_channels);
  ch.G = int(p.warps_per_peer);
  ch.me = int(p.rank);
  ch.c = int(blockIdx.x / 2);
  ch.sender = (blockIdx.x & 1) == 0;
  const int T = int(p.num_tokens), per = (T + ch.C - 1) / ch.C;
  ch.t_begin = min(T, ch.c * per);
  ch.t_end = min(T, ch.t_begin + per);
  ch.S = p.ring_slots;
  ch.peer = reinterpret_cast<const uint64_t*>(p.peer_buf);
  ch.err = reinterpret_cast<ErrorWord*>(p.error);
  return ch;
}

// False (and the error word says why) when the host gave less shared memory than the kernel lays out.
UCCL_DEVICE bool smem_ok(const Channel& ch, int phase) {
  if (bulk::dynamic_smem_bytes() >= uint32_t(num_warps()) * bulk::kStreamAreaBytes) return true;
  if (threadIdx.x == 0) raise_error(ch.err, kErrProtocol, phase, ch.me, -1, ch.c, 0);
  return false;
}

// Lane 0 decides, every lane learns the outcome.
UCCL_DEVICE bool warp_all_ok(bool lane0_ok) { return shfl_idx(lane0_ok ? 1 : 0, 0) != 0; }

// Tokens between publications: the variant's interval, capped so that G warps lagging by that
// much leave most of an S-slot ring usable.
UCCL_DEVICE int publish_interval(int64_t ring_slots, int warps) {
  int64_t cap = ring_slots / (4 * int64_t(warps));
  if (cap < 1) cap = 1;
  return int(cap < bulk::kPublishEvery ? cap : bulk::kPublishEvery);
}

// Error exit of a warp that owns a CopyStream: no bulk copy may still use its shared memory.
UCCL_DEVICE void bail() {
  if (lane_id() == 0) bulk::wait_done<0>();
  sync_warp();
}

// Producer side of one ring (one warp, one tail counter).
struct Producer {
  uint64_t* tail;          // this warp's tail counter in the receiver's buffer
  const uint64_t* heads;   // the ring's consumer counters (in this rank's buffer)
  int nheads;
  uint64_t S, head_min;
  int every;
  // lane 0 only: ring position + 1 of the newest token whose stores were issued; the one being
  // published next and the store count after which it may be; the last published value.
  uint64_t issued, cand, cand_groups, published;

  UCCL_DEVICE void init(uint64_t* tail_, const uint64_t* heads_, int nheads_, uint64_t ring_slots, uint64_t base,
                        int every_) {
    tail = tail_;
    heads = heads_;
    nheads = nheads_;
    S = ring_slots;
    head_min = 0;
    every = every_;
    issued = cand = cand_groups = 0;
    published = base;
  }

  // lane 0, after pushes: `done` is the stream's latest tag.
  UCCL_DEVICE void note(uint64_t done, uint32_t groups) {
    issued = done;
    if (cand == 0 && issued >= published + uint64_t(every)) {
      cand = issued;
      cand_groups = groups;
    }
  }

  // lane 0: publish the candidate if its stores are certainly complete without a long wait.
  UCCL_DEVICE void maybe_publish(uint32_t groups) {
    if (cand == 0 || uint64_t(groups) < cand_groups + bulk::kStages) return;
    bulk::wait_done<bulk::kStages>();   // the candidate's groups are older than the kStages newest
    bulk::fence_async_global();
    st_release_sys(tail, cand);          // release: rows (bulk) and metadata (this warp, synced) first
    published = cand;
    cand = 0;
  }

  // All lanes, after each token: orders the lanes' metadata stores, then lane 0 may publish.
  UCCL_DEVICE void after_token(CopyStream& st) {
    sync_warp();
    if (lane_id() == 0) maybe_publish(st.stored);
    sync_warp();
  }

  // All lanes: every pushed row stored and complete, then published (value `end` when given).
  UCCL_DEVICE bool drain(CopyStream& st, const WaitSite& site, uint64_t end = 0) {
    sync_warp();
    bool ok = true;
    if (lane_id() == 0) {
      uint64_t done = issued;
      ok = st.flush(&done, site);
      bulk::wait_done<0>();           // every bulk store of this warp has landed
      bulk::fence_async_global();      // ... and is ordered before the generic release below
      const uint64_t v = end != 0 ? end : done;
      if (ok && v > published) {
        st_release_sys(tail, v);       // release: rows and (synced) metadata before the position
        published = v;
      }
      issued = done;
      cand = 0;
    }
    return warp_all_ok(ok);
  }

  // All lanes: position `pos` may be written once every consumer passed pos - S. Blocks only
  // after draining (never wait holding progress).
  UCCL_DEVICE bool reserve(CopyStream& st, uint64_t pos, const WaitSite& site) {
    if (pos < head_min + S) return true;
    head_min = warp_min_counter(heads, nheads);
    if (pos < head_min + S) return true;
    if (!drain(st, site)) return false;
    head_min = warp_wait_above(heads, nheads, pos - S, site.timeout_ns, site.err, site.phase, site.rank, site.peer,
                               site.channel);
    return head_min != 0;
  }
};

// Consumer side of one ring that reads whole slots (dispatch receiver): progress is "loaded".
struct Consumer {
  uint64_t* head;          // this warp's head counter in the producer's buffer
  const uint64_t* tails;   // the ring's producer counters (in this rank's buffer)
  int ntails;
  uint64_t tail_min;
  int every;
  uint64_t loaded, published;  // lane 0

  UCCL_DEVICE void init(uint64_t* head_, const uint64_t* tails_, int ntails_, uint64_t base, int every_) {
    head = head_;
    tails = tails_;
    ntails = ntails_;
    tail_min = 0;
    every = every_;
    loaded = 0;
    published = base;
  }

  // All lanes: position `pos` is written (every producer passed it). Blocks only after loading
  // everything pushed and publishing `pos` ("all my positions below pos are consumed").
  UCCL_DEVICE bool acquire(CopyStream& st, uint64_t pos, const WaitSite& site) {
    if (pos < tail_min) return true;
    tail_min = warp_min_counter(tails, ntails);
    if (pos >= tail_min) {
      sync_warp();
      bool ok = true;
      if (lane_id() == 0) {
        ok = st.flush(&loaded, site);
        if (ok && pos > published) {
          st_release_sys(head, pos);  // release: our reads of the freed slots come first
          published = pos;
        }
      }
      if (!warp_all_ok(ok)) return false;
      tail_min = warp_wait_above(tails, ntails, pos, site.timeout_ns, site.err, site.phase, site.rank, site.peer,
                                 site.channel);
      if (tail_min == 0) return false;
    }
    // The acquire above (each lane read one counter) and this barrier order the producers'
    // writes before lane 0's next bulk loads; the proxy fence extends that to the copy engine.
    sync_warp();
    if (lane_id() == 0) bulk::fence_async_global();
    return true;
  }

  UCCL_DEVICE void after_token() {
    sync_warp();
    if (lane_id() == 0 && loaded >= published + uint64_t(every)) {
      st_release_sys(head, loaded);   // loads of these slots completed (their mbarriers were waited)
      published = loaded;
    }
    sync_warp();
  }

  // All lanes: load everything, publish `end`.
  UCCL_DEVICE bool finish(CopyStream& st, uint64_t end, const WaitSite& site) {
    sync_warp();
    bool ok = true;
    if (lane_id() == 0) {
      ok = st.flush(&loaded, site);
      // release: every slot's bulk load completed (mbarriers waited) and its metadata was read
      if (ok && end > published) st_release_sys(head, published = end);
      bulk::wait_done<0>();  // the rows' local stores, before this warp's shared memory goes away
    }
    return warp_all_ok(ok);
  }
};

}  // namespace uccl_ep::dev::tma
