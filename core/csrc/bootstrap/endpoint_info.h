// What one rank publishes at bootstrap (through the torch.distributed Store, see
// uccl_ep/proxy/bootstrap.py) and how a peer's publication is checked before we connect to it.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

namespace uccl_ep {
namespace bootstrap {

using Bytes = std::vector<uint8_t>;

struct EndpointInfo {
  uint32_t protocol_version = 0;
  std::string token_digest;  // hex SHA-256-class digest of the job token (never the token)
  int32_t rank = -1;
  int32_t num_ranks = 0;
  int32_t ranks_per_node = 0;
  int32_t num_threads = 0;
  uint32_t num_counters = 0;
  uint64_t region_bytes = 0;
  std::string transport;            // backend name as configured ("loop", "fault:fabric", ...)
  std::vector<Bytes> addresses;     // per proxy thread: transport endpoint name
  std::vector<Bytes> keys;          // per proxy thread: opaque region key
};

Bytes serialize(const EndpointInfo& info);
// Throws std::runtime_error("malformed ...") on a truncated or foreign blob.
EndpointInfo parse(const Bytes& blob);

// Why `peer` (published by rank `expected_rank`) cannot join `mine`, or "" when it can.
// A different token is reported first: it means another job, not a bug in this one.
std::string incompatibility(const EndpointInfo& mine, const EndpointInfo& peer, int expected_rank);

}  // namespace bootstrap
}  // namespace uccl_ep
