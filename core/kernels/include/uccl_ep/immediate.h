// uccl_ep wire protocol, part 2: the 32-bit immediate carried by every write-with-immediate.
//
// The sending proxy builds it from a TransferCmd (protocol.h); the receiving proxy decodes it and
// turns it into counter updates. 32 bits because EFA carries only 4 bytes of CQ data (tcp carries
// 8: we mask to 32 ourselves). The source rank is NOT in the immediate: every transport reports
// which peer a completion came from (libfabric FI_SOURCE / the loop transport's record).
//
//   [30,32) kind
//   kind 0  Counted  [ 0,13) counter                     LL data: count under (src, counter)
//   kind 1  Ordered  [ 0,10) counter  [10,21) seq  [21,30) increment
//                                                         HT data: bump counter in seq order
//   kind 2  Atomic   [ 0,13) counter  [13,29) value (int16)  [29] fenced
//   kind 3  Control  [ 0,24) arg      [24,30) op           barrier, heartbeat
//
// Unused bits are zero; the receiver rejects an immediate with stray bits as a protocol error.
#pragma once

#include <stdint.h>

#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace imm {

using protocol::Field;

enum Kind : uint32_t { kCounted = 0, kOrdered = 1, kAtomic = 2, kControl = 3 };

enum ControlOp : uint32_t {
  kOpInvalid = 0,
  kOpHeartbeat = 1,       // arg: unused (liveness only)
  kOpBarrierArrive = 2,   // arg: epoch; scope all, rank -> its node leader
  kOpRailArrive = 3,      // arg: epoch; scope rail, rank -> every rail peer
  kOpBarrierRelease = 4,  // arg: epoch; leader -> local ranks
  kOpLeaderArrive = 5,    // arg: epoch; node leader -> other node leaders
  kOpGoodbye = 6,         // arg: unused; the sender's proxy is shutting down cleanly
};

// Fields of the immediate (word index unused: the immediate is one 32-bit value).
constexpr Field kImmKind{0, 30, 2};
constexpr Field kImmCounter{0, 0, 13};
constexpr Field kImmOrderedCounter{0, 0, 10};
constexpr Field kImmSeq{0, 10, 11};
constexpr Field kImmIncrement{0, 21, 9};
constexpr Field kImmValue{0, 13, 16};
constexpr Field kImmFenced{0, 29, 1};
constexpr Field kImmArg{0, 0, 24};
constexpr Field kImmOp{0, 24, 6};

// ---- limits ---------------------------------------------------------------------------------------
namespace limits {
constexpr uint32_t kMaxCounters = uint32_t(kImmCounter.max_value()) + 1;                // 8192
constexpr uint32_t kMaxOrderedCounters = uint32_t(kImmOrderedCounter.max_value()) + 1;  // 1024
constexpr uint32_t kSeqModulus = uint32_t(kImmSeq.max_value()) + 1;                     // 2048
// The receiver tells "early" from "stale" by serial-number arithmetic, so at most half the
// sequence space may be outstanding per (src, counter).
constexpr uint32_t kMaxOrderedInFlight = kSeqModulus / 2;                                // 1024
constexpr uint32_t kMaxIncrement = uint32_t(kImmIncrement.max_value());                 // 511
constexpr uint32_t kEpochModulus = uint32_t(kImmArg.max_value()) + 1;
}  // namespace limits

// The command and the immediate must agree on what they can carry.
static_assert(limits::kMaxCounters == protocol::limits::kMaxCounters, "counter widths differ");
static_assert(limits::kMaxIncrement == protocol::limits::kMaxIncrement, "increment widths differ");
static_assert(kImmValue.width == protocol::kFieldValue.width, "atomic value widths differ");

UCCL_EP_HOST_DEVICE constexpr uint32_t get(uint32_t imm, Field f) { return uint32_t((imm >> f.shift) & f.mask()); }
UCCL_EP_HOST_DEVICE constexpr uint32_t put(Field f, uint32_t v) { return uint32_t((uint64_t(v) & f.mask()) << f.shift); }

// ---- encoders -----------------------------------------------------------------------------------
UCCL_EP_HOST_DEVICE constexpr uint32_t counted(uint32_t counter) {
  return put(kImmKind, kCounted) | put(kImmCounter, counter);
}
UCCL_EP_HOST_DEVICE constexpr uint32_t ordered(uint32_t counter, uint32_t seq, uint32_t increment) {
  return put(kImmKind, kOrdered) | put(kImmOrderedCounter, counter) | put(kImmSeq, seq) |
         put(kImmIncrement, increment);
}
UCCL_EP_HOST_DEVICE constexpr uint32_t atomic(uint32_t counter, int32_t value, bool fenced) {
  return put(kImmKind, kAtomic) | put(kImmCounter, counter) | put(kImmValue, uint32_t(value) & 0xFFFFu) |
         put(kImmFenced, fenced ? 1u : 0u);
}
UCCL_EP_HOST_DEVICE constexpr uint32_t control(uint32_t op, uint32_t arg) {
  return put(kImmKind, kControl) | put(kImmOp, op) | put(kImmArg, arg);
}

// ---- decoders -------------------------------------------------------------------------------------
UCCL_EP_HOST_DEVICE constexpr uint32_t kind(uint32_t v) { return get(v, kImmKind); }
UCCL_EP_HOST_DEVICE constexpr uint32_t counter(uint32_t v) {
  return kind(v) == kOrdered ? get(v, kImmOrderedCounter) : get(v, kImmCounter);
}
UCCL_EP_HOST_DEVICE constexpr uint32_t seq(uint32_t v) { return get(v, kImmSeq); }
UCCL_EP_HOST_DEVICE constexpr uint32_t increment(uint32_t v) { return get(v, kImmIncrement); }
UCCL_EP_HOST_DEVICE constexpr int32_t value(uint32_t v) { return int32_t(int16_t(uint16_t(get(v, kImmValue)))); }
UCCL_EP_HOST_DEVICE constexpr bool fenced(uint32_t v) { return get(v, kImmFenced) != 0; }
UCCL_EP_HOST_DEVICE constexpr uint32_t op(uint32_t v) { return get(v, kImmOp); }
UCCL_EP_HOST_DEVICE constexpr uint32_t arg(uint32_t v) { return get(v, kImmArg); }

// True when no bit outside the fields of the immediate's kind is set.
UCCL_EP_HOST_DEVICE constexpr bool well_formed(uint32_t v) {
  return kind(v) == kCounted   ? (v & ~(put(kImmKind, 3) | put(kImmCounter, ~0u))) == 0
         : kind(v) == kOrdered ? true  // every bit is used
         : kind(v) == kAtomic  ? (v & ~(put(kImmKind, 3) | put(kImmCounter, ~0u) | put(kImmValue, ~0u) |
                                        put(kImmFenced, 1))) == 0
                               : op(v) != kOpInvalid;
}

// Serial-number distance a - b in the sequence space, as a signed value in (-M/2, M/2].
UCCL_EP_HOST_DEVICE constexpr int32_t seq_distance(uint32_t a, uint32_t b) {
  return int32_t(((a - b + limits::kSeqModulus / 2) & (limits::kSeqModulus - 1))) - int32_t(limits::kSeqModulus / 2);
}

}  // namespace imm
}  // namespace uccl_ep
