// `ipc` transport: the sending proxy copies into the receiver's region, then delivers the
// immediate through the receiver's inbox (see ipc.h for the picture and the two copy engines).
//
// Every endpoint (rank r, proxy thread t) owns an inbox in named shared memory: a ring of
// records {remote range, immediate, source rank} appended by the senders (thread t of every
// rank) with a CAS on the ring head, consumed by the owner's poll(). A record is appended only
// after the copy it describes completed, so a receiver that sees the immediate sees the bytes;
// the local completion (kLocalDone) follows the append, the strongest RDMA semantics.
//
// Per peer, operations stay in posting order (copies complete in order on the peer's stream or
// the host worker's queue; records are appended in order), so Caps::ordered holds. A full inbox
// (a slow or dead receiver) holds back only the records for that receiver. The sender checks
// both ranges before copying (a copy cannot be refused after the fact) and still appends the record
// of a write outside the receiver's region, without bytes; the receiver checks every record's range
// against its region and names the writer.
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>

#include "runtime/cuda_driver.h"
#include "transport/ipc.h"
#include "transport/shm.h"
#include "transport/transport.h"
#include "transport/wire.h"
#include "uccl_ep/dma_ring.h"

namespace uccl_ep {
namespace transport {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace cu = runtime::cu;

constexpr uint64_t kMagic = 0x3130435049455555ull;  // "UUEIPC01"
constexpr uint64_t kInboxCapacity = 8192;            // records per endpoint (power of two)
constexpr uint64_t kModeHost = 0, kModeDevice = 1;
constexpr size_t kLine = 64;

struct Record {
  uint64_t remote_off;  // where the bytes landed in the receiver's region
  uint64_t len;
  uint64_t meta;        // [0,32) imm  [32,48) source rank  [48] has_imm  [63] commit (lap parity)
  uint64_t appended_ns; // sender's steady clock at append (one clock per host): inbox latency diagnostics
};
static_assert(sizeof(Record) == 32, "ipc record must stay 32 bytes");

struct Header {
  uint64_t magic;
  uint64_t num_ranks;
  alignas(kLine) uint64_t head;  // senders reserve records here (CAS)
  alignas(kLine) uint64_t tail;  // the owner consumed every record below
};

size_t inbox_bytes() { return sizeof(Header) + kInboxCapacity * sizeof(Record); }
uint64_t commit_of(uint64_t idx) { return ((idx / kInboxCapacity) & 1) ^ 1; }

struct Inbox {
  Header* hdr = nullptr;
  Record* ring = nullptr;
  void bind(void* base) {
    hdr = static_cast<Header*>(base);
    ring = reinterpret_cast<Record*>(static_cast<uint8_t*>(base) + sizeof(Header));
  }
};

std::string range_text(uint64_t off, uint64_t len) { return "[" + std::to_string(off) + ", +" + std::to_string(len) + ")"; }

class IpcTransport final : public Transport {
 public:
  explicit IpcTransport(const Options& opt) : opt_(opt) {
    if (!opt.ipc_copy.empty() && opt.ipc_copy != "kernel")
      throw TransportError("ipc: unknown copy engine '" + opt.ipc_copy + "' (expected \"kernel\" or none)");
    if (kernel_copies() && opt.max_outstanding > kDmaRingCapacity)
      throw TransportError("ipc: " + std::to_string(opt.max_outstanding) + " outstanding writes exceed the copy ring's " +
                           std::to_string(kDmaRingCapacity) + " descriptors");
    inbox_ = ShmObject::create(shm_name(opt.job_key, "r" + std::to_string(opt.rank) + "_t" +
                                                         std::to_string(opt.thread_index) + "_ipc"),
                               inbox_bytes());
    mine_.bind(inbox_->data());
    mine_.hdr->num_ranks = uint64_t(opt.num_ranks);
    // release: peers that map the inbox after connect see a complete header.
    __atomic_store_n(&mine_.hdr->magic, kMagic, __ATOMIC_RELEASE);
  }

  ~IpcTransport() override {
    engine_.reset();  // drains copies still in flight into peers' memory before it is closed
    for (Peer& p : peers_)
      if (!p.handle.empty()) ipc::close_peer_memory(device_, p.handle);
  }

