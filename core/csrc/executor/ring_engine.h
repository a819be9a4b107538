// Host executor, high-throughput path: message streams through per-(peer, ring) ring buffers in
// the proxy region, with the same protocol the HT kernels use:
//
//   sender:   copy up to `chunk` messages into its staging ring, push ONE ordered Write
//             (increment = messages) to the receiver's ring; wait for credits when the ring is full
//   receiver: the ordered counter TAIL(ring) from the sender says how many messages landed (in
//             order, whatever order the NIC delivered them); copy them out, then return credits
//             with an unfenced Atomic HEAD(ring) += n to the sender
//
// Positions are cumulative per (peer, ring) across phases and ops; both sides keep them, so a ring
// needs no reset. A phase runs every send and receive stream of one hop on `threads` host threads
// (ring r belongs to thread r % threads, and to FIFO r % num_fifos) and returns when every stream
// is done. Counters: TAIL(r) = r (ordered, < 1024), HEAD(r) = kHeadCounterBase + r.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "proxy/proxy.h"

namespace uccl_ep {
namespace executor {

constexpr uint32_t kMaxRings = 512;
constexpr uint32_t kHeadCounterBase = 512;
constexpr uint32_t kRingCounters = 1024;  // counters [0, 1024) belong to the rings

struct PhaseSpec {
  uint32_t msg_bytes = 0;    // bytes per message (multiple of 16)
  uint32_t ring_slots = 0;   // messages per ring
  uint32_t chunk = 1;        // most messages per write (<= 511)
  uint32_t first_ring = 0;   // this phase uses ring ids [first_ring, first_ring + num_rings)
  uint32_t num_rings = 1;    // rings per peer in this layout
  uint64_t recv_base = 0;    // region offset of the receive rings [src][ring - first_ring][slot]
  uint64_t send_base = 0;    // region offset of the staging rings [dst][ring - first_ring][slot]
  int threads = 1;
  double timeout_s = 60.0;
  std::string phase;         // for errors
};

struct SendStream {
  int dst;
  uint32_t ring;
  const int64_t* rows;  // indices into the message table
  uint64_t count;
};

struct RecvStream {
  int src;
  uint32_t ring;
  uint64_t out_row;     // first row of the output table
  uint64_t count;
};

class RingEngine {
 public:
  explicit RingEngine(proxy::Proxy& proxy);
  // Moves every stream; throws EpError (Timeout naming the peer and what was missing,
  // PeerFailure, PeerProtocolError) on failure. table: [rows, msg_bytes]; out: [rows, msg_bytes].
  void run_phase(const PhaseSpec& spec, const uint8_t* table, uint64_t table_rows, uint8_t* out, uint64_t out_rows,
                 const std::vector<SendStream>& sends, const std::vector<RecvStream>& recvs);
  proxy::Proxy& proxy() { return proxy_; }

 private:
  proxy::Proxy& proxy_;
  std::vector<uint64_t> send_pos_;  // [peer][kMaxRings] messages written so far
  std::vector<uint64_t> recv_pos_;  // [peer][kMaxRings] messages consumed so far
};

}  // namespace executor
}  // namespace uccl_ep
