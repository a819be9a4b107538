// Little-endian integers in opaque byte blobs (addresses, region keys) that ranks exchange.
#pragma once

#include <stdint.h>

#include <stdexcept>
#include <vector>

namespace uccl_ep {
namespace transport {

inline void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

// Throws std::out_of_range on a truncated blob.
inline uint64_t get_u64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(b.at(at + i)) << (8 * i);
  return v;
}

}  // namespace transport
}  // namespace uccl_ep