  std::string name() const override { return "ipc:" + kind_; }
  std::vector<uint64_t> copy_ring() const override { return engine_ ? engine_->ring() : std::vector<uint64_t>{}; }
  Caps caps() const override {
    Caps c;
    c.ordered = true;
    c.remote_bounds_checked = true;
    c.max_write_bytes = ~uint64_t(0);
    c.max_outstanding = opt_.max_outstanding;
    return c;
  }

  void register_region(void* base, uint64_t bytes) override {
    region_ = static_cast<uint8_t*>(base);
    region_bytes_ = bytes;
    const uint64_t addr = reinterpret_cast<uint64_t>(base);
    std::string why;
    const bool device = cu::available(&why) && cu::pointer_memory_type(addr) == cu::kMemoryTypeDevice;
    put_u64(key_, device ? kModeDevice : kModeHost);
    put_u64(key_, bytes);
    if (device) {
      device_ = cu::pointer_device(addr);
      cu::CUdeviceptr alloc = 0;
      size_t alloc_bytes = 0;
      try {
        cu::mem_address_range(addr, &alloc, &alloc_bytes);
        const cu::CUipcMemHandle h = cu::ipc_get_handle(device_, alloc);
        put_u64(key_, uint64_t(device_));
        put_u64(key_, addr - alloc);
        put_u64(key_, uint64_t(getpid()));
        put_u64(key_, addr);
        key_.insert(key_.end(), h.reserved, h.reserved + sizeof h.reserved);
      } catch (const std::exception& e) {
        throw TransportError(std::string("ipc: cannot export the device region: ") + e.what());
      }
      engine_ = kernel_copies() ? ipc::make_kernel_engine(opt_.num_ranks) : ipc::make_cuda_engine(device_, opt_.num_ranks);
      kind_ = engine_->kind();
    } else {
      if (opt_.region_name.empty())
        throw TransportError("ipc: the region is neither CUDA device memory nor host memory in named shared "
                             "memory (host regions must be allocated by the proxy)");
      key_.insert(key_.end(), opt_.region_name.begin(), opt_.region_name.end());
      engine_ = kernel_copies() ? ipc::make_kernel_engine(opt_.num_ranks) : ipc::make_host_engine(opt_.num_ranks);
      kind_ = engine_->kind();
    }
  }

  Bytes local_address() override {
    Bytes b;
    put_u64(b, uint64_t(opt_.num_ranks));
    b.insert(b.end(), inbox_->name().begin(), inbox_->name().end());
    return b;
  }
  Bytes region_key() override { return key_; }

  void connect(const std::vector<Bytes>& addresses, const std::vector<Bytes>& keys,
               const std::vector<uint64_t>& region_bytes) override {
    peers_.resize(addresses.size());
    posted_to_.reset(new std::atomic<uint64_t>[addresses.size()]);
    delivered_to_.reset(new std::atomic<uint64_t>[addresses.size()]);
    bytes_to_.reset(new std::atomic<uint64_t>[addresses.size()]);
    for (size_t r = 0; r < addresses.size(); ++r) {
      posted_to_[r].store(0, std::memory_order_relaxed);
      delivered_to_[r].store(0, std::memory_order_relaxed);
      bytes_to_[r].store(0, std::memory_order_relaxed);
    }
    for (size_t r = 0; r < addresses.size(); ++r) {
      Peer& p = peers_[r];
      const std::string who = "rank " + std::to_string(r);
      if (addresses[r].empty() && keys[r].empty() && int(r) != opt_.rank) {
        p.served = false;  // a split transport's other half reaches this rank
        continue;
      }
      if (addresses[r].size() < 9 || keys[r].size() < 17) throw TransportError("ipc: malformed blob of " + who);
      const uint64_t mode = get_u64(keys[r], 0);
      p.bytes = get_u64(keys[r], 8);
      if (get_u64(addresses[r], 0) != uint64_t(opt_.num_ranks) || p.bytes != region_bytes[r])
        throw TransportError("ipc: " + who + " announced a different group or region size");
      if (mode != get_u64(key_, 0))
        throw TransportError("ipc: " + who + " registered " + (mode == kModeDevice ? "device" : "host") +
                             " memory, this rank the other kind; every rank must use the same");
      if (int(r) == opt_.rank) {
        p.inbox = mine_;
        p.base = reinterpret_cast<uint64_t>(region_);
        continue;
      }
      const std::string inbox_name(addresses[r].begin() + 8, addresses[r].end());
      p.inbox_shm = ShmObject::open(inbox_name, inbox_bytes());
      p.inbox.bind(p.inbox_shm->data());
      // acquire: pairs with the owner's release of magic.
      if (__atomic_load_n(&p.inbox.hdr->magic, __ATOMIC_ACQUIRE) != kMagic)
        throw TransportError("ipc: inbox '" + inbox_name + "' of " + who + " is not initialised");
      if (mode == kModeHost) {
        p.region_shm = ShmObject::open(std::string(keys[r].begin() + 16, keys[r].end()), p.bytes);
        p.base = reinterpret_cast<uint64_t>(p.region_shm->data());
      } else {
        if (keys[r].size() != 48 + sizeof(cu::CUipcMemHandle)) throw TransportError("ipc: malformed key of " + who);
        const uint64_t offset = get_u64(keys[r], 24), pid = get_u64(keys[r], 32), addr = get_u64(keys[r], 40);
        if (pid == uint64_t(getpid())) {
          p.base = addr;  // a rank of this very process (tests): CUDA cannot open its own handle
        } else {
          std::string err;
          const std::string handle(keys[r].begin() + 48, keys[r].end());
          const uint64_t mapped = ipc::open_peer_memory(device_, handle, &err);
          if (mapped == 0) throw TransportError("ipc: cannot open the device region of " + who + ": " + err);
          p.handle = handle;
          p.base = mapped + offset;
        }
      }
    }
  }

