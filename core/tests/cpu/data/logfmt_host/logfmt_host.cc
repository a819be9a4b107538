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
UCCL_DEVICE uint64_t warp_ballot(bool pred) { return pred ? 1u : 0u; }
}  // namespace uccl_ep::dev

#include "uccl_ep/device/logfmt.cuh"

using namespace uccl_ep::dev;

// Encodes division d of a row as its 16 lanes would (warp_logfmt_encode_row); returns "fell back".
static bool encode_division(const uint8_t* row, int d, uint8_t* a, int64_t a_stride, uint8_t* b, int64_t b_stride,
                            uint8_t* meta) {
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
    uint8_t* out = logfmt_chunk(a, a_stride, b, b_stride, d, li);
    if (!p.cast) st16(out, v[li]);
    else if (li < kLogfmtPartA / 16) std::memcpy(out, reinterpret_cast<const uint8_t*>(stage) + li * 16, 16);
  }
  std::memcpy(meta + 4 * d, &m, 4);
  return !p.cast;
}

// stdin: u32 rows, u32 hidden, u32 layout (0: the NVLink row slots, 1: one proxy region of all the
// rows, cut after the meta words unless a division fell back, the rest poisoned), then the rows.
int main() {
  uint32_t n = 0, h = 0, layout = 0;
  if (std::fread(&n, 4, 1, stdin) != 1 || std::fread(&h, 4, 1, stdin) != 1 || std::fread(&layout, 4, 1, stdin) != 1)
    return 2;
  std::vector<uint16_t> x(size_t(n) * h);
  if (std::fread(x.data(), 2, x.size(), stdin) != x.size()) return 2;
  const int nd = int(h / 128);
  std::vector<uint8_t> region(size_t(n) * (2 * h + h / 32) + 16, 0xab);  // untouched bytes stay 0xab
  std::vector<float> out(size_t(n) * h);
  bool fell_back = false;
  for (uint32_t r = 0; r < n; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(x.data() + size_t(r) * h);
    for (int d = 0; d < nd; ++d) {
      if (layout == 0) {
        uint8_t* slot = region.data() + size_t(r) * 2 * h;
        fell_back |= encode_division(row, d, slot, kLogfmtDivBytes, slot + kLogfmtPartA, kLogfmtDivBytes,
                                     region.data() + size_t(n) * 2 * h + size_t(r) * nd * 4);
      } else {
        const LogfmtRegion at = logfmt_region(region.data(), n, r, h);
        fell_back |= encode_division(row, d, at.a, kLogfmtPartA, at.b, kLogfmtPartB, at.meta);
      }
    }
  }
  if (layout == 1) {  // what the Write carries (publish_logfmt_rows); the receiver sees nothing past it
    const size_t len = (size_t(n) * nd * (kLogfmtPartA + 4 + (fell_back ? kLogfmtPartB : 0)) + 15) & ~size_t(15);
    std::memset(region.data() + len, 0x7f, region.size() - len);
  }
  for (uint32_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < int64_t(h) / 8; ++c) {
      float* o = out.data() + size_t(r) * h + c * 8;
      if (layout == 0) {
        const uint8_t* slot = region.data() + size_t(r) * 2 * h;
        logfmt_decode8(slot, kLogfmtDivBytes, slot + kLogfmtPartA, kLogfmtDivBytes,
                       region.data() + size_t(n) * 2 * h + size_t(r) * nd * 4, c, o);
      } else {
        const LogfmtRegion at = logfmt_region(region.data(), n, r, h);
        logfmt_decode8(at.a, kLogfmtPartA, at.b, kLogfmtPartB, at.meta, c, o);
      }
    }
  }
  std::fwrite(out.data(), 4, out.size(), stdout);
  std::fputc(fell_back ? 1 : 0, stdout);
  return 0;
}
