// uccl_ep wire protocol, part 1: the 16-byte TransferCmd a producer (GPU warp or host thread)
// pushes into a proxy FIFO.
//
// This header is shared by the CUDA/HIP kernels, the host executor and the CPU proxy. It is plain
// C++17 on the host and compiles unchanged under nvcc and hipcc: no CUDA includes, no libc++
// containers, only fixed-width integers and constexpr bit math.
//
// Layout (little-endian 64-bit words; bit 0 = least significant):
//
//   word0  [ 0, 3) type        CmdType (0 is never pushed)
//          [ 3, 4) flag        Write: 1 = ordered (sequenced counter bump), 0 = counted tag
//                              Atomic: 1 = fenced by the count of writes tagged `counter`
//                              Quiet:  1 = drain every FIFO of the proxy thread, 0 = this FIFO
//                              Barrier: 1 = rail scope (ranks with my local index), 0 = all
//          [ 4,16) dst_rank    destination rank in the group (12 bits)
//          [16,40) len         Write: bytes (24 bits)          Atomic: [16,32) value (int16)
//          [40,53) counter     Write/Atomic: receiver counter index (13 bits)
//          [53,62) increment   ordered Write: counter increment applied in sequence (9 bits)
//          [62,64) reserved    zero
//   word1  [ 0,31) src_off     Write: source offset in the sender's region, in 16-byte units
//          [31,62) dst_off     Write: destination offset in the receiver's region, 16-byte units
//          [62,63) reserved    zero
//          [63,64) commit      lap-parity commit bit, owned by the FIFO (fifo_layout.h)
//
// Every field is declared exactly once below (kField*); encoders, decoders and the limits in
// `limits` derive from those declarations, and uccl_ep.proxy.check_protocol_limits() reads the
// same limits through the bindings.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define UCCL_EP_HOST_DEVICE __host__ __device__
#else
#define UCCL_EP_HOST_DEVICE
#endif

#define UCCL_EP_PROTOCOL_VERSION 1

