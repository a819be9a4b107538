// `loop` transport: ranks of one host (or one process) exchange writes through shared memory.
//
// Every endpoint (rank r, proxy thread t) owns a shared-memory object holding an inbound ring of
// write records. A sender appends {source offset, target offset, length, immediate}; the
// receiving endpoint's poll() plays the NIC: it validates the record against both regions,
// copies the bytes, reports the immediate, and acknowledges by bumping the sender's
// `delivered[receiver]` word, which the sender's poll() turns into local completions (in posting
// order per peer). So local completion here means "delivered", the strongest RDMA semantics, and
// the target side checks every offset (Caps::remote_bounds_checked).
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <deque>

#include "transport/shm.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace uccl_ep {
namespace transport {

namespace {

constexpr uint64_t kMagic = 0x3150304f4f4c4555ull;  // "UELOOP01"
constexpr uint64_t kRingCapacity = 8192;             // records per endpoint (power of two)
constexpr size_t kLine = 64;

struct Record {
  uint64_t local_off;   // offset in the sender's region
  uint64_t remote_off;  // offset in the receiver's region
  uint64_t len;
  uint64_t meta;        // [0,32) imm  [32,48) source rank  [48] has_imm  [63] commit (lap parity)
};
static_assert(sizeof(Record) == 32, "loop record must stay 32 bytes");

struct Header {
  uint64_t magic;
  uint64_t num_ranks;
  uint64_t capacity;
  alignas(kLine) uint64_t head;  // senders reserve records here (CAS)
  alignas(kLine) uint64_t tail;  // the owner's poll() consumed everything below
};

// Per-destination acknowledgement words, one cache line each (written by that destination).
struct alignas(kLine) AckLine {
  uint64_t delivered;  // records from this endpoint the destination has processed
  uint64_t rejected;   // 1-based index of the last record it refused (0 = none)
};

size_t endpoint_bytes(uint64_t num_ranks) {
  return sizeof(Header) + kRingCapacity * sizeof(Record) + num_ranks * sizeof(AckLine);
}

uint64_t commit_of(uint64_t idx) { return ((idx / kRingCapacity) & 1) ^ 1; }

struct Mapped {
  Header* hdr = nullptr;
  Record* ring = nullptr;
  AckLine* acks = nullptr;
  void bind(void* base, uint64_t num_ranks) {
    hdr = static_cast<Header*>(base);
    ring = reinterpret_cast<Record*>(static_cast<uint8_t*>(base) + sizeof(Header));
    acks = reinterpret_cast<AckLine*>(ring + kRingCapacity);
    (void)num_ranks;
  }
};

Bytes encode_name(const std::string& name, uint64_t extra) {
  Bytes b;
  put_u64(b, extra);
  b.insert(b.end(), name.begin(), name.end());
  return b;
}
std::string decode_name(const Bytes& b, uint64_t* extra) {
  if (b.size() < 9) throw TransportError("loop: malformed address/key blob");
  *extra = get_u64(b, 0);
  return std::string(b.begin() + 8, b.end());
}

class LoopTransport final : public Transport {
 public:
  explicit LoopTransport(const Options& opt) : opt_(opt) {
    own_ep_ = ShmObject::create(shm_name(opt.job_key, "r" + std::to_string(opt.rank) + "_t" +
                                                          std::to_string(opt.thread_index) + "_loop"),
                                endpoint_bytes(uint64_t(opt.num_ranks)));
    mine_.bind(own_ep_->data(), uint64_t(opt.num_ranks));
    mine_.hdr->num_ranks = uint64_t(opt.num_ranks);
    mine_.hdr->capacity = kRingCapacity;
    // release: peers that map the object after connect see a complete header.
    __atomic_store_n(&mine_.hdr->magic, kMagic, __ATOMIC_RELEASE);
  }

  std::string name() const override { return "loop"; }
  Caps caps() const override {
    Caps c;
    c.ordered = true;
    c.remote_bounds_checked = true;
    c.max_write_bytes = ~uint64_t(0);
    c.max_outstanding = uint32_t(kRingCapacity);
    return c;
  }