  void finalize_setup() override { inbox_->unlink(); }

  // The copy engine's helper thread (host) or streams (CUDA) go with the proxy thread; copies in
  // flight finish first (the engines drain on destruction).
  void shutdown() override { engine_.reset(); }

  PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm, uint32_t imm,
                   uint64_t ctx, std::string* error) override {
    const PostResult ready = can_post(peer, error);
    if (ready != PostResult::kOk) return ready;
    Peer& p = peers_[size_t(peer)];
    std::string bad;
    if (local_off > region_bytes_ || len > region_bytes_ - local_off)
      bad = "ipc: source range " + range_text(local_off, len) + " is outside this rank's region of " +
            std::to_string(region_bytes_) + " bytes";
    else if (remote_off > p.bytes || len > p.bytes - remote_off)
      bad = "rank " + std::to_string(peer) + " refused the write: target range " + range_text(remote_off, len) +
            " is outside its region of " + std::to_string(p.bytes) + " bytes (checked by ipc before copying)";
    if (!bad.empty()) {
      // Posted and failed, as a NIC reports a remote access error: the proxy sees it in poll().
      decided_.push_back({Completion::kLocalError, peer, 0, ctx, EFAULT, bad});
      ++outstanding_;
      // The receiver gets the record too, without bytes (nothing is copied): its own range check
      // refuses it and names this rank instead of waiting for a write that never comes.
      if (remote_off > p.bytes || len > p.bytes - remote_off) {
        if (p.pending.empty()) active_.push_back(peer);
        p.pending.push_back({0, remote_off, len, imm, has_imm, p.submitted, now_ns(), true});
      }
      return PostResult::kOk;
    }
    const int64_t posted_ns = now_ns();
    if (len > 0) {
      if (!engine_->submit(peer, p.base + remote_off, reinterpret_cast<uint64_t>(region_) + local_off, len, error))
        return PostResult::kError;
      submit_ns_.fetch_add(uint64_t(now_ns() - posted_ns), std::memory_order_relaxed);
      ++p.submitted;
      copies_.fetch_add(1, std::memory_order_relaxed);
      copy_bytes_.fetch_add(len, std::memory_order_relaxed);
    }
    if (p.pending.empty()) active_.push_back(peer);
    posted_to_[size_t(peer)].fetch_add(1, std::memory_order_relaxed);
    // A write without bytes (control message) waits behind the copies before it: order per peer.
    p.pending.push_back({ctx, remote_off, len, imm, has_imm, p.submitted, posted_ns, false});
    ++outstanding_;
    return PostResult::kOk;
  }

