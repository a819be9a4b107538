#include "executor/ring_engine.h"

#include <string.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "fifo/backoff.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace executor {

namespace {

[[noreturn]] void invalid(const std::string& what) { throw_error(ErrorKind::kInvalidArgument, -1, -1, "", what); }

}  // namespace

RingEngine::RingEngine(proxy::Proxy& proxy)
    : proxy_(proxy),
      send_pos_(size_t(proxy.config().num_ranks) * kMaxRings, 0),
      recv_pos_(size_t(proxy.config().num_ranks) * kMaxRings, 0) {
  if (proxy.config().num_counters < kRingCounters)
    invalid("num_counters: the ring engine needs >= " + std::to_string(kRingCounters) + " counters per source");
}

void RingEngine::run_phase(const PhaseSpec& spec, const uint8_t* table, uint64_t table_rows, uint8_t* out,
                           uint64_t out_rows, const std::vector<SendStream>& sends, const std::vector<RecvStream>& recvs) {
  const proxy::ProxyConfig& cfg = proxy_.config();
  const int R = cfg.num_ranks, me = cfg.rank;
  const uint64_t msg = spec.msg_bytes, slots = spec.ring_slots;
  if (msg == 0 || msg % protocol::kOffsetUnitBytes) invalid("msg_bytes: expected a positive multiple of 16, got " + std::to_string(msg));
  if (slots == 0 || slots > uint64_t(protocol::limits::kMaxAtomicValue) || slots > imm::limits::kMaxOrderedInFlight)
    invalid("ring_slots: expected 1.." + std::to_string(imm::limits::kMaxOrderedInFlight) + ", got " + std::to_string(slots));
  if (spec.chunk < 1 || spec.chunk > protocol::limits::kMaxIncrement || spec.chunk > slots)
    invalid("chunk: expected 1..min(ring_slots, " + std::to_string(protocol::limits::kMaxIncrement) + ")");
  if (spec.num_rings < 1 || spec.first_ring + spec.num_rings > kMaxRings)
    invalid("rings: expected ids within [0, " + std::to_string(kMaxRings) + ")");
  if (msg * spec.chunk > protocol::limits::kMaxWriteBytes) invalid("chunk: a chunk of messages exceeds one write");
  const uint64_t area = uint64_t(R) * spec.num_rings * slots * msg;
  const uint64_t region = proxy_.region_bytes();
  if (spec.recv_base > region || area > region - spec.recv_base || spec.send_base > region || area > region - spec.send_base)
    throw_error(ErrorKind::kInvalidArgument, me, -1, spec.phase, "ring layout: rings exceed the region of " +
                std::to_string(region) + " bytes");
  for (const SendStream& s : sends) {
    if (s.dst < 0 || s.dst >= R || s.ring < spec.first_ring || s.ring >= spec.first_ring + spec.num_rings)
      invalid("send stream: bad destination or ring");
    for (uint64_t i = 0; i < s.count; ++i)
      if (s.rows[i] < 0 || uint64_t(s.rows[i]) >= table_rows) invalid("send stream: row index outside the table");
  }
  for (const RecvStream& r : recvs)
    if (r.src < 0 || r.src >= R || r.ring < spec.first_ring || r.ring >= spec.first_ring + spec.num_rings ||
        r.out_row + r.count > out_rows)
      invalid("receive stream: bad source, ring or output rows");

  const int threads = std::max(1, std::min<int>(spec.threads, int(spec.num_rings)));
  const int num_fifos = proxy_.num_fifos();
  uint8_t* base = proxy_.region();
  std::mutex mu;
  std::exception_ptr error;
  std::atomic<bool> abort{false};  // one worker failed: the others stop instead of timing out

  auto worker = [&](int w) {
    struct Tx { const SendStream* s; uint64_t done; };
    struct Rx { const RecvStream* r; uint64_t done; };
    std::vector<Tx> tx;
    std::vector<Rx> rx;
    for (const SendStream& s : sends)
      if (int(s.ring % uint32_t(threads)) == w && s.count) tx.push_back({&s, 0});
    for (const RecvStream& r : recvs)
      if (int(r.ring % uint32_t(threads)) == w && r.count) rx.push_back({&r, 0});
    size_t open = tx.size() + rx.size();
    Backoff backoff(spec.timeout_s);
    while (open > 0) {
      bool progress = false;
      for (Tx& t : tx) {
        const SendStream& s = *t.s;
        if (t.done == s.count) continue;
        uint64_t& pos = send_pos_[size_t(s.dst) * kMaxRings + s.ring];
        const uint64_t credits = uint64_t(proxy_.counter(s.dst, kHeadCounterBase + s.ring));
        const uint64_t free = slots - (pos - credits);
        if (free == 0) continue;
        const uint64_t slot = pos % slots;
        const uint64_t n = std::min({s.count - t.done, free, uint64_t(spec.chunk), slots - slot});
        const uint64_t lane = s.ring - spec.first_ring;
        const uint64_t stage = spec.send_base + ((uint64_t(s.dst) * spec.num_rings + lane) * slots + slot) * msg;
        for (uint64_t i = 0; i < n; ++i) memcpy(base + stage + i * msg, table + uint64_t(s.rows[t.done + i]) * msg, msg);
        const uint64_t target = spec.recv_base + ((uint64_t(me) * spec.num_rings + lane) * slots + slot) * msg;
        proxy_.push(int(s.ring % uint32_t(num_fifos)),
                    protocol::make_ordered_write(uint32_t(s.dst), stage, target, uint32_t(n * msg), s.ring, uint32_t(n)),
                    spec.timeout_s);
        pos += n;
        t.done += n;
        if (t.done == s.count) --open;
        progress = true;
      }
      for (Rx& x : rx) {
        const RecvStream& r = *x.r;
        if (x.done == r.count) continue;
        uint64_t& pos = recv_pos_[size_t(r.src) * kMaxRings + r.ring];
        // acquire (inside counter()): the messages the tail covers are in the ring.
        const int64_t tail = proxy_.counter(r.src, r.ring);
        if (tail <= int64_t(pos)) continue;
        const uint64_t n = std::min(uint64_t(tail) - pos, r.count - x.done);
        const uint64_t ring0 = spec.recv_base + (uint64_t(r.src) * spec.num_rings + (r.ring - spec.first_ring)) * slots * msg;
        const uint64_t slot = pos % slots, first = std::min(n, slots - slot);
        memcpy(out + (r.out_row + x.done) * msg, base + ring0 + slot * msg, first * msg);
        if (n > first) memcpy(out + (r.out_row + x.done + first) * msg, base + ring0, (n - first) * msg);
        pos += n;
        x.done += n;
        proxy_.push(int(r.ring % uint32_t(num_fifos)),
                    protocol::make_atomic(uint32_t(r.src), kHeadCounterBase + r.ring, int32_t(n), false), spec.timeout_s);
        if (x.done == r.count) --open;
        progress = true;
      }
      if (progress) {
        backoff.reset();
        continue;
      }
      // relaxed: a hint; the failing worker's exception carries the story.
      if (abort.load(std::memory_order_relaxed)) return;
      proxy_.throw_if_failed();
      if (backoff.expired()) {
        ErrorInfo e = error_info(ErrorKind::kTimeout, me, -1, spec.phase, "");
        e.waited_s = backoff.elapsed_s();
        for (const Rx& x : rx)
          if (x.done < x.r->count) {
            e.peer = x.r->src;
            e.outstanding = "received " + std::to_string(x.done) + " of " + std::to_string(x.r->count) +
                            " messages from rank " + std::to_string(x.r->src) + " on ring " + std::to_string(x.r->ring);
            break;
          }
        if (e.peer < 0)
          for (const Tx& t : tx)
            if (t.done < t.s->count) {
              e.peer = t.s->dst;
              e.outstanding = "sent " + std::to_string(t.done) + " of " + std::to_string(t.s->count) +
                              " messages to rank " + std::to_string(t.s->dst) + " on ring " + std::to_string(t.s->ring) +
                              "; its ring stayed full (no credits)";
              break;
            }
        throw EpError(e);
      }
      backoff.pause();
    }
  };

  std::vector<std::thread> pool;
  auto guarded = [&](int w) {
    try {
      worker(w);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      abort.store(true, std::memory_order_relaxed);
    }
  };
  for (int w = 1; w < threads; ++w) pool.emplace_back(guarded, w);
  guarded(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace executor
}  // namespace uccl_ep
