// `nic:<parameters>:<inner>` decorator: makes any transport cost what a NIC costs, so the proxy
// protocols can be measured against a line rate on machines that have no such NIC.
//
// Parameters (comma-separated key=value, the canonical form uccl_ep.proxy.nic_model writes; named
// presets are resolved there):
//   bw=<bytes/s>     line rate of one NIC (> 0)
//   lat_us=<us>      one-way latency added to every message, payload or not (>= 0)
//   reorder=<p>      probability a message is delayed by a uniform extra in [0, window_us] (0..1)
//   window_us=<us>   the reordering window (>= 0)
//   nics=<n>         NICs per rank; proxy thread t sends on NIC t mod n (as fabric stripes threads)
//   seed=<n>         seeds the reordering (mixed with rank and thread), so a run can be replayed
//   mates=<0|1>      1: writes to the writer's own node go through the NIC too (a transport that
//                    sends every peer over the fabric, no NVLink or ipc path: the all-RDMA case)
//   overlap=<0|1>    1 (default): the inner transport's own delivery time counts toward lat_us (a
//                    write arrives at max(due, the inner transport's arrival)); 0: it adds to lat_us
//                    (the model's first form: due + the inner's time). Only over an inner transport
//                    that keeps order per peer (Caps::ordered); else as 0
//   trace=<n>        keep the endpoint's last n events (posts, refusals, releases, completions, deliveries) for
//                    trace(): a lab measurement (tools/lab/trace_nic.py), 0 = off
//
// The model, per message: it occupies its NIC's link for len / bw (a serialized link, one per
// (rank, NIC) and shared by the proxy threads on that NIC, so the threads together never exceed
// the line rate), arrives lat_us after it left the link, plus the reordering extra ("due").
// With overlap=1 a write goes to the inner transport in two parts: its bytes (a write without
// immediate), and its immediate (a write without bytes) at its due time. Without reordering the
// bytes go as the write leaves the link and the inner transport orders the immediate behind them.
// With reordering the bytes go as the write is posted and the immediate, as a control message
// (write_control), at its due time or as soon as the inner transport completed the bytes, whichever
// is later. With overlap=0, or for a message without bytes, the whole message goes at its due
// time. Either way the inner transport's contract holds: the immediate is delivered after the
// write's bytes are visible, and a local completion (the immediate's) means the source may be
// reused. Writes to ranks of the writer's own node (Options::ranks_per_node)
// pass straight through unless mates=1: with the split ipc+fabric transport no NIC carries them.
// With reorder > 0 writes overtake each other (to one peer too) within the window, as on EFA's
// SRD, messages without bytes go through write_control() (they may overtake copies in flight),
// and local completions are released out of order the same way.
// Every held message is released at its time; nothing is dropped or duplicated.
//
// NOTES: why overlap. The stand-ins below the model take time of their own to deliver (ipc with
// the kernel copy role: tens of microseconds from post to the immediate, docs/benchmarks.md), time
// a NIC at lat_us would not add; stacked, every round trip paid the model's latency and the
// stand-in's. Overlapped, a delivery is never earlier than a NIC at lat_us would make it and never
// earlier than the stand-in can, and the link still never carries more than bw.
// NOTES: why the bytes go at posting when reordering. Bytes that land before their immediate are
// invisible to the protocol (a receiver reads a slot only after the immediate names it, and a
// sender writes only into slots it holds credit for; a NIC's DMA may place them any time after the
// post), so the stand-in's copy may run while the write waits for the link. Handed over at link
// exit, the immediate of a write queued behind a deep link took the stand-in's whole hop after its
// due time. The immediate goes as a control message so that copies posted after its bytes do not
// delay it; it is released only once its own bytes completed, so it never overtakes them. Without
// reordering the model keeps order per peer, which immediates sent ahead would break.
//
// NOTES: the sending side carries the whole cost (link, latency, reordering); the receiving NIC's
// link is not modelled, so incast above the line rate (several senders into one NIC) is not
// slowed down. The link's schedule is taken when a write is posted, so a proxy thread that polls
// late releases late but never lets later writes exceed the rate.
#include <errno.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <queue>
#include <random>
#include <sstream>
#include <unordered_map>