  // Appended to the receiver's inbox at once, ahead of this endpoint's copies still in flight to it
  // (as an unordered NIC may deliver it); in order behind them when the inbox is full or the range
  // is bad (write() reports it).
  PostResult write_control(int peer, uint64_t remote_off, bool has_imm, uint32_t imm, uint64_t ctx,
                           std::string* error) override {
    const PostResult ready = can_post(peer, error);
    if (ready != PostResult::kOk) return ready;
    Peer& p = peers_[size_t(peer)];
    const Op op{ctx, remote_off, 0, imm, has_imm, 0, now_ns(), false};
    if (remote_off > p.bytes || !append(p, op)) return write(peer, 0, remote_off, 0, has_imm, imm, ctx, error);
    posted_to_[size_t(peer)].fetch_add(1, std::memory_order_relaxed);
    delivered_to_[size_t(peer)].fetch_add(1, std::memory_order_relaxed);
    controls_ahead_.fetch_add(p.pending.empty() ? 0 : 1, std::memory_order_relaxed);
    decided_.push_back({Completion::kLocalDone, peer, 0, ctx, 0, {}});
    ++outstanding_;
    return PostResult::kOk;
  }

  // NOTES: with the "kernel" engine the copy kernels count the bytes of every Write pushed to this
  // proxy thread and wait for descriptors covering them; a Write the proxy drops (its target failed)
  // becomes a skip descriptor, queued in order with the peer's copies and bounded like them
  // (outstanding until the consumer passed it), so nothing waits for bytes that never come.
  PostResult discard(int peer, uint64_t len, std::string* error) override {
    if (!kernel_copies() || len == 0) return PostResult::kOk;  // no consumer counts these bytes
    if (engine_ == nullptr || peer < 0 || size_t(peer) >= peers_.size()) {
      if (error)
        *error = engine_ == nullptr ? "ipc: the endpoint was shut down" : "ipc: no such peer " + std::to_string(peer);
      return PostResult::kError;
    }
    bind_thread();
    if (outstanding_ >= opt_.max_outstanding) return PostResult::kAgain;
    Peer& p = peers_[size_t(peer)];
    if (!engine_->skip(peer, len, error)) return PostResult::kError;
    ++p.submitted;
    if (p.pending.empty()) active_.push_back(peer);
    Op op{0, 0, len, 0, false, p.submitted, now_ns(), false};
    op.skipped = true;
    p.pending.push_back(op);
    ++outstanding_;
    return PostResult::kOk;
  }

  size_t poll(std::vector<Completion>& out, size_t max) override {
    if (engine_ == nullptr) return 0;
    bind_thread();
    size_t n = receive(out, max);
    while (n < max && !decided_.empty()) {
      out.push_back(std::move(decided_.front()));
      decided_.pop_front();
      --outstanding_;
      ++n;
    }
    return n + deliver(out, max - n);
  }

  std::vector<std::pair<std::string, uint64_t>> counters() const override {
    std::vector<std::pair<std::string, uint64_t>> out{{"ipc_" + kind_ + "_copies", copies_.load(std::memory_order_relaxed)},
            {"ipc_copy_bytes", copy_bytes_.load(std::memory_order_relaxed)},
            {"ipc_inbox_full", inbox_full_.load(std::memory_order_relaxed)},
            {"ipc_controls_ahead", controls_ahead_.load(std::memory_order_relaxed)}};
    // Diagnostics: time in the copy engine's submit call, and from posting to delivery (copy done
    // and the record in the receiver's inbox), summed over writes; divide by the delivered count.
    out.push_back({"ipc_submit_ns", submit_ns_.load(std::memory_order_relaxed)});
    out.push_back({"ipc_post_to_deliver_ns", deliver_ns_.load(std::memory_order_relaxed)});
    // Diagnostics: records taken from our inbox and their summed time there (sender's append to our
    // read: the hand-off between the two proxies).
    out.push_back({"ipc_received", received_.load(std::memory_order_relaxed)});
    out.push_back({"ipc_inbox_ns", inbox_ns_.load(std::memory_order_relaxed)});
    if (engine_ != nullptr)
      for (auto& kv : engine_->counters()) out.push_back(std::move(kv));
    // Diagnostics: per destination rank, writes posted and writes delivered (copy completed and
    // its record appended to the receiver's inbox; control messages such as heartbeats included),
    // and the payload bytes delivered (data Writes only); a gap that stays says which copies stall.
    for (size_t r = 0; r < peers_.size() && posted_to_ != nullptr; ++r) {
      out.push_back({"ipc_posted_to_" + std::to_string(r), posted_to_[r].load(std::memory_order_relaxed)});
      out.push_back({"ipc_delivered_to_" + std::to_string(r), delivered_to_[r].load(std::memory_order_relaxed)});
      out.push_back({"ipc_bytes_to_" + std::to_string(r), bytes_to_[r].load(std::memory_order_relaxed)});
    }
    return out;
  }

