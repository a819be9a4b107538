#include "proxy/proxy_thread.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>

#include "fifo/backoff.h"
#include "proxy/proxy.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace proxy {

using protocol::TransferCmd;

namespace {

// Completion context of a posted write: which FIFO (or control) and which index.
constexpr int kCtxFifoShift = 56;
constexpr uint64_t kCtxControl = 0xFF;
constexpr uint64_t kCtxIdxMask = (uint64_t(1) << kCtxFifoShift) - 1;
constexpr int kBudgetPerFifo = 64;  // commands per FIFO per pass: keeps completions flowing
constexpr size_t kPollBatch = 64;

uint64_t make_ctx(uint64_t fifo, uint64_t idx) { return (fifo << kCtxFifoShift) | (idx & kCtxIdxMask); }

// 24-bit serial distance a - b of barrier epochs.
int32_t epoch_distance(uint32_t a, uint32_t b) {
  constexpr uint32_t m = imm::limits::kEpochModulus;
  return int32_t((a - b + m / 2) & (m - 1)) - int32_t(m / 2);
}

}  // namespace

ProxyThread::ProxyThread(Proxy& owner, int index, std::unique_ptr<transport::Transport> transport,
                         std::vector<fifo::HostFifo*> fifos)
    : owner_(owner),
      index_(index),
      rank_(owner.config().rank),
      num_ranks_(owner.config().num_ranks),
      transport_(std::move(transport)),
      receiver_(owner.config().num_ranks, owner.config().num_counters, owner.counters()),
      inflight_(size_t(owner.config().num_ranks), 0),
      control_out_(size_t(owner.config().num_ranks)),
      next_seq_(size_t(owner.config().num_ranks)) {
  for (fifo::HostFifo* f : fifos) {
    FifoState s;
    s.fifo = f;
    s.done.assign(f->capacity(), 0);
    fifos_.push_back(std::move(s));
  }
  for (auto& v : seen_) v.assign(size_t(num_ranks_), imm::limits::kEpochModulus - 1);
}

ProxyThread::~ProxyThread() { join(); }

void ProxyThread::start(const std::vector<int>& cpus) {
  thread_ = std::thread([this, cpus] { run(cpus); });
}

void ProxyThread::join() {
  if (thread_.joinable()) thread_.join();
}