namespace uccl_ep {
namespace protocol {

// A bit field inside one 64-bit word.
struct Field {
  uint32_t word;   // 0 or 1
  uint32_t shift;  // first bit
  uint32_t width;  // bits
  UCCL_EP_HOST_DEVICE constexpr uint64_t mask() const {
    return width >= 64 ? ~uint64_t(0) : ((uint64_t(1) << width) - 1);
  }
  UCCL_EP_HOST_DEVICE constexpr uint64_t max_value() const { return mask(); }
};

enum CmdType : uint32_t {
  kCmdInvalid = 0,  // never pushed; a zeroed slot decodes to it
  kCmdWrite = 1,    // RDMA write with immediate (LL count tag or HT ordered counter bump)
  kCmdAtomic = 2,   // emulated atomic add into the receiver's counter [src][counter]
  kCmdQuiet = 3,    // complete when everything before it (this FIFO / this thread) completed
  kCmdBarrier = 4,  // complete when every rank in scope reached the same barrier
};

// ---- the one declaration of every field -------------------------------------------------------
constexpr Field kFieldType{0, 0, 3};
constexpr Field kFieldFlag{0, 3, 1};
constexpr Field kFieldDstRank{0, 4, 12};
constexpr Field kFieldLen{0, 16, 24};
constexpr Field kFieldValue{0, 16, 16};  // Atomic only (shares the bits of len)
constexpr Field kFieldCounter{0, 40, 13};
constexpr Field kFieldIncrement{0, 53, 9};
constexpr Field kFieldReserved0{0, 62, 2};
constexpr Field kFieldSrcOff{1, 0, 31};
constexpr Field kFieldDstOff{1, 31, 31};
constexpr Field kFieldReserved1{1, 62, 1};
constexpr Field kFieldCommit{1, 63, 1};

// Offsets are carried in units of this many bytes (so 31 bits address 32 GiB).
constexpr uint64_t kOffsetUnitBytes = 16;

// The 16-byte command. Plain data: no constructors, so it lives in pinned / mapped memory and
// device code copies it as two 64-bit words.
struct alignas(16) TransferCmd {
  uint64_t word0;
  uint64_t word1;
};
static_assert(sizeof(TransferCmd) == 16, "TransferCmd must be exactly 16 bytes");
static_assert(alignof(TransferCmd) == 16, "TransferCmd must be 16-byte aligned (one 128-bit store)");

UCCL_EP_HOST_DEVICE constexpr uint64_t get(const TransferCmd& c, Field f) {
  return ((f.word == 0 ? c.word0 : c.word1) >> f.shift) & f.mask();
}
UCCL_EP_HOST_DEVICE constexpr void set(TransferCmd& c, Field f, uint64_t v) {
  uint64_t& w = f.word == 0 ? c.word0 : c.word1;
  w = (w & ~(f.mask() << f.shift)) | ((v & f.mask()) << f.shift);
}

// ---- limits implied by the widths (checked at Buffer construction) ------------------------------
namespace limits {
constexpr uint64_t kMaxRanks = kFieldDstRank.max_value() + 1;                         // 4096
constexpr uint64_t kMaxWriteBytes = kFieldLen.max_value();                            // 16 MiB - 1
constexpr uint64_t kMaxRegionBytes = (kFieldSrcOff.max_value() + 1) * kOffsetUnitBytes;  // 32 GiB
constexpr uint64_t kMaxCounters = kFieldCounter.max_value() + 1;                      // 8192 per source
constexpr uint64_t kMaxIncrement = kFieldIncrement.max_value();                       // 511
constexpr int64_t kMaxAtomicValue = (int64_t(1) << (kFieldValue.width - 1)) - 1;      // 32767
constexpr int64_t kMinAtomicValue = -(int64_t(1) << (kFieldValue.width - 1));         // -32768
}  // namespace limits

// ---- encoders (producer side) --------------------------------------------------------------------
// All take byte offsets, which must be multiples of kOffsetUnitBytes: the encoders stay
// branch-free for kernels and drop the low bits, so callers align their layouts (the host
// bindings reject misaligned offsets).

// LL-style write: the receiver counts it under (src, counter); a fenced Atomic waits for the count.
UCCL_EP_HOST_DEVICE constexpr TransferCmd make_counted_write(uint32_t dst_rank, uint64_t src_off_bytes,
                                                         uint64_t dst_off_bytes, uint32_t len,
                                                         uint32_t counter) {
  TransferCmd c{0, 0};
  set(c, kFieldType, kCmdWrite);
  set(c, kFieldDstRank, dst_rank);
  set(c, kFieldLen, len);
  set(c, kFieldCounter, counter);
  set(c, kFieldSrcOff, src_off_bytes / kOffsetUnitBytes);
  set(c, kFieldDstOff, dst_off_bytes / kOffsetUnitBytes);
  return c;
}

// HT-style write: after the payload lands, the receiver adds `increment` to counter [src][counter],
// applying the writes of one (src, counter) strictly in the order they were pushed (sequence
// numbers added by the sending proxy; one counter must always go through the same FIFO).
UCCL_EP_HOST_DEVICE constexpr TransferCmd make_ordered_write(uint32_t dst_rank, uint64_t src_off_bytes,
                                                         uint64_t dst_off_bytes, uint32_t len,
                                                         uint32_t counter, uint32_t increment) {
  TransferCmd c = make_counted_write(dst_rank, src_off_bytes, dst_off_bytes, len, counter);
  set(c, kFieldFlag, 1);
  set(c, kFieldIncrement, increment);
  return c;
}

// Emulated atomic add of `value` to the receiver's counter [my rank][counter]. Fenced: the receiver
// holds it until (value - 1) writes counted under (src, counter) have arrived, consumes that
// count, then adds `value` (so an LL "n tokens" signal is value = n + 1, never 0).
UCCL_EP_HOST_DEVICE constexpr TransferCmd make_atomic(uint32_t dst_rank, uint32_t counter, int32_t value,
                                                  bool fenced) {
  TransferCmd c{0, 0};
  set(c, kFieldType, kCmdAtomic);
  set(c, kFieldFlag, fenced ? 1 : 0);
  set(c, kFieldDstRank, dst_rank);
  set(c, kFieldValue, static_cast<uint64_t>(static_cast<uint32_t>(value)));
  set(c, kFieldCounter, counter);
  return c;
}

UCCL_EP_HOST_DEVICE constexpr TransferCmd make_quiet(bool whole_thread) {
  TransferCmd c{0, 0};
  set(c, kFieldType, kCmdQuiet);
  set(c, kFieldFlag, whole_thread ? 1 : 0);
  return c;
}

UCCL_EP_HOST_DEVICE constexpr TransferCmd make_barrier(bool rail_only) {
  TransferCmd c{0, 0};
  set(c, kFieldType, kCmdBarrier);
  set(c, kFieldFlag, rail_only ? 1 : 0);
  return c;
}

// ---- decoders (proxy side) ------------------------------------------------------------------------
UCCL_EP_HOST_DEVICE constexpr uint32_t cmd_type(const TransferCmd& c) { return uint32_t(get(c, kFieldType)); }
UCCL_EP_HOST_DEVICE constexpr bool cmd_flag(const TransferCmd& c) { return get(c, kFieldFlag) != 0; }
UCCL_EP_HOST_DEVICE constexpr uint32_t cmd_dst_rank(const TransferCmd& c) { return uint32_t(get(c, kFieldDstRank)); }
UCCL_EP_HOST_DEVICE constexpr uint32_t cmd_len(const TransferCmd& c) { return uint32_t(get(c, kFieldLen)); }
UCCL_EP_HOST_DEVICE constexpr uint32_t cmd_counter(const TransferCmd& c) { return uint32_t(get(c, kFieldCounter)); }
UCCL_EP_HOST_DEVICE constexpr uint32_t cmd_increment(const TransferCmd& c) {
  return uint32_t(get(c, kFieldIncrement));
}
UCCL_EP_HOST_DEVICE constexpr uint64_t cmd_src_off(const TransferCmd& c) {
  return get(c, kFieldSrcOff) * kOffsetUnitBytes;
}
UCCL_EP_HOST_DEVICE constexpr uint64_t cmd_dst_off(const TransferCmd& c) {
  return get(c, kFieldDstOff) * kOffsetUnitBytes;
}
UCCL_EP_HOST_DEVICE constexpr int32_t cmd_value(const TransferCmd& c) {
  // Sign-extend the 16-bit field.
  return int32_t(int16_t(uint16_t(get(c, kFieldValue))));
}
UCCL_EP_HOST_DEVICE constexpr bool cmd_reserved_clear(const TransferCmd& c) {
  return get(c, kFieldReserved0) == 0 && get(c, kFieldReserved1) == 0;
}

// LL count signals: a fenced atomic carries n + 1 so that "arrived with 0 tokens" is not 0.
UCCL_EP_HOST_DEVICE constexpr int32_t fenced_signal_for_count(uint32_t n) { return int32_t(n) + 1; }
UCCL_EP_HOST_DEVICE constexpr uint32_t fenced_count_of_signal(int32_t v) { return uint32_t(v - 1); }

namespace limits {
constexpr uint64_t kMaxFencedCount = uint64_t(kMaxAtomicValue) - 1;  // 32766 writes per (src, counter)
}  // namespace limits

}  // namespace protocol
}  // namespace uccl_ep
