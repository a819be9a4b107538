// `<local>+<remote>` transport, e.g. `ipc+fabric`: peers of this rank's node through <local> (the
// copy engine over NVLink), peers of other nodes through <remote> (the NIC). Node of rank r =
// r / Options::ranks_per_node, the proxy's node layout.
//
// Both halves register the same region, publish their own blobs (packed here as two length-prefixed
// parts) and connect to their own peers only: the other half gets an empty address and key for
// those ranks, which ipc and fabric take as "not mine" (a write there is refused). A write goes to
// the half that owns the peer; poll() drains both, local first. Per-peer order is the owning half's
// (Caps::ordered only when both halves order), so the proxy's sequencing covers either.
//
// NOTES: why not the NIC for every peer: inside a node the second hop of internode normal mode and
// same-node low-latency traffic would then cross the NIC (loopback) instead of NVLink; DeepEP and
// UCCL-EP keep intra-node traffic on NVLink. Why not ipc in the kernels directly (NVLink stores):
// that is the NVLink path's job; this keeps every proxy path on one command protocol.
#include <algorithm>

#include "transport/transport.h"
#include "transport/wire.h"

namespace uccl_ep {
namespace transport {

namespace {

Bytes pack(const Bytes& a, const Bytes& b) {
  Bytes out;
  put_u64(out, a.size());
  out.insert(out.end(), a.begin(), a.end());
  put_u64(out, b.size());
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

void unpack(const Bytes& blob, Bytes* a, Bytes* b, const std::string& what) {
  auto part = [&](size_t at, Bytes* out) -> size_t {
    if (blob.size() < at + 8) throw TransportError("split transport: truncated " + what);
    const uint64_t n = get_u64(blob, at);
    if (blob.size() - at - 8 < n) throw TransportError("split transport: truncated " + what);
    out->assign(blob.begin() + long(at + 8), blob.begin() + long(at + 8 + n));
    return at + 8 + n;
  };
  if (part(part(0, a), b) != blob.size()) throw TransportError("split transport: trailing bytes in " + what);
}

class SplitTransport final : public Transport {
 public:
  SplitTransport(std::unique_ptr<Transport> local, std::unique_ptr<Transport> remote, const Options& opt)
      : local_(std::move(local)), remote_(std::move(remote)), opt_(opt) {
    if (opt_.ranks_per_node < 1) throw TransportError("split transport: ranks_per_node must be >= 1");
  }

  std::string name() const override { return local_->name() + "+" + remote_->name(); }
  std::string device() const override { return remote_->device(); }
  Caps caps() const override {
    const Caps a = local_->caps(), b = remote_->caps();
    Caps c;
    c.ordered = a.ordered && b.ordered;
    c.remote_bounds_checked = a.remote_bounds_checked && b.remote_bounds_checked;
    c.max_write_bytes = std::min(a.max_write_bytes, b.max_write_bytes);
    c.max_outstanding = std::min(a.max_outstanding, b.max_outstanding);
    return c;
  }

  void register_region(void* base, uint64_t bytes) override {
    local_->register_region(base, bytes);
    remote_->register_region(base, bytes);
  }
  Bytes local_address() override { return pack(local_->local_address(), remote_->local_address()); }
  Bytes region_key() override { return pack(local_->region_key(), remote_->region_key()); }

  void connect(const std::vector<Bytes>& addresses, const std::vector<Bytes>& keys,
               const std::vector<uint64_t>& region_bytes) override {
    const size_t n = addresses.size();
    std::vector<Bytes> la(n), lk(n), ra(n), rk(n);
    for (size_t r = 0; r < n; ++r) {
      Bytes a_local, a_remote, k_local, k_remote;
      unpack(addresses[r], &a_local, &a_remote, "address of rank " + std::to_string(r));
      unpack(keys[r], &k_local, &k_remote, "region key of rank " + std::to_string(r));
      if (is_local(int(r))) {
        la[r] = std::move(a_local), lk[r] = std::move(k_local);
      } else {
        ra[r] = std::move(a_remote), rk[r] = std::move(k_remote);
      }
    }
    local_->connect(la, lk, region_bytes);
    remote_->connect(ra, rk, region_bytes);
  }

  PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm, uint32_t imm,
                   uint64_t ctx, std::string* error) override {
    return (is_local(peer) ? local_ : remote_)->write(peer, local_off, remote_off, len, has_imm, imm, ctx, error);
  }

  PostResult write_control(int peer, uint64_t remote_off, bool has_imm, uint32_t imm, uint64_t ctx,
                           std::string* error) override {
    return (is_local(peer) ? local_ : remote_)->write_control(peer, remote_off, has_imm, imm, ctx, error);
  }

  PostResult discard(int peer, uint64_t len, std::string* error) override {
    return (is_local(peer) ? local_ : remote_)->discard(peer, len, error);
  }

  size_t poll(std::vector<Completion>& out, size_t max) override {
    const size_t n = local_->poll(out, max);
    return n < max ? n + remote_->poll(out, max - n) : n;
  }

  void finalize_setup() override {
    local_->finalize_setup();
    remote_->finalize_setup();
  }
  void shutdown() override {
    local_->shutdown();
    remote_->shutdown();
  }
  std::vector<int64_t> trace() const override {  // the two endpoints' events one after the other
    std::vector<int64_t> t = local_->trace();
    const std::vector<int64_t> r = remote_->trace();
    t.insert(t.end(), r.begin(), r.end());
    return t;
  }
  std::vector<std::pair<std::string, uint64_t>> counters() const override {
    auto c = local_->counters();
    for (auto& kv : remote_->counters()) c.push_back(kv);
    return c;
  }

 private:
  bool is_local(int peer) const { return peer / opt_.ranks_per_node == opt_.rank / opt_.ranks_per_node; }

  std::unique_ptr<Transport> local_, remote_;
  Options opt_;
};

}  // namespace

std::unique_ptr<Transport> make_split(std::unique_ptr<Transport> local, std::unique_ptr<Transport> remote,
                                      const Options& options) {
  return std::make_unique<SplitTransport>(std::move(local), std::move(remote), options);
}

}  // namespace transport
}  // namespace uccl_ep