 private:
  struct Op {
    uint64_t ctx, remote_off, len;
    uint32_t imm;
    bool has_imm;
    int64_t after;  // deliverable once this many copies to the peer completed
    int64_t posted_ns;  // steady clock at posting (diagnostics: post -> delivery time)
    bool refused;       // the record of a refused write: delivered for the receiver's check only
    bool skipped = false;  // a dropped write's skip descriptor (discard): no record, no completion
  };
  struct Peer {
    std::unique_ptr<ShmObject> inbox_shm, region_shm;
    Inbox inbox;
    uint64_t base = 0;      // the peer's region as this process addresses it
    uint64_t bytes = 0;
    std::string handle;     // CUDA IPC handle we opened ("" = none)
    int64_t submitted = 0;  // copies submitted to this peer
    std::deque<Op> pending; // posted, not yet delivered, in posting order
    bool served = true;     // false: another transport reaches this rank (split transport)
  };

  bool kernel_copies() const { return opt_.ipc_copy == "kernel"; }

  // kOk when a write to `peer` can be posted now; kAgain at the outstanding limit; else the error.
  PostResult can_post(int peer, std::string* error) {
    if (peer < 0 || size_t(peer) >= peers_.size()) {
      if (error) *error = "ipc: no such peer " + std::to_string(peer);
      return PostResult::kError;
    }
    if (engine_ == nullptr) {
      if (error) *error = "ipc: the endpoint was shut down";
      return PostResult::kError;
    }
    if (!peers_[size_t(peer)].served) {
      if (error) *error = "ipc: rank " + std::to_string(peer) + " is not reached through ipc (another node)";
      return PostResult::kError;
    }
    bind_thread();
    return outstanding_ >= opt_.max_outstanding ? PostResult::kAgain : PostResult::kOk;
  }

  void bind_thread() {
    if (bound_ == std::this_thread::get_id()) return;
    engine_->bind_thread();
    bound_ = std::this_thread::get_id();
  }

