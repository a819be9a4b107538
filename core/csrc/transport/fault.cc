// `fault:<inner>` decorator: makes any transport behave like the least ordered NIC we support.
//
// - reorder / delay: a write is held back for a random number of polls (up to fault_max_delay)
//   and released in random order, so later writes (to the same peer too) overtake it; incoming
//   immediates and local completions are shuffled and delayed the same way;
// - tear: a write is split into pieces posted in random order; its immediate travels with the
//   last piece, posted only after every other piece completed (like a NIC that places bytes out
//   of order but reports the immediate once all of them landed);
// - it never drops or duplicates a completion: every held item is released within
//   fault_max_delay polls of becoming eligible;
// - a write outside the peer's region goes to the inner transport whole (never torn), so the
//   inner transport's range check refuses all of it and names the writer at the receiver.
// Seeded (Options::fault_seed, mixed with rank and thread) so a failing run can be replayed.
#include <errno.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <unordered_map>

#include "transport/transport.h"

namespace uccl_ep {
namespace transport {

namespace {

class FaultTransport final : public Transport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, const Options& opt)
      : inner_(std::move(inner)),
        opt_(opt),
        rng_(opt.fault_seed * 0x9E3779B97F4A7C15ull + uint64_t(opt.rank) * 1000003ull + uint64_t(opt.thread_index)) {}

  std::string name() const override { return "fault:" + inner_->name(); }
  std::string device() const override { return inner_->device(); }
  Caps caps() const override {
    Caps c = inner_->caps();
    c.ordered = false;
    return c;
  }
  void register_region(void* base, uint64_t bytes) override { inner_->register_region(base, bytes); }
  Bytes local_address() override { return inner_->local_address(); }
  void shutdown() override { inner_->shutdown(); }
  Bytes region_key() override { return inner_->region_key(); }
  void connect(const std::vector<Bytes>& a, const std::vector<Bytes>& k, const std::vector<uint64_t>& b) override {
    inner_->connect(a, k, b);
    peer_bytes_ = b;
  }
  void finalize_setup() override { inner_->finalize_setup(); }
  std::vector<uint64_t> copy_ring() const override { return inner_->copy_ring(); }
  PostResult discard(int peer, uint64_t len, std::string* error) override { return inner_->discard(peer, len, error); }
  std::vector<int64_t> trace() const override { return inner_->trace(); }
  std::vector<std::pair<std::string, uint64_t>> counters() const override {
    // relaxed: statistics only.
    std::vector<std::pair<std::string, uint64_t>> c = {
        {"fault_held_writes", held_writes_.load(std::memory_order_relaxed)},
        {"fault_torn_writes", torn_writes_.load(std::memory_order_relaxed)},
        {"fault_pieces", pieces_.load(std::memory_order_relaxed)},
        {"fault_held_completions", held_completions_.load(std::memory_order_relaxed)}};
    for (auto& kv : inner_->counters()) c.push_back(std::move(kv));  // the wrapped backend's own
    return c;
  }

  PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm, uint32_t imm,
                   uint64_t ctx, std::string*) override {
    // Back-pressure: never hold more than the inner endpoint could have in flight.
    if (held_out_.size() + ops_.size() >= std::max<uint32_t>(opt_.max_outstanding, 16)) return PostResult::kAgain;
    const uint64_t op_id = next_id_++;
    Op& op = ops_[op_id];
    op.user_ctx = ctx;
    op.peer = peer;
    // NOTES: a write outside the peer's region is never torn: a piece of it could fall inside
    // (or wrap around to offset 0) and land, where the whole write must be refused by the inner
    // transport's check.
    const bool in_bounds = size_t(peer) < peer_bytes_.size() && remote_off <= peer_bytes_[size_t(peer)] &&
                           len <= peer_bytes_[size_t(peer)] - remote_off;
    if (in_bounds && len >= 32 && chance(opt_.fault_tear) && opt_.fault_max_pieces >= 2) {
      // Cut points on 16-byte boundaries keep every piece's offsets aligned like the original.
      const uint32_t pieces = 2 + uint32_t(rng_() % (opt_.fault_max_pieces - 1));
      std::vector<uint64_t> cuts{0, len};
      for (uint32_t i = 1; i < pieces; ++i) cuts.push_back((rng_() % len) & ~uint64_t(15));
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      // The immediate rides on the last piece; the others go first, shuffled.
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const uint64_t a = cuts[i], b = cuts[i + 1];
        Piece piece{op_id, peer, local_off + a, remote_off + a, b - a, false, 0, delay()};
        if (i + 2 == cuts.size()) {
          piece.has_imm = has_imm;
          piece.imm = imm;
          op.last = piece;
        } else {
          held_out_.push_back(piece);
          ++op.pieces_left;
        }
      }
      if (op.pieces_left == 0) held_out_.push_back(op.last);
      else op.last_waiting = true;
      torn_writes_.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics (also below)
      pieces_.fetch_add(cuts.size() - 1, std::memory_order_relaxed);
    } else {
      const uint32_t hold = chance(opt_.fault_reorder) ? delay() : 0;
      if (hold) held_writes_.fetch_add(1, std::memory_order_relaxed);
      held_out_.push_back({op_id, peer, local_off, remote_off, len, has_imm, imm, hold});
    }
    return PostResult::kOk;
  }

  size_t poll(std::vector<Completion>& out, size_t max) override {
    release_writes();
    inner_buf_.clear();
    inner_->poll(inner_buf_, max);
    for (Completion& c : inner_buf_) {
      if (c.kind == Completion::kLocalDone || c.kind == Completion::kLocalError) {
        if (!finish_piece(c)) continue;
      }
      const uint32_t hold = chance(opt_.fault_reorder) ? delay() : 0;
      if (hold) held_completions_.fetch_add(1, std::memory_order_relaxed);
      held_in_.push_back({std::move(c), hold});
    }
    // Release what is due, in random order.
    std::shuffle(held_in_.begin(), held_in_.end(), rng_);
    size_t n = 0;
    for (size_t i = 0; i < held_in_.size() && n < max;) {
      if (held_in_[i].hold == 0) {
        out.push_back(std::move(held_in_[i].c));
        held_in_[i] = std::move(held_in_.back());
        held_in_.pop_back();
        ++n;
      } else {
        --held_in_[i].hold;
        ++i;
      }
    }
    return n;
  }

 private:
  struct Piece {
    uint64_t op_id;
    int peer;
    uint64_t local_off, remote_off, len;
    bool has_imm;
    uint32_t imm;
    uint32_t hold;  // polls to wait before posting
  };
  struct Op {
    uint64_t user_ctx = 0;
    int peer = 0;
    uint32_t pieces_left = 0;   // posted-or-held pieces before the last one
    bool last_waiting = false;  // the last piece waits for pieces_left == 0
    bool failed = false;
    int error = 0;
    std::string detail;
    Piece last{};
  };
  struct Held {
    Completion c;
    uint32_t hold;
  };

  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  uint32_t delay() { return opt_.fault_max_delay ? 1 + uint32_t(rng_() % opt_.fault_max_delay) : 1; }

  void release_writes() {
    std::shuffle(held_out_.begin(), held_out_.end(), rng_);
    for (size_t i = 0; i < held_out_.size();) {
      Piece& p = held_out_[i];
      if (p.hold > 0) {
        --p.hold;
        ++i;
        continue;
      }
      std::string err;
      const PostResult r = inner_->write(p.peer, p.local_off, p.remote_off, p.len, p.has_imm, p.imm, p.op_id, &err);
      if (r == PostResult::kAgain) {
        ++i;
        continue;
      }
      if (r == PostResult::kError) {
        // Report through the normal completion path so the proxy sees one error per write.
        held_in_.push_back({{Completion::kLocalError, p.peer, 0, p.op_id, EIO, err}, 0});
        finish_piece(held_in_.back().c) ? void() : held_in_.pop_back();
      }
      held_out_[i] = held_out_.back();
      held_out_.pop_back();
    }
  }

  // A piece completed. Rewrites c into the user's completion and returns true when the whole
  // write is done; false while pieces are still outstanding.
  bool finish_piece(Completion& c) {
    auto it = ops_.find(c.ctx);
    if (it == ops_.end()) return true;  // not ours (cannot happen; pass through)
    Op& op = it->second;
    if (c.kind == Completion::kLocalError && !op.failed) {
      op.failed = true;
      op.error = c.error;
      op.detail = c.detail;
    }
    if (op.last_waiting) {
      if (--op.pieces_left > 0) return false;
      op.last_waiting = false;
      op.last.hold = delay();
      held_out_.push_back(op.last);
      return false;
    }
    c.ctx = op.user_ctx;
    if (op.failed) {
      c.kind = Completion::kLocalError;
      c.error = op.error;
      c.detail = op.detail;
    }
    ops_.erase(it);
    return true;
  }

  std::unique_ptr<Transport> inner_;
  Options opt_;
  std::mt19937_64 rng_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Op> ops_;
  std::vector<Piece> held_out_;
  std::vector<Held> held_in_;
  std::vector<Completion> inner_buf_;
  std::vector<uint64_t> peer_bytes_;  // each peer's region (connect)
  std::atomic<uint64_t> held_writes_{0}, torn_writes_{0}, pieces_{0}, held_completions_{0};
};

}  // namespace

std::unique_ptr<Transport> make_fault(std::unique_ptr<Transport> inner, const Options& options) {
  return std::make_unique<FaultTransport>(std::move(inner), options);
}

}  // namespace transport
}  // namespace uccl_ep