void ProxyThread::run(std::vector<int> cpus) {
  if (!cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    // NOTES: best effort; a container may forbid some CPUs and the proxy still works unpinned.
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  // only pause()/reset() are used; the deadline never matters
  Backoff idle(1e6, long(owner_.config().idle_sleep_ns));
  bool said_goodbye = false;
  int64_t drain_by = 0;
  int64_t leave_by = 0;
  for (;;) {
    if (owner_.stopping()) {
      // NOTES: a clean stop first carries out what producers pushed before it (bounded), so a
      // peer never misses a write that was queued before this rank left; only then does thread 0
      // say goodbye. A failed proxy skips the drain (its peers are told by the failure itself).
      if (drain_by == 0) drain_by = now_ns() + 500 * 1000 * 1000;
      if (!owner_.failed() && now_ns() < drain_by && (fifos_hold_commands() || inflight_total() != 0)) {
        if (step()) idle.reset();
        else idle.pause();
        continue;
      }
      if (index_ != 0) break;
      // Thread 0 tells every peer this rank is leaving, so their waits fail fast instead of
      // timing out, then gives the messages a bounded time to go out.
      if (!said_goodbye) {
        for (int p = 0; p < num_ranks_; ++p)
          if (p != rank_ && !owner_.departed(p)) send_control(p, imm::control(imm::kOpGoodbye, 0));
        said_goodbye = true;
        leave_by = now_ns() + 500 * 1000 * 1000;
      }
      if ((control_pending_ == 0 && inflight_total() == 0) || now_ns() > leave_by) break;
    }
    if (step()) idle.reset();
    else idle.pause();
  }
}

bool ProxyThread::fifos_hold_commands() const {
  TransferCmd cmd;
  for (const FifoState& s : fifos_)
    if (s.fifo->peek(&cmd)) return true;
  return false;
}

uint32_t ProxyThread::inflight_total() const {
  uint32_t pending = 0;
  for (uint32_t n : inflight_) pending += n;
  return pending;
}

bool ProxyThread::step() {
  bool progress = false;
  events_.clear();
  if (transport_->poll(events_, kPollBatch) > 0) progress = true;
  for (const transport::Completion& c : events_) on_completion(c);
  progress |= flush_control();
  // Posting goes on while stopping: run() drains what was pushed before the stop.
  if (!owner_.failed()) {
    for (int f = 0; f < int(fifos_.size()); ++f) progress |= post_from(f);
  }
  progress |= check_whole_quiets();
  progress |= advance_barrier();
  if (index_ == 0) housekeeping();
  return progress;
}

bool ProxyThread::post_from(int f) {
  FifoState& s = fifos_[size_t(f)];
  int n = 0;
  TransferCmd cmd;
  while (!s.blocked && n < kBudgetPerFifo && s.fifo->peek(&cmd)) {
    const uint64_t idx = s.fifo->consumer_index();
    // The done ring holds one lap of indices: wait for the watermark before going further.
    if (idx >= s.watermark + s.fifo->capacity()) break;
    if (!post_command(f, cmd, idx)) break;
    s.fifo->pop();
    ++n;
  }
  if (n > 0) commands_.fetch_add(uint64_t(n), std::memory_order_relaxed);  // relaxed: a statistic
  return n > 0;
}

bool ProxyThread::post_command(int f, const TransferCmd& cmd, uint64_t idx) {
  using namespace protocol;
  const ProxyConfig& cfg = owner_.config();
  // Built only on the error paths: formatting a string per command would dominate the hot loop.
  auto where = [&] { return " (fifo " + std::to_string(f * cfg.num_threads + index_) + ", index " + std::to_string(idx) + ")"; };
  const uint32_t type = cmd_type(cmd);
  if (!cmd_reserved_clear(cmd)) {
    protocol_error(-1, "command with reserved bits set" + where());
    return false;
  }
  if (type == kCmdWrite || type == kCmdAtomic) {
    const int dst = int(cmd_dst_rank(cmd));
    const uint32_t c = cmd_counter(cmd);
    if (dst >= num_ranks_) {
      protocol_error(dst, "command for rank " + std::to_string(dst) + " in a group of " + std::to_string(num_ranks_) + where());
      return false;
    }
    if (c >= cfg.num_counters) {
      protocol_error(dst, "counter " + std::to_string(c) + " out of range (the buffer has " +
                              std::to_string(cfg.num_counters) + " per source)" + where());
      return false;
    }
    if (owner_.dead(dst)) {
      // an excluded peer that died: nothing to send it, nothing to wait for
      if (type == kCmdWrite && !drop_write(dst, cmd_len(cmd))) return false;
      complete(f, idx);
      return true;
    }
    uint64_t soff = 0, doff = 0, len = 0;
    uint32_t imm_value;
    bool ordered = false;
    if (type == kCmdWrite) {
      soff = cmd_src_off(cmd), doff = cmd_dst_off(cmd), len = cmd_len(cmd);
      ordered = cmd_flag(cmd);
      if (soff > owner_.region_bytes() || len > owner_.region_bytes() - soff) {
        protocol_error(dst, "write source [" + std::to_string(soff) + ", +" + std::to_string(len) +
                                ") is outside this rank's region of " + std::to_string(owner_.region_bytes()) + " bytes" + where());
        return false;
      }
      const uint64_t peer_bytes = owner_.peer_region_bytes(dst);
      if (cfg.check_remote_bounds && (doff > peer_bytes || len > peer_bytes - doff)) {
        protocol_error(dst, "write to rank " + std::to_string(dst) + " at [" + std::to_string(doff) + ", +" +
                                std::to_string(len) + ") is outside its region of " + std::to_string(peer_bytes) +
                                " bytes; refused before posting" + where());
        return false;
      }
      if (ordered && c >= imm::limits::kMaxOrderedCounters) {
        protocol_error(dst, "ordered write on counter " + std::to_string(c) + " (ordered counters < " +
                                std::to_string(imm::limits::kMaxOrderedCounters) + ")" + where());
        return false;
      }
      if (inflight_[size_t(dst)] >= cfg.max_inflight) return false;
      if (ordered) {
        std::vector<uint16_t>& seqs = next_seq_[size_t(dst)];
        if (seqs.empty()) seqs.assign(imm::limits::kMaxOrderedCounters, 0);
        imm_value = imm::ordered(c, seqs[c], cmd_increment(cmd));
      } else {
        imm_value = imm::counted(c);
      }
    } else {
      const int32_t value = cmd_value(cmd);
      if (cmd_flag(cmd) && value < 1) {
        protocol_error(dst, "fenced atomic with value " + std::to_string(value) + " (must be count + 1 >= 1)" + where());
        return false;
      }
      if (inflight_[size_t(dst)] >= cfg.max_inflight) return false;
      imm_value = imm::atomic(c, value, cmd_flag(cmd));
    }
    std::string err;
    const transport::PostResult r =
        transport_->write(dst, soff, doff, len, true, imm_value, make_ctx(uint64_t(f), idx), &err);
    if (r == transport::PostResult::kAgain) return false;
    if (r == transport::PostResult::kError) {
      if (owner_.departed(dst) || owner_.excluded(dst)) {
        if (owner_.excluded(dst)) owner_.mark_dead(dst);
        // the peer left (or is excluded and failed): the write is moot
        if (type == kCmdWrite && !drop_write(dst, len)) return false;
        complete(f, idx);
        return true;
      }
      owner_.fail(error_info(ErrorKind::kPeerFailure, rank_, dst, "transport", err));
      return false;
    }
    ++inflight_[size_t(dst)];
    if (ordered) {
      uint16_t& s = next_seq_[size_t(dst)][c];
      s = uint16_t((s + 1) % imm::limits::kSeqModulus);
    }
    return true;
  }
  if (type == kCmdQuiet) {
    if (!cmd_flag(cmd)) {
      // The watermark only passes idx once everything before it completed: done at once.
      complete(f, idx);
    } else {
      WholeQuiet q{f, idx, {}};
      for (int g = 0; g < int(fifos_.size()); ++g) q.snapshot.push_back(g == f ? idx : fifos_[size_t(g)].fifo->consumer_index());
      whole_quiets_.push_back(std::move(q));
    }
    return true;
  }
  if (type == kCmdBarrier) {
    barrier_.active = true;
    barrier_.fifo = f;
    barrier_.idx = idx;
    barrier_.rail = cmd_flag(cmd);
    barrier_.epoch = barrier_.rail ? epoch_rail_ : epoch_all_;
    barrier_.stage = 0;
    fifos_[size_t(f)].blocked = true;
    return true;
  }
  protocol_error(-1, "invalid command type " + std::to_string(type) + where());
  return false;
}

bool ProxyThread::drop_write(int dst, uint64_t len) {
  std::string err;
  switch (transport_->discard(dst, len, &err)) {
    case transport::PostResult::kOk:
      return true;
    case transport::PostResult::kAgain:
      return false;
    case transport::PostResult::kError:
      break;
  }
  // NOTES: the copy consumer would wait for these bytes until its timeout; failing the proxy ends
  // its wait at once (it watches the FIFO status) with this error instead.
  owner_.fail(error_info(ErrorKind::kPeerFailure, rank_, dst, "transport",
                         "a write to the failed peer could not be dropped: " + err));
  return false;
}

void ProxyThread::complete(int f, uint64_t idx) {
  FifoState& s = fifos_[size_t(f)];
  const uint64_t mask = s.fifo->capacity() - 1;
  s.done[idx & mask] = 1;
  if (idx != s.watermark) return;
  uint64_t w = s.watermark;
  while (s.done[w & mask]) {
    s.done[w & mask] = 0;
    ++w;
  }
  s.watermark = w;
  s.fifo->publish_completed(w);
}

void ProxyThread::on_completion(const transport::Completion& c) {
  switch (c.kind) {
    case transport::Completion::kLocalDone:
    case transport::Completion::kLocalError: {
      if (c.peer >= 0 && c.peer < num_ranks_ && inflight_[size_t(c.peer)] > 0) --inflight_[size_t(c.peer)];
      // NOTES: a peer that said goodbye closes its endpoint; our writes still in flight to it
      // fail, which is expected and must not fail this rank (its waits on that peer do).
      if (c.kind == transport::Completion::kLocalError && !(c.peer >= 0 && owner_.departed(c.peer))) {
        // EFAULT: the target refused the range (loop checks bounds at the target).
        const ErrorKind kind = c.error == EFAULT ? ErrorKind::kPeerProtocolError : ErrorKind::kPeerFailure;
        owner_.peer_failed(error_info(kind, rank_, c.peer, "transport", c.detail));
        if (!owner_.failed()) complete_ctx(c.ctx);
        return;
      }
      complete_ctx(c.ctx);
      return;
    }
    case transport::Completion::kRemoteImm: {
      owner_.heard_from(c.peer);
      if (imm::kind(c.imm) == imm::kControl) {
        on_control(c.peer, c.imm);
        return;
      }
      const std::string err = receiver_.on_imm(c.peer, c.imm);
      if (!err.empty()) protocol_error(c.peer, err);
      return;
    }
    case transport::Completion::kRemoteError:
      protocol_error(c.peer, c.detail);
      return;
  }
}

void ProxyThread::complete_ctx(uint64_t ctx) {
  const uint64_t f = ctx >> kCtxFifoShift;
  if (f == kCtxControl || f >= fifos_.size()) return;
  // Rebuild the full index from the low bits: indices in flight are within one lap of the watermark.
  const uint64_t wm = fifos_[f].watermark;
  uint64_t idx = (wm & ~kCtxIdxMask) | (ctx & kCtxIdxMask);
  if (idx < wm) idx += kCtxIdxMask + 1;
  complete(int(f), idx);
}

void ProxyThread::send_control(int peer, uint32_t imm) {
  control_out_[size_t(peer)].push_back(imm);
  ++control_pending_;
}

bool ProxyThread::flush_control() {
  if (control_pending_ == 0) return false;
  bool progress = false;
  for (int peer = 0; peer < num_ranks_; ++peer) {
    std::deque<uint32_t>& q = control_out_[size_t(peer)];
    if (owner_.dead(peer)) {
      control_pending_ -= q.size();
      q.clear();
    }
    while (!q.empty()) {
      std::string err;
      const transport::PostResult r = transport_->write(peer, 0, 0, 0, true, q.front(), make_ctx(kCtxControl, 0), &err);
      if (r == transport::PostResult::kAgain) break;  // this peer stalls; the others still go
      q.pop_front();
      --control_pending_;
      progress = true;
      if (r == transport::PostResult::kError) {
        if (!owner_.stopping() && !owner_.departed(peer))
          owner_.peer_failed(error_info(ErrorKind::kPeerFailure, rank_, peer, "transport", err));
        continue;
      }
      ++inflight_[size_t(peer)];
    }
  }
  return progress;
}

void ProxyThread::on_control(int src, uint32_t value) {
  const uint32_t op = imm::op(value);
  switch (op) {
    case imm::kOpHeartbeat:
      return;
    case imm::kOpGoodbye:
      owner_.mark_departed(src);
      return;
    case imm::kOpBarrierArrive:
    case imm::kOpRailArrive:
    case imm::kOpBarrierRelease:
    case imm::kOpLeaderArrive: {
      uint32_t& seen = seen_[op][size_t(src)];
      if (epoch_distance(imm::arg(value), seen) > 0) seen = imm::arg(value);
      return;
    }
    default:
      protocol_error(src, "unknown control operation " + std::to_string(op));
  }
}

bool ProxyThread::advance_barrier() {
  if (!barrier_.active) return false;
  Barrier& b = barrier_;
  const int rpn = owner_.config().ranks_per_node;
  const int node = rank_ / rpn, local = rank_ % rpn, leader = node * rpn, num_nodes = num_ranks_ / rpn;
  auto reached = [&](uint32_t op, int src) { return epoch_distance(seen_[op][size_t(src)], b.epoch) >= 0; };
  const uint32_t epoch_arg = b.epoch;
  const int stage_before = b.stage;
  bool done = false;
  if (b.stage == 0) {
    // Everything pushed before the barrier on this FIFO must have completed first.
    if (fifos_[size_t(b.fifo)].watermark < b.idx) return false;
    if (b.rail) {
      for (int n = 0; n < num_nodes; ++n)
        if (n != node) send_control(n * rpn + local, imm::control(imm::kOpRailArrive, epoch_arg));
      b.stage = 5;
    } else if (rank_ != leader) {
      send_control(leader, imm::control(imm::kOpBarrierArrive, epoch_arg));
      b.stage = 2;
    } else {
      b.stage = 3;
    }
  }
  if (b.stage == 2 && reached(imm::kOpBarrierRelease, leader)) done = true;
  if (b.stage == 3) {
    bool all = true;
    for (int l = 1; l < rpn && all; ++l) all = reached(imm::kOpBarrierArrive, leader + l);
    if (all) {
      for (int n = 0; n < num_nodes; ++n)
        if (n != node) send_control(n * rpn, imm::control(imm::kOpLeaderArrive, epoch_arg));
      b.stage = 4;
    }
  }
  if (b.stage == 4) {
    bool all = true;
    for (int n = 0; n < num_nodes && all; ++n) all = n == node || reached(imm::kOpLeaderArrive, n * rpn);
    if (all) {
      for (int l = 1; l < rpn; ++l) send_control(leader + l, imm::control(imm::kOpBarrierRelease, epoch_arg));
      done = true;
    }
  }
  if (b.stage == 5) {
    bool all = true;
    for (int n = 0; n < num_nodes && all; ++n) all = n == node || reached(imm::kOpRailArrive, n * rpn + local);
    done = all;
  }
  if (!done) return b.stage != stage_before;
  uint32_t& epoch = b.rail ? epoch_rail_ : epoch_all_;
  epoch = (epoch + 1) % imm::limits::kEpochModulus;
  fifos_[size_t(b.fifo)].blocked = false;
  b.active = false;
  complete(b.fifo, b.idx);
  return true;
}

bool ProxyThread::check_whole_quiets() {
  bool progress = false;
  for (size_t i = 0; i < whole_quiets_.size();) {
    const WholeQuiet& q = whole_quiets_[i];
    bool all = true;
    for (size_t g = 0; g < fifos_.size() && all; ++g) all = fifos_[g].watermark >= q.snapshot[g];
    if (all) {
      complete(q.fifo, q.idx);
      whole_quiets_.erase(whole_quiets_.begin() + long(i));
      progress = true;
    } else {
      ++i;
    }
  }
  return progress;
}

void ProxyThread::housekeeping() {
  if (num_ranks_ == 1 || owner_.failed()) return;
  const int64_t now = now_ns();
  if (now >= next_heartbeat_ns_) {
    next_heartbeat_ns_ = now + int64_t(owner_.heartbeat_interval_s() * 1e9);
    for (int p = 0; p < num_ranks_; ++p)
      // NOTES: never pile heartbeats behind a peer that stopped draining them.
      if (p != rank_ && !owner_.departed(p) && !owner_.dead(p) && control_out_[size_t(p)].size() < 4)
        send_control(p, imm::control(imm::kOpHeartbeat, 0));
    // The peer silent the longest is the one to blame (others may only be stuck behind it).
    int worst = -1;
    int64_t worst_silent = int64_t(owner_.failure_grace_s() * 1e9);
    for (int p = 0; p < num_ranks_; ++p) {
      if (p == rank_ || owner_.departed(p) || owner_.dead(p)) continue;
      const int64_t silent = now - owner_.last_heard_ns(p);
      if (silent > worst_silent) worst = p, worst_silent = silent;
    }
    if (worst >= 0)
      owner_.peer_failed(error_info(ErrorKind::kPeerFailure, rank_, worst, "liveness",
                             "no message or heartbeat for " + std::to_string(worst_silent / 1000000) +
                                 " ms (the process died or its proxy is stuck)"));
  }
}

void ProxyThread::protocol_error(int peer, const std::string& detail) {
  owner_.fail(error_info(ErrorKind::kPeerProtocolError, rank_, peer, "proxy thread " + std::to_string(index_), detail));
}

}  // namespace proxy
}  // namespace uccl_ep