  // Appends one record to a peer's inbox; false when it is full.
  bool append(Peer& p, const Op& op) {
    Header* h = p.inbox.hdr;
    // relaxed: the CAS decides.
    uint64_t idx = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
    for (;;) {
      // acquire: pairs with the owner's release of tail; it finished reading the old record.
      if (idx - __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE) >= kInboxCapacity) return false;
      // relaxed: reservation only; the record is published by the release store of meta.
      if (__atomic_compare_exchange_n(&h->head, &idx, idx + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
    }
    Record& rec = p.inbox.ring[idx & (kInboxCapacity - 1)];
    rec.remote_off = op.remote_off;
    rec.len = op.len;
    rec.appended_ns = uint64_t(now_ns());
    const uint64_t meta = uint64_t(op.imm) | (uint64_t(uint16_t(opt_.rank)) << 32) |
                          (uint64_t(op.has_imm ? 1 : 0) << 48) | (commit_of(idx) << 63);
    // release: the record fields -- and, transitively, the completed copy we acquired from the
    // engine -- are visible to the owner before the commit bit.
    __atomic_store_n(&rec.meta, meta, __ATOMIC_RELEASE);
    return true;
  }

  // Copies that completed become records in their receivers' inboxes, then local completions.
  size_t deliver(std::vector<Completion>& out, size_t max) {
    size_t n = 0;
    for (size_t i = 0; i < active_.size() && n < max;) {
      const int peer = active_[i];
      Peer& p = peers_[size_t(peer)];
      std::string err;
      const int64_t done = engine_->completed(peer, &err);
      if (done < 0) {  // the copy engine failed: every op to this peer fails with it
        for (const Op& op : p.pending) {
          if (op.skipped) --outstanding_;
          if (op.refused || op.skipped) continue;
          out.push_back({Completion::kLocalError, peer, 0, op.ctx, EIO, err});
          ++n;
          --outstanding_;
        }
        p.pending.clear();
      }
      while (!p.pending.empty() && p.pending.front().after <= done && n < max) {
        if (p.pending.front().skipped) {  // the consumer passed it; nothing to deliver
          p.pending.pop_front();
          --outstanding_;
          continue;
        }
        if (!append(p, p.pending.front())) {
          inbox_full_.fetch_add(1, std::memory_order_relaxed);
          break;  // this receiver is behind; the others still go
        }
        if (p.pending.front().refused) {  // reported to the writer at posting (decided_)
          p.pending.pop_front();
          continue;
        }
        out.push_back({Completion::kLocalDone, peer, 0, p.pending.front().ctx, 0, {}});
        deliver_ns_.fetch_add(uint64_t(now_ns() - p.pending.front().posted_ns), std::memory_order_relaxed);
        bytes_to_[size_t(peer)].fetch_add(p.pending.front().len, std::memory_order_relaxed);
        p.pending.pop_front();
        delivered_to_[size_t(peer)].fetch_add(1, std::memory_order_relaxed);
        --outstanding_;
        ++n;
      }
      if (p.pending.empty()) {
        active_[i] = active_.back();
        active_.pop_back();
      } else {
        ++i;
      }
    }
    return n;
  }

  // Records in our inbox: check the range, report the immediate.
  size_t receive(std::vector<Completion>& out, size_t max) {
    size_t n = 0;
    while (n < max) {
      Record& rec = mine_.ring[consumed_ & (kInboxCapacity - 1)];
      // acquire: pairs with the sender's release of meta (record fields and the copied bytes).
      const uint64_t meta = __atomic_load_n(&rec.meta, __ATOMIC_ACQUIRE);
      if ((meta >> 63) != commit_of(consumed_)) break;
      const int src = int((meta >> 32) & 0xFFFF);
      const uint64_t roff = rec.remote_off, len = rec.len;
      const int64_t waited = now_ns() - int64_t(rec.appended_ns);
      if (waited > 0) inbox_ns_.fetch_add(uint64_t(waited), std::memory_order_relaxed);
      received_.fetch_add(1, std::memory_order_relaxed);
      ++consumed_;
      // release: we are done with the record; a sender may reuse it.
      __atomic_store_n(&mine_.hdr->tail, consumed_, __ATOMIC_RELEASE);
      ++n;
      if (src >= int(peers_.size())) {
        out.push_back({Completion::kRemoteError, -1, 0, 0, EPROTO, "ipc: record from unknown source rank " + std::to_string(src)});
      } else if (roff > region_bytes_ || len > region_bytes_ - roff) {
        out.push_back({Completion::kRemoteError, src, 0, 0, EFAULT,
                       "ipc: rank " + std::to_string(src) + " reported a write to " + range_text(roff, len) +
                           ", outside this rank's region of " + std::to_string(region_bytes_) + " bytes"});
      } else if (((meta >> 48) & 1) != 0) {
        out.push_back({Completion::kRemoteImm, src, uint32_t(meta), 0, 0, {}});
      } else {
        --n;  // a write without immediate leaves no trace at the receiver (as RDMA)
      }
    }
    return n;
  }

  Options opt_;
  std::unique_ptr<ShmObject> inbox_;
  Inbox mine_;
  uint8_t* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  int device_ = -1;  // >= 0: device regions (CUDA copy engine)
  std::string kind_ = "none";
  Bytes key_;
  std::vector<Peer> peers_;
  std::vector<int> active_;       // peers with pending ops
  std::deque<Completion> decided_;  // completions known at posting (refused ops, controls sent ahead)
  uint32_t outstanding_ = 0;
  uint64_t consumed_ = 0;
  std::thread::id bound_;
  std::atomic<uint64_t> copies_{0}, copy_bytes_{0}, inbox_full_{0};
  std::atomic<uint64_t> controls_ahead_{0};  // write_control() messages delivered ahead of copies in flight
  std::unique_ptr<std::atomic<uint64_t>[]> posted_to_, delivered_to_, bytes_to_;  // per destination rank
  std::atomic<uint64_t> submit_ns_{0}, deliver_ns_{0}, received_{0}, inbox_ns_{0};
  std::unique_ptr<ipc::CopyEngine> engine_;  // last: destroyed first (see the destructor)
};

}  // namespace

std::unique_ptr<Transport> make_ipc(const Options& options) { return std::make_unique<IpcTransport>(options); }

std::string ipc_unavailable_reason() {
  if (access("/dev/shm", W_OK) != 0) return "ipc transport needs a writable /dev/shm (its inboxes live there)";
  return "";
}

}  // namespace transport
}  // namespace uccl_ep