#include "transport/transport.h"

namespace uccl_ep {
namespace transport {

namespace {

struct Params {
  double bw = 0;          // bytes/s
  double lat_ns = 0;
  double reorder = 0;
  double window_ns = 0;
  uint32_t nics = 1;
  uint64_t seed = 0;
  bool mates = false;  // node mates through the NIC as well
  bool overlap = true; // the inner transport's delivery time counts toward lat_ns
  uint64_t trace = 0;  // events kept for trace()
};

Params parse(const std::string& spec) {
  Params p;
  bool have_bw = false;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw TransportError("nic model: '" + item + "' is not key=value (in '" + spec + "')");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    double x = 0;
    try {
      size_t used = 0;
      x = std::stod(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
    } catch (const std::exception&) {
      throw TransportError("nic model: " + k + "='" + v + "' is not a number");
    }
    auto need = [&](bool ok, const char* what) {
      if (!ok) throw TransportError("nic model: " + k + "=" + v + ": expected " + what);
    };
    if (k == "bw") {
      need(x > 0, "bytes/s > 0");
      p.bw = x;
      have_bw = true;
    } else if (k == "lat_us") {
      need(x >= 0, "microseconds >= 0");
      p.lat_ns = x * 1e3;
    } else if (k == "reorder") {
      need(x >= 0 && x <= 1, "a probability in [0, 1]");
      p.reorder = x;
    } else if (k == "window_us") {
      need(x >= 0, "microseconds >= 0");
      p.window_ns = x * 1e3;
    } else if (k == "nics") {
      need(x >= 1 && x <= 64 && x == double(uint32_t(x)), "an integer in [1, 64]");
      p.nics = uint32_t(x);
    } else if (k == "seed") {
      need(x >= 0 && x < 9.2e18 && x == double(uint64_t(x)), "an integer >= 0");
      p.seed = uint64_t(x);
    } else if (k == "trace") {
      need(x >= 0 && x <= 1e7 && x == double(uint64_t(x)), "an integer in [0, 10000000]");
      p.trace = uint64_t(x);
    } else if (k == "mates") {
      need(x == 0 || x == 1, "0 or 1");
      p.mates = x == 1;
    } else if (k == "overlap") {
      need(x == 0 || x == 1, "0 or 1");
      p.overlap = x == 1;
    } else {
      throw TransportError("nic model: unknown parameter '" + k +
                           "' (bw, lat_us, reorder, window_us, nics, seed, mates, overlap, trace)");
    }
  }
  if (!have_bw) throw TransportError("nic model: bw=<bytes/s> is required (in '" + spec + "')");
  return p;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One NIC's send link: the time its last reserved byte leaves. Shared by the proxy threads of a
// rank that use this NIC (each thread's endpoint is a separate Transport).
// Idle accounting: a message posted after the link went free ends an idle stretch (the first
// message excepted); their total time and the number of stretches of at least kGapNs tell a
// link starved inside an op (many stretches per op) from one that only fills and drains
// between ops (about one per op). idle() and gaps() count the open stretch up to `now` too, so
// the difference of two readings is what happened between them.
struct Link {
  static constexpr int64_t kGapNs = 2000;
  // closed stretches of at least kGapNs by length: [2, 5), [5, 10), [10, 20), [20, 50), [50, 100), >= 100 us
  static constexpr int kBuckets = 6;
  static constexpr int64_t kBucketUs[kBuckets] = {2, 5, 10, 20, 50, 100};
  std::atomic<int64_t> free_ns{0};
  std::atomic<uint64_t> idle_ns{0}, gaps_closed{0};
  std::atomic<uint64_t> by_length[kBuckets] = {};
  int64_t open(int64_t now) const {  // relaxed: statistics
    const int64_t f = free_ns.load(std::memory_order_relaxed);
    return f > 0 && now > f ? now - f : 0;
  }
  uint64_t idle(int64_t now) const { return idle_ns.load(std::memory_order_relaxed) + uint64_t(open(now)); }
  uint64_t gaps(int64_t now) const {
    return gaps_closed.load(std::memory_order_relaxed) + (open(now) >= kGapNs ? 1 : 0);
  }
  // Reserves `dur` ns of the link from `now` on; returns when the message has left it.
  int64_t reserve(int64_t now, int64_t dur) {
    // relaxed: the CAS orders reservations among themselves; nothing else is published through it.
    int64_t cur = free_ns.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t end = std::max(cur, now) + dur;
      if (free_ns.compare_exchange_weak(cur, end, std::memory_order_relaxed)) {
        if (cur > 0 && now > cur) {  // relaxed: statistics
          idle_ns.fetch_add(uint64_t(now - cur), std::memory_order_relaxed);
          if (now - cur >= kGapNs) {
            gaps_closed.fetch_add(1, std::memory_order_relaxed);
            int b = kBuckets - 1;
            while (b > 0 && now - cur < kBucketUs[b] * 1000) --b;
            by_length[b].fetch_add(1, std::memory_order_relaxed);
          }
        }
        return end;
      }
    }
  }
};

std::shared_ptr<Link> link_for(const std::string& key) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Link>> links;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = links.begin(); it != links.end();) it = it->second.expired() ? links.erase(it) : std::next(it);
  std::weak_ptr<Link>& slot = links[key];
  std::shared_ptr<Link> l = slot.lock();
  if (!l) slot = l = std::make_shared<Link>();
  return l;
}

// The endpoint's last `capacity` events, Transport::kTraceFields int64 each: kind, time (ns, steady
// clock: one time base for every rank of a host), then per kind
//   kPost     link exit, due, bytes, peer, immediate
//   kRefused  outstanding, 0, bytes, peer, immediate (the first refusal of a run of them)
//   kRelease  due, ctx, bytes, peer, immediate (the message, or with overlap its immediate, handed to
//             the inner transport)
//   kDeliver  0, 0, 0, peer, immediate (an immediate received from `peer`)
//   kDone     0, ctx, 0, peer, 0 (the inner transport's local completion of a write)
//   kBytes    link exit (with reordering: post time), ctx, bytes, peer, 0 (overlap: a write's bytes
//             handed to the inner transport)
// NOTES: a mutex, not a lock-free ring: only a lab run turns it on, and the reader is another thread.
class TraceRecorder {
 public:
  enum Kind : int64_t { kPost = 0, kRefused = 1, kRelease = 2, kDeliver = 3, kDone = 4, kBytes = 5 };
  // NOTES: the whole buffer is allocated and touched here: growing it inside a traced op would
  // stall the proxy thread for the copies (and page faults) of a reallocation, which a trace of a
  // few ops shows as time the op itself never spends.
  explicit TraceRecorder(uint64_t capacity)
      : capacity_(capacity), events_(size_t(capacity) * Transport::kTraceFields, 0) {}
  bool on() const { return capacity_ > 0; }
  void add(Kind kind, int64_t t, int64_t a, int64_t b, int64_t len, int peer, uint32_t imm) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t* e = &events_[(next_ % capacity_) * Transport::kTraceFields];
    e[0] = kind, e[1] = t, e[2] = a, e[3] = b, e[4] = len, e[5] = peer, e[6] = int64_t(imm);
    ++next_;
  }
  std::vector<int64_t> events() const {  // oldest first
    std::lock_guard<std::mutex> lock(mu_);
    if (next_ <= capacity_)
      return std::vector<int64_t>(events_.begin(), events_.begin() + int64_t(next_ * Transport::kTraceFields));
    const size_t split = (next_ % capacity_) * Transport::kTraceFields;
    std::vector<int64_t> out(events_.begin() + int64_t(split), events_.end());
    out.insert(out.end(), events_.begin(), events_.begin() + int64_t(split));
    return out;
  }