  void register_region(void* base, uint64_t bytes) override {
    if (opt_.region_name.empty())
      throw TransportError("loop transport needs the region in shared memory (allocated by the proxy)");
    region_ = static_cast<uint8_t*>(base);
    region_bytes_ = bytes;
  }
  Bytes local_address() override { return encode_name(own_ep_->name(), uint64_t(opt_.num_ranks)); }
  Bytes region_key() override { return encode_name(opt_.region_name, region_bytes_); }

  void connect(const std::vector<Bytes>& addresses, const std::vector<Bytes>& keys,
               const std::vector<uint64_t>& region_bytes) override {
    peers_.resize(addresses.size());
    for (size_t r = 0; r < addresses.size(); ++r) {
      Peer& p = peers_[r];
      uint64_t peer_ranks = 0, key_bytes = 0;
      const std::string ep_name = decode_name(addresses[r], &peer_ranks);
      const std::string region_name = decode_name(keys[r], &key_bytes);
      if (peer_ranks != uint64_t(opt_.num_ranks) || key_bytes != region_bytes[r])
        throw TransportError("loop: rank " + std::to_string(r) + " announced a different group or region size");
      if (int(r) == opt_.rank) {
        p.mapped = mine_;
        p.base = region_;
      } else {
        p.ep = ShmObject::open(ep_name, endpoint_bytes(peer_ranks));
        p.mapped.bind(p.ep->data(), peer_ranks);
        // acquire: pairs with the creator's release of magic.
        if (__atomic_load_n(&p.mapped.hdr->magic, __ATOMIC_ACQUIRE) != kMagic)
          throw TransportError("loop: endpoint '" + ep_name + "' of rank " + std::to_string(r) + " is not initialised");
        p.region = ShmObject::open(region_name, key_bytes);
        p.base = static_cast<uint8_t*>(p.region->data());
      }
      p.bytes = key_bytes;
    }
  }

  void finalize_setup() override { own_ep_->unlink(); }

  PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm, uint32_t imm,
                   uint64_t ctx, std::string* error) override {
    if (peer < 0 || size_t(peer) >= peers_.size()) {
      if (error) *error = "loop: no such peer " + std::to_string(peer);
      return PostResult::kError;
    }
    Peer& p = peers_[size_t(peer)];
    Header* h = p.mapped.hdr;
    // relaxed: the CAS decides.
    uint64_t idx = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
    for (;;) {
      // acquire: pairs with the receiver's release of tail; it finished reading the old record.
      if (idx - __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE) >= kRingCapacity) return PostResult::kAgain;
      // relaxed: reservation only; the record is published by the release store of meta.
      if (__atomic_compare_exchange_n(&h->head, &idx, idx + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
    }
    Record& rec = p.mapped.ring[idx & (kRingCapacity - 1)];
    rec.local_off = local_off;
    rec.remote_off = remote_off;
    rec.len = len;
    const uint64_t meta = uint64_t(imm) | (uint64_t(uint16_t(opt_.rank)) << 32) | (uint64_t(has_imm ? 1 : 0) << 48) |
                          (commit_of(idx) << 63);
    // release: the record fields and our region's source bytes are visible before the commit.
    __atomic_store_n(&rec.meta, meta, __ATOMIC_RELEASE);
    if (p.outstanding.empty()) active_.push_back(peer);
    p.outstanding.push_back(ctx);
    return PostResult::kOk;
  }

  size_t poll(std::vector<Completion>& out, size_t max) override {
    size_t n = receive(out, max);
    return n + retire(out, max - n);
  }

 private:
  struct Peer {
    std::unique_ptr<ShmObject> ep, region;
    Mapped mapped;
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
    uint64_t retired = 0;            // our records to this peer turned into completions
    std::deque<uint64_t> outstanding;  // ctx of each record not yet retired, in posting order
  };

  // Inbound records: validate, copy, acknowledge.
  size_t receive(std::vector<Completion>& out, size_t max) {
    size_t n = 0;
    while (n < max) {
      Record& rec = mine_.ring[consumed_ & (kRingCapacity - 1)];
      // acquire: pairs with the sender's release of meta (record fields and source bytes).
      const uint64_t meta = __atomic_load_n(&rec.meta, __ATOMIC_ACQUIRE);
      if ((meta >> 63) != commit_of(consumed_)) break;
      const int src = int((meta >> 32) & 0xFFFF);
      const bool has_imm = ((meta >> 48) & 1) != 0;
      const uint64_t len = rec.len, loff = rec.local_off, roff = rec.remote_off;
      ++consumed_;
      // release: we are done with the record; a sender may reuse it.
      __atomic_store_n(&mine_.hdr->tail, consumed_, __ATOMIC_RELEASE);
      if (src >= int(peers_.size())) {
        out.push_back({Completion::kRemoteError, -1, 0, 0, EPROTO,
                       "loop: record from unknown source rank " + std::to_string(src)});
        ++n;
        continue;
      }
      Peer& from = peers_[size_t(src)];
      std::string bad;
      if (roff > region_bytes_ || len > region_bytes_ - roff)
        bad = "target range [" + std::to_string(roff) + ", +" + std::to_string(len) + ") is outside this rank's region of " +
              std::to_string(region_bytes_) + " bytes";
      else if (loff > from.bytes || len > from.bytes - loff)
        bad = "source range [" + std::to_string(loff) + ", +" + std::to_string(len) + ") is outside the sender's region of " +
              std::to_string(from.bytes) + " bytes";
      AckLine& ack = from.mapped.acks[opt_.rank];
      if (!bad.empty()) {
        // relaxed: ordered before the release increment of delivered below.
        __atomic_store_n(&ack.rejected, __atomic_load_n(&ack.delivered, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
        out.push_back({Completion::kRemoteError, src, 0, 0, EFAULT, bad});
      } else {
        if (len) memcpy(region_ + roff, from.base + loff, len);
        if (has_imm) out.push_back({Completion::kRemoteImm, src, uint32_t(meta), 0, 0, {}});
      }
      // release: the copy (our reads of the sender's bytes) is done before the sender sees the ack.
      __atomic_fetch_add(&ack.delivered, 1, __ATOMIC_RELEASE);
      ++n;
    }
    return n;
  }

  // Acknowledged records of ours become local completions, in posting order per peer.
  size_t retire(std::vector<Completion>& out, size_t max) {
    size_t n = 0;
    for (size_t i = 0; i < active_.size() && n < max;) {
      const int peer = active_[i];
      Peer& p = peers_[size_t(peer)];
      // acquire: pairs with the receiver's release increment; its copy of our bytes is done.
      const uint64_t delivered = __atomic_load_n(&mine_.acks[peer].delivered, __ATOMIC_ACQUIRE);
      // relaxed: the receiver stores `rejected` before its release increment of `delivered`,
      // which the acquire above synchronizes with.
      const uint64_t rejected = __atomic_load_n(&mine_.acks[peer].rejected, __ATOMIC_RELAXED);
      while (p.retired < delivered && !p.outstanding.empty() && n < max) {
        ++p.retired;
        const uint64_t ctx = p.outstanding.front();
        p.outstanding.pop_front();
        if (rejected == p.retired)
          out.push_back({Completion::kLocalError, peer, 0, ctx, EFAULT, "rank " + std::to_string(peer) +
                                                                            " refused the write (out of bounds)"});
        else
          out.push_back({Completion::kLocalDone, peer, 0, ctx, 0, {}});
        ++n;
      }
      if (p.outstanding.empty()) {
        active_[i] = active_.back();
        active_.pop_back();
      } else {
        ++i;
      }
    }
    return n;
  }

  Options opt_;
  std::unique_ptr<ShmObject> own_ep_;
  Mapped mine_;
  uint8_t* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  std::vector<Peer> peers_;
  std::vector<int> active_;
  uint64_t consumed_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_loop(const Options& options) { return std::make_unique<LoopTransport>(options); }

std::string loop_unavailable_reason() {
  if (access("/dev/shm", W_OK) != 0) return "loop transport needs a writable /dev/shm";
  return "";
}

}  // namespace transport
}  // namespace uccl_ep
