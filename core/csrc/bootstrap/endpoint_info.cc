#include "bootstrap/endpoint_info.h"

#include <stdexcept>

namespace uccl_ep {
namespace bootstrap {

namespace {

constexpr uint32_t kMagic = 0x31504555;  // "UEP1"

struct Writer {
  Bytes out;
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
  }
  void bytes(const Bytes& b) {
    u32(uint32_t(b.size()));
    out.insert(out.end(), b.begin(), b.end());
  }
  void str(const std::string& s) { bytes(Bytes(s.begin(), s.end())); }
};

struct Reader {
  const Bytes& in;
  size_t at = 0;
  void need(size_t n) {
    if (in.size() - at < n) throw std::runtime_error("malformed endpoint info: truncated at byte " + std::to_string(at));
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(in[at++]) << (8 * i);
    return v;
  }
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(in[at++]) << (8 * i);
    return v;
  }
  Bytes bytes() {
    const uint32_t n = u32();
    need(n);
    Bytes b(in.begin() + long(at), in.begin() + long(at + n));
    at += n;
    return b;
  }
  std::string str() {
    Bytes b = bytes();
    return std::string(b.begin(), b.end());
  }
};

}  // namespace

Bytes serialize(const EndpointInfo& info) {
  Writer w;
  w.u32(kMagic);
  w.u32(info.protocol_version);
  w.str(info.token_digest);
  w.u32(uint32_t(info.rank));
  w.u32(uint32_t(info.num_ranks));
  w.u32(uint32_t(info.ranks_per_node));
  w.u32(uint32_t(info.num_threads));
  w.u32(info.num_counters);
  w.u64(info.region_bytes);
  w.str(info.transport);
  w.u32(uint32_t(info.addresses.size()));
  for (size_t i = 0; i < info.addresses.size(); ++i) {
    w.bytes(info.addresses[i]);
    w.bytes(info.keys.at(i));
  }
  return w.out;
}

EndpointInfo parse(const Bytes& blob) {
  Reader r{blob};
  if (r.u32() != kMagic) throw std::runtime_error("malformed endpoint info: not a uccl_ep bootstrap record");
  EndpointInfo info;
  info.protocol_version = r.u32();
  info.token_digest = r.str();
  info.rank = int32_t(r.u32());
  info.num_ranks = int32_t(r.u32());
  info.ranks_per_node = int32_t(r.u32());
  info.num_threads = int32_t(r.u32());
  info.num_counters = r.u32();
  info.region_bytes = r.u64();
  info.transport = r.str();
  const uint32_t n = r.u32();
  if (n > 4096) throw std::runtime_error("malformed endpoint info: " + std::to_string(n) + " endpoints");
  for (uint32_t i = 0; i < n; ++i) {
    info.addresses.push_back(r.bytes());
    info.keys.push_back(r.bytes());
  }
  if (r.at != blob.size()) throw std::runtime_error("malformed endpoint info: trailing bytes");
  return info;
}

std::string incompatibility(const EndpointInfo& mine, const EndpointInfo& peer, int expected_rank) {
  const std::string who = "rank " + std::to_string(expected_rank);
  if (peer.token_digest != mine.token_digest)
    return who + " presented a different job token (another job, or UCCL_EP_JOB_TOKEN differs between ranks)";
  if (peer.protocol_version != mine.protocol_version)
    return who + " speaks uccl_ep protocol " + std::to_string(peer.protocol_version) + ", this rank " +
           std::to_string(mine.protocol_version) + " (mixed uccl_ep versions)";
  auto differs = [&](const char* what, long a, long b) {
    return who + " has " + what + " = " + std::to_string(b) + ", this rank " + std::to_string(a);
  };
  if (peer.rank != expected_rank) return who + "'s record claims rank " + std::to_string(peer.rank);
  if (peer.num_ranks != mine.num_ranks) return differs("num_ranks", mine.num_ranks, peer.num_ranks);
  if (peer.ranks_per_node != mine.ranks_per_node) return differs("ranks_per_node", mine.ranks_per_node, peer.ranks_per_node);
  if (peer.num_threads != mine.num_threads) return differs("proxy threads", mine.num_threads, peer.num_threads);
  if (peer.num_counters != mine.num_counters) return differs("num_counters", mine.num_counters, peer.num_counters);
  if (peer.transport != mine.transport)
    return who + " uses transport '" + peer.transport + "', this rank '" + mine.transport + "'";
  if (peer.addresses.size() != size_t(peer.num_threads) || peer.keys.size() != size_t(peer.num_threads))
    return who + " published " + std::to_string(peer.addresses.size()) + " endpoints for " +
           std::to_string(peer.num_threads) + " threads";
  return "";
}

}  // namespace bootstrap
}  // namespace uccl_ep