 private:
  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::vector<int64_t> events_;
  uint64_t next_ = 0;
};

class NicModelTransport final : public Transport {
 public:
  NicModelTransport(std::unique_ptr<Transport> inner, const std::string& spec, const Options& opt)
      : inner_(std::move(inner)),
        spec_(spec),
        p_(parse(spec)),
        opt_(opt),
        rng_(p_.seed * 0x9E3779B97F4A7C15ull + uint64_t(opt.rank) * 1000003ull + uint64_t(opt.thread_index)),
        link_(link_for(opt.job_key + "/r" + std::to_string(opt.rank) + "/nic" +
                       std::to_string(uint32_t(opt.thread_index) % p_.nics))),
        trace_(p_.trace) {}

  std::string name() const override { return "nic:" + spec_ + ":" + inner_->name(); }
  std::string device() const override { return inner_->device(); }
  Caps caps() const override {
    Caps c = inner_->caps();
    if (p_.reorder > 0) c.ordered = false;
    return c;
  }
  std::vector<int64_t> trace() const override { return trace_.events(); }
  void register_region(void* base, uint64_t bytes) override { inner_->register_region(base, bytes); }
  Bytes local_address() override { return inner_->local_address(); }
  Bytes region_key() override { return inner_->region_key(); }
  void connect(const std::vector<Bytes>& a, const std::vector<Bytes>& k, const std::vector<uint64_t>& b) override {
    inner_->connect(a, k, b);
    // overlap needs the inner transport to deliver a write's immediate (a second write) after its bytes
    overlap_ = p_.overlap && inner_->caps().ordered;
    bytes_at_post_ = overlap_ && p_.reorder > 0;
  }
  void finalize_setup() override { inner_->finalize_setup(); }
  void shutdown() override { inner_->shutdown(); }
  std::vector<uint64_t> copy_ring() const override { return inner_->copy_ring(); }
  PostResult discard(int peer, uint64_t len, std::string* error) override { return inner_->discard(peer, len, error); }
  std::vector<std::pair<std::string, uint64_t>> counters() const override {
    // relaxed: statistics only.
    std::vector<std::pair<std::string, uint64_t>> c = {
        {"nic_model_writes", writes_.load(std::memory_order_relaxed)},
        {"nic_model_bytes", bytes_.load(std::memory_order_relaxed)},
        {"nic_model_wait_ns", wait_ns_.load(std::memory_order_relaxed)},
        {"nic_model_overtaken", overtaken_.load(std::memory_order_relaxed)},
        {"nic_model_held_completions", held_completions_.load(std::memory_order_relaxed)},
        {"nic_model_split_writes", split_writes_.load(std::memory_order_relaxed)},
        {"nic_model_parked_immediates", parked_.load(std::memory_order_relaxed)}};
    // A link is shared by the threads on it: the first of them reports it, so that the proxy's sum
    // over threads counts every link once.
    const bool reports_link = uint32_t(opt_.thread_index) < p_.nics;
    const int64_t now = now_ns();
    c.emplace_back("nic_model_idle_ns", reports_link ? link_->idle(now) : 0);
    c.emplace_back("nic_model_idle_gaps", reports_link ? link_->gaps(now) : 0);
    for (int b = 0; b < Link::kBuckets; ++b)
      c.emplace_back("nic_model_idle_ge" + std::to_string(Link::kBucketUs[b]) + "us",
                     reports_link ? link_->by_length[b].load(std::memory_order_relaxed) : 0);
    for (auto& kv : inner_->counters()) c.push_back(std::move(kv));
    return c;
  }

  PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm, uint32_t imm,
                   uint64_t ctx, std::string* error) override {
    if (is_part(ctx)) {
      if (error) *error = "nic model: write ctx " + std::to_string(ctx) + " uses the model's reserved top byte 0xFE";
      return PostResult::kError;
    }
    // Back-pressure: held plus posted-not-completed inner writes stay within what the inner endpoint takes.
    if (outstanding_ + 2 > std::max<uint32_t>(opt_.max_outstanding, 16)) {
      if (trace_.on() && !refusing_) trace_.add(TraceRecorder::kRefused, now_ns(), outstanding_, 0, int64_t(len), peer, imm);
      refusing_ = true;
      return PostResult::kAgain;
    }
    refusing_ = false;
    if (!p_.mates && same_node(peer)) {
      const PostResult r = inner_->write(peer, local_off, remote_off, len, has_imm, imm, ctx, error);
      if (r == PostResult::kOk) ++outstanding_;
      return r;
    }
    const int64_t now = now_ns();
    const int64_t left = link_->reserve(now, int64_t(double(len) * 1e9 / p_.bw));
    const int64_t extra = chance(p_.reorder) ? int64_t(std::uniform_real_distribution<double>(0, p_.window_ns)(rng_)) : 0;
    const int64_t due = left + int64_t(p_.lat_ns) + extra;
    if (len > 0 && overlap_) {
      const uint64_t id = kPartTag | (next_part_++ & ~kPartMask);
      parts_.emplace(id, Pair{ctx});
      held_.push(Msg{bytes_at_post_ ? now : left, next_seq_++, peer, local_off, remote_off, len, false, 0, id, kBytes,
                     id});
      held_.push(Msg{due, next_seq_++, peer, 0, remote_off, 0, has_imm, imm, ctx, kImmediate, id});
      outstanding_ += 2;
      split_writes_.fetch_add(1, std::memory_order_relaxed);
    } else {
      held_.push(Msg{due, next_seq_++, peer, local_off, remote_off, len, has_imm, imm, ctx, kWhole, 0});
      ++outstanding_;
    }
    ++modeled_[ctx];
    // relaxed: statistics (also below).
    writes_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(len, std::memory_order_relaxed);
    wait_ns_.fetch_add(uint64_t(due - now), std::memory_order_relaxed);
    if (trace_.on()) trace_.add(TraceRecorder::kPost, now, left, due, int64_t(len), peer, imm);
    return PostResult::kOk;
  }

  size_t poll(std::vector<Completion>& out, size_t max) override {
    const int64_t now = now_ns();
    release_writes(now);
    size_t n = 0;
    buf_.clear();
    inner_->poll(buf_, max);
    for (Completion& c : buf_) {
      if (trace_.on() && c.kind == Completion::kRemoteImm) trace_.add(TraceRecorder::kDeliver, now, 0, 0, 0, c.peer, c.imm);
      if (c.kind == Completion::kLocalDone || c.kind == Completion::kLocalError) {
        if (outstanding_ > 0) --outstanding_;
        if (is_part(c.ctx)) {  // a write's bytes (overlap): its immediate's completion speaks for it
          if (!bytes_done(c, now)) continue;
        } else {
          if (trace_.on()) trace_.add(TraceRecorder::kDone, now, 0, int64_t(c.ctx), 0, c.peer, 0);
          if (take_swallowed(c.ctx)) continue;
        }
        if (take_modeled(c.ctx) && c.kind == Completion::kLocalDone && chance(p_.reorder)) {
          held_completions_.fetch_add(1, std::memory_order_relaxed);
          const int64_t extra = int64_t(std::uniform_real_distribution<double>(0, p_.window_ns)(rng_));
          done_.push(Done{now + extra, next_seq_++, std::move(c)});
          continue;
        }
      }
      out.push_back(std::move(c));
      ++n;
    }
    if (unparked_) {  // immediates whose bytes just completed go now, not at the next poll
      unparked_ = false;
      release_writes(now);
    }
    while (n < max && !done_.empty() && done_.top().due <= now) {
      out.push_back(done_.top().c);
      done_.pop();
      ++n;
    }
    return n;
  }

 private:
  // What a held message carries to the inner transport: the whole write, or with overlap a write's
  // bytes (at its link exit) and then its immediate (at its due time); a message without bytes is
  // a control message.
  enum Part : uint8_t { kWhole = 0, kBytes = 1, kImmediate = 2 };
  // The inner ctx of a write's bytes (overlap): the reserved top byte, then a sequence number.
  static constexpr uint64_t kPartTag = 0xFEull << 56, kPartMask = 0xFFull << 56;
  static bool is_part(uint64_t ctx) { return (ctx & kPartMask) == kPartTag; }
  struct Msg {
    int64_t due;
    uint64_t seq;
    int peer;
    uint64_t local_off, remote_off, len;
    bool has_imm;
    uint32_t imm;
    uint64_t ctx;
    Part part;
    uint64_t part_id;  // kBytes / kImmediate: the pair's entry in parts_
    bool operator>(const Msg& o) const { return due != o.due ? due > o.due : seq > o.seq; }
  };
  struct Done {
    int64_t due;
    uint64_t seq;
    Completion c;
    bool operator>(const Done& o) const { return due != o.due ? due > o.due : seq > o.seq; }
  };
  // A write split in two (overlap), until both halves are settled.
  struct Pair {
    uint64_t ctx = 0;               // the proxy's ctx (the immediate's)
    bool immediate_posted = false;
    bool bytes_done = false;
    bool bytes_failed = false;
    bool parked = false;            // the immediate is due but waits for its bytes (bytes_at_post_)
    Msg immediate{};                // the parked immediate
    Completion failure{};           // the bytes' error, reported as the write's completion
    explicit Pair(uint64_t c = 0) : ctx(c) {}
  };

  bool take_modeled(uint64_t ctx) {
    auto it = modeled_.find(ctx);
    if (it == modeled_.end()) return false;
    if (--it->second == 0) modeled_.erase(it);
    return true;
  }

  bool take_swallowed(uint64_t ctx) {
    auto it = swallow_.find(ctx);
    if (it == swallow_.end()) return false;
    if (--it->second == 0) swallow_.erase(it);
    return true;
  }

  // The completion of a write's bytes (overlap). Success settles the half (and sends a parked
  // immediate on its way); an error becomes the write's one completion: reported now (true, `c`
  // rewritten to the proxy's ctx) when the immediate was already posted (its own completion is then
  // dropped) or parked (it is never posted), else when it is due.
  bool bytes_done(Completion& c, int64_t now) {
    auto it = parts_.find(c.ctx);
    if (it == parts_.end()) return false;
    Pair& pair = it->second;
    if (c.kind == Completion::kLocalDone) {
      pair.bytes_done = true;
      if (pair.immediate_posted) {
        parts_.erase(it);
      } else if (pair.parked) {
        pair.parked = false;
        pair.immediate.due = now;
        held_.push(pair.immediate);
        unparked_ = true;
      }
      return false;
    }
    c.ctx = pair.ctx;
    if (trace_.on()) trace_.add(TraceRecorder::kDone, now, 0, int64_t(c.ctx), 0, c.peer, 0);
    if (pair.parked) {
      --outstanding_;  // the immediate's share: it is never posted
    } else if (pair.immediate_posted) {
      ++swallow_[pair.ctx];
    } else {
      pair.bytes_failed = true;
      pair.failure = c;
      return false;
    }
    parts_.erase(it);
    return true;
  }

  bool same_node(int peer) const {
    const int rpn = std::max(1, opt_.ranks_per_node);
    return peer >= 0 && peer / rpn == opt_.rank / rpn;
  }

  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // Posts every message whose time has come, earliest first; stops at the first the inner
  // endpoint cannot take yet (it is retried at the next poll, so the order of release holds).
  void release_writes(int64_t now) {
    while (!held_.empty() && held_.top().due <= now) {
      const Msg& m = held_.top();
      auto pair = m.part == kImmediate ? parts_.find(m.part_id) : parts_.end();
      if (pair != parts_.end() && pair->second.bytes_failed) {  // the write's completion is its bytes' error
        --outstanding_;
        take_modeled(pair->second.ctx);
        done_.push(Done{now, next_seq_++, pair->second.failure});
        parts_.erase(pair);
        held_.pop();
        continue;
      }
      if (pair != parts_.end() && bytes_at_post_ && !pair->second.bytes_done) {  // wait for the bytes
        pair->second.parked = true;
        pair->second.immediate = m;
        parked_.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
        held_.pop();
        continue;
      }
      std::string err;
      const PostResult r =
          m.len == 0 && p_.reorder > 0  // a control message, or an immediate whose bytes completed
              ? inner_->write_control(m.peer, m.remote_off, m.has_imm, m.imm, m.ctx, &err)
              : inner_->write(m.peer, m.local_off, m.remote_off, m.len, m.has_imm, m.imm, m.ctx, &err);
      if (r == PostResult::kAgain) return;
      if (m.part == kBytes) {
        if (trace_.on()) trace_.add(TraceRecorder::kBytes, now, m.due, int64_t(m.ctx), int64_t(m.len), m.peer, 0);
      } else {
        if (trace_.on()) trace_.add(TraceRecorder::kRelease, now, m.due, int64_t(m.ctx), int64_t(m.len), m.peer, m.imm);
        if (m.seq < released_seq_) overtaken_.fetch_add(1, std::memory_order_relaxed);
        released_seq_ = std::max(released_seq_, m.seq);
      }
      if (r == PostResult::kError) {
        // Reported through the normal completion path, so the proxy sees one completion per write.
        --outstanding_;
        Completion c{Completion::kLocalError, m.peer, 0, m.ctx, EIO, err};
        if (m.part == kBytes) {
          if (bytes_done(c, now)) {  // its immediate was parked: this is the write's completion
            take_modeled(c.ctx);
            done_.push(Done{now, next_seq_++, std::move(c)});
          }
        } else {
          if (m.part == kImmediate) parts_.erase(m.part_id);
          take_modeled(m.ctx);
          done_.push(Done{now, next_seq_++, std::move(c)});
        }
      } else if (m.part == kImmediate && pair != parts_.end()) {
        pair->second.immediate_posted = true;
        if (pair->second.bytes_done) parts_.erase(pair);
      }
      held_.pop();
    }
  }

  std::unique_ptr<Transport> inner_;
  std::string spec_;
  Params p_;
  Options opt_;
  std::mt19937_64 rng_;
  std::shared_ptr<Link> link_;
  uint64_t next_seq_ = 1;
  uint64_t released_seq_ = 0;
  uint32_t outstanding_ = 0;
  bool refusing_ = false;  // the last write was refused (trace: one kRefused per run)
  TraceRecorder trace_;
  std::priority_queue<Msg, std::vector<Msg>, std::greater<Msg>> held_;
  std::priority_queue<Done, std::vector<Done>, std::greater<Done>> done_;
  std::vector<Completion> buf_;
  // ctx -> modeled writes with it not yet completed (control messages all share one ctx)
  std::unordered_map<uint64_t, uint32_t> modeled_;
  std::unordered_map<uint64_t, Pair> parts_;       // overlap: split writes by their bytes' ctx
  std::unordered_map<uint64_t, uint32_t> swallow_;  // proxy ctx -> immediate completions to drop
  uint64_t next_part_ = 0;
  bool overlap_ = false;  // p_.overlap over an inner transport that keeps order per peer (set at connect)
  bool bytes_at_post_ = false;  // overlap with reordering: a write's bytes go at posting (NOTES above)
  bool unparked_ = false;       // a parked immediate was queued again during this poll
  std::atomic<uint64_t> writes_{0}, bytes_{0}, wait_ns_{0}, overtaken_{0}, held_completions_{0}, split_writes_{0},
      parked_{0};
};

}  // namespace

std::unique_ptr<Transport> make_nic_model(std::unique_ptr<Transport> inner, const std::string& spec,
                                          const Options& options) {
  return std::make_unique<NicModelTransport>(std::move(inner), spec, options);
}

void check_nic_model(const std::string& spec) { (void)parse(spec); }

}  // namespace transport
}  // namespace uccl_ep
