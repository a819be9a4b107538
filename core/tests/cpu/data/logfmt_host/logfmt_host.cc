// Runs the per-lane code of kernels/include/uccl_ep/device/logfmt.cuh on the CPU: reads BF16 rows
// (u32 rows, u32 hidden, then the rows) on stdin, encodes each 128-channel division as its 16 lanes
// would (extremes, levels, codes, lane-pair words, fallback copy, meta word), decodes every 8
// channels with logfmt_decode8, and writes the fp32 rows to stdout. Built with -ffp-contract=off so
// each float op rounds once, as __fadd_rn and friends do on the device.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define UCCL_DEVICE static inline
#define UCCL_EP_LOGFMT_HOST_MATH 1  // log2 / exp2 as the reference computes them on the CPU
struct HostDim { unsigned x; };
static HostDim threadIdx{0};

namespace uccl_ep::dev {
constexpr int kWarpSize = 32;
struct alignas(16) Vec16 { uint32_t w[4]; };
UCCL_DEVICE float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
UCCL_DEVICE float __fadd_rn(float a, float b) { return a + b; }
UCCL_DEVICE float __fsub_rn(float a, float b) { return a - b; }
UCCL_DEVICE float __fmul_rn(float a, float b) { return a * b; }
UCCL_DEVICE float __fdiv_rn(float a, float b) { return a / b; }
UCCL_DEVICE float bf16_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
UCCL_DEVICE void unpack_bf16x8(const Vec16& v, float* out) {
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(v.w[i] << 16);
    out[2 * i + 1] = __uint_as_float(v.w[i] & 0xffff0000u);
  }
}
UCCL_DEVICE Vec16 ld16(const void* p) { Vec16 v; std::memcpy(&v, p, 16); return v; }
UCCL_DEVICE Vec16 ld16_cg(const void* p) { return ld16(p); }
UCCL_DEVICE void st16(void* p, const Vec16& v) { std::memcpy(p, &v, 16); }
UCCL_DEVICE uint32_t ld_u32_cg(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
UCCL_DEVICE int lane_id() { return 0; }
UCCL_DEVICE int shfl_xor(int v, int) { return v; }
UCCL_DEVICE void sync_warp() {}
}  // namespace uccl_ep::dev

#include "uccl_ep/device/logfmt.cuh"

using namespace uccl_ep::dev;

int main() {
  uint32_t n = 0, h = 0;
  if (std::fread(&n, 4, 1, stdin) != 1 || std::fread(&h, 4, 1, stdin) != 1) return 2;
  std::vector<uint16_t> x(size_t(n) * h);
  if (std::fread(x.data(), 2, x.size(), stdin) != x.size()) return 2;
  const int nd = int(h / 128);
  std::vector<uint8_t> payload(size_t(h) * 2), meta(size_t(nd) * 4);
  std::vector<float> out(h);
  for (uint32_t r = 0; r < n; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(x.data() + size_t(r) * h);
    std::memset(payload.data(), 0xab, payload.size());  // untouched bytes of cast divisions
    for (int d = 0; d < nd; ++d) {
      Vec16 v[kLogfmtLanes];
      int hi = 0, lo = 0x7fff;
      for (int li = 0; li < kLogfmtLanes; ++li) {
        v[li] = ld16(row + d * kLogfmtDivBytes + li * 16);
        logfmt_extremes8(v[li], hi, lo);  // the shuffle reduction's result, in every lane
      }
      const uint32_t m = uint32_t(hi) | (uint32_t(lo) << 16);
      const LogfmtDiv p = logfmt_division(m);
      uint32_t w[kLogfmtLanes][3], stage[kLogfmtStageWords];
      for (int li = 0; li < kLogfmtLanes; ++li) logfmt_pack8(v[li], p, w[li]);
      for (int li = 0; li < kLogfmtLanes; li += 2) logfmt_pair_words(w[li], w[li + 1], stage + 5 * (li / 2));
      for (int li = 0; li < kLogfmtLanes; ++li) {
        uint8_t* o = payload.data() + d * kLogfmtDivBytes + li * 16;
        if (!p.cast) st16(o, v[li]);
        else if (li < 10) std::memcpy(o, reinterpret_cast<const uint8_t*>(stage) + li * 16, 16);
      }
      std::memcpy(meta.data() + 4 * d, &m, 4);
    }
    for (int64_t c = 0; c < int64_t(h) / 8; ++c) logfmt_decode8(payload.data(), meta.data(), c, out.data() + c * 8);
    std::fwrite(out.data(), 4, h, stdout);
  }
  return 0;
}
