// Bindings of the wire protocol headers (protocol.h, immediate.h): limits, encoders, decoders.
//
// NOTES: the encoders in the headers are branch-free for kernels and mask every value to its field
// width; these bindings are where a host caller's value meets a field, so each one is checked
// against its field here (a length of 2^24 + 64 would otherwise become 64).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <vector>

#include "bindings/args.h"
#include "bindings/register.h"
#include "uccl_ep/fifo_layout.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace nb = nanobind;

namespace uccl_ep::bindings {

namespace {

using protocol::TransferCmd;
using U64Array = nb::ndarray<nb::numpy, uint64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
namespace lim = protocol::limits;

nb::tuple words(const TransferCmd& c) { return nb::make_tuple(c.word0, c.word1); }

uint32_t rank_field(nb::handle v, const char* name) {
  return uint32_t(u64_arg(v, name, lim::kMaxRanks - 1, "rank (12-bit dst_rank field of the TransferCmd)"));
}
uint32_t len_field(nb::handle v, const char* name) {
  return uint32_t(u64_arg(v, name, lim::kMaxWriteBytes, "bytes of one write (24-bit len field of the TransferCmd)"));
}
uint32_t counter_field(nb::handle v, const char* name) {
  return uint32_t(u64_arg(v, name, lim::kMaxCounters - 1, "counter index (13-bit counter field)"));
}
uint32_t ordered_counter_field(nb::handle v, const char* name) {
  return uint32_t(u64_arg(v, name, imm::limits::kMaxOrderedCounters - 1,
                          "counter index of an ordered write (10-bit counter of the ordered immediate)"));
}
uint32_t increment_field(nb::handle v, const char* name) {
  return uint32_t(u64_arg(v, name, lim::kMaxIncrement, "increment (9-bit increment field)"));
}
int32_t value_field(nb::handle v, const char* name, bool fenced) {
  // The field range only: a fenced value < 1 fits the field and is the receiver's to refuse.
  return int32_t(int_arg(v, name, lim::kMinAtomicValue, lim::kMaxAtomicValue,
                         "atomic value (16-bit signed value field)"));
}
uint32_t u32_word(nb::handle v, const char* name) { return uint32_t(u64_arg(v, name, 0xFFFFFFFFull, "32-bit word")); }

nb::dict protocol_limits() {
  nb::dict d;
  d["protocol_version"] = UCCL_EP_PROTOCOL_VERSION;
  d["cmd_bytes"] = sizeof(TransferCmd);
  d["max_ranks"] = lim::kMaxRanks;
  d["max_write_bytes"] = lim::kMaxWriteBytes;
  d["max_region_bytes"] = lim::kMaxRegionBytes;
  d["offset_unit_bytes"] = protocol::kOffsetUnitBytes;
  d["max_counters"] = lim::kMaxCounters;
  d["max_increment"] = lim::kMaxIncrement;
  d["max_atomic_value"] = lim::kMaxAtomicValue;
  d["min_atomic_value"] = lim::kMinAtomicValue;
  d["max_fenced_count"] = lim::kMaxFencedCount;
  d["max_ordered_counters"] = imm::limits::kMaxOrderedCounters;
  d["seq_modulus"] = imm::limits::kSeqModulus;
  d["max_ordered_in_flight"] = imm::limits::kMaxOrderedInFlight;
  d["epoch_modulus"] = imm::limits::kEpochModulus;
  d["max_fifo_capacity"] = uint64_t(1) << fifo::kMaxCapacityLog2;
  return d;
}

// Batch encoder for tests and benchmarks: every argument an int64 array of the same length.
U64Array encode_writes(nb::handle dst_h, nb::handle src_h, nb::handle doff_h, nb::handle len_h, nb::handle counter_h,
                       nb::handle inc_h, nb::handle ordered_h) {
  const Vec<int64_t> dst = vec_arg<int64_t>(dst_h, "dst"), src_off = vec_arg<int64_t>(src_h, "src_off"),
                     dst_off = vec_arg<int64_t>(doff_h, "dst_off"), len = vec_arg<int64_t>(len_h, "len"),
                     counter = vec_arg<int64_t>(counter_h, "counter"), increment = vec_arg<int64_t>(inc_h, "increment");
  const bool ordered = bool_arg(ordered_h, "ordered");
  const size_t n = dst.shape(0);
  const char* names[] = {"src_off", "dst_off", "len", "counter", "increment"};
  const Vec<int64_t>* arrays[] = {&src_off, &dst_off, &len, &counter, &increment};
  for (int a = 0; a < 5; ++a)
    if (arrays[a]->shape(0) != n)
      raise_invalid(names[a], std::to_string(n) + " entries (the length of dst)", std::to_string(arrays[a]->shape(0)));
  std::vector<uint64_t> out(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    auto item = [&](const Vec<int64_t>& a) { return nb::int_(a(i)); };
    const uint32_t d = rank_field(item(dst), ("dst" + at).c_str());
    const uint64_t so = offset_arg(item(src_off), ("src_off" + at).c_str());
    const uint64_t dso = offset_arg(item(dst_off), ("dst_off" + at).c_str());
    const uint32_t l = len_field(item(len), ("len" + at).c_str());
    const TransferCmd c =
        ordered ? protocol::make_ordered_write(d, so, dso, l, ordered_counter_field(item(counter), ("counter" + at).c_str()),
                                               increment_field(item(increment), ("increment" + at).c_str()))
                : protocol::make_counted_write(d, so, dso, l, counter_field(item(counter), ("counter" + at).c_str()));
    out[2 * i] = c.word0;
    out[2 * i + 1] = c.word1;
  }
  auto* heap = new uint64_t[std::max<size_t>(2 * n, 1)];
  std::copy(out.begin(), out.end(), heap);
  nb::capsule owner(heap, [](void* p) noexcept { delete[] static_cast<uint64_t*>(p); });
  return U64Array(heap, {n, 2}, owner);
}

}  // namespace

void register_protocol(nb::module_& m) {
  m.def("protocol_limits", &protocol_limits, "Limits implied by the TransferCmd and immediate field widths.");
  m.def(
      "encode_counted_write",
      [](nb::handle dst, nb::handle soff, nb::handle doff, nb::handle len, nb::handle counter) {
        return words(protocol::make_counted_write(rank_field(dst, "dst"), offset_arg(soff, "src_off"),
                                                  offset_arg(doff, "dst_off"), len_field(len, "len"),
                                                  counter_field(counter, "counter")));
      },
      any_arg("dst"), any_arg("src_off"), any_arg("dst_off"), any_arg("len"), any_arg("counter"),
      "(word0, word1) of a counted write; every value is checked against its field.");
  m.def(
      "encode_ordered_write",
      [](nb::handle dst, nb::handle soff, nb::handle doff, nb::handle len, nb::handle counter, nb::handle inc) {
        return words(protocol::make_ordered_write(rank_field(dst, "dst"), offset_arg(soff, "src_off"),
                                                  offset_arg(doff, "dst_off"), len_field(len, "len"),
                                                  ordered_counter_field(counter, "counter"),
                                                  increment_field(inc, "increment")));
      },
      any_arg("dst"), any_arg("src_off"), any_arg("dst_off"), any_arg("len"), any_arg("counter"), any_arg("increment"));
  m.def(
      "encode_atomic",
      [](nb::handle dst, nb::handle counter, nb::handle value, nb::handle fenced) {
        const bool f = bool_arg(fenced, "fenced");
        return words(protocol::make_atomic(rank_field(dst, "dst"), counter_field(counter, "counter"),
                                           value_field(value, "value", f), f));
      },
      any_arg("dst"), any_arg("counter"), any_arg("value"), any_arg("fenced"));
  m.def("encode_quiet", [](nb::handle whole) { return words(protocol::make_quiet(bool_arg(whole, "whole_thread"))); },
        any_arg("whole_thread"));
  m.def("encode_barrier", [](nb::handle rail) { return words(protocol::make_barrier(bool_arg(rail, "rail"))); },
        any_arg("rail"));
  m.def("encode_writes", &encode_writes, any_arg("dst"), any_arg("src_off"), any_arg("dst_off"), any_arg("len"),
        any_arg("counter"), any_arg("increment"), any_arg("ordered"));
  m.def(
      "decode_cmd",
      [](nb::handle w0h, nb::handle w1h) {
        const TransferCmd c{u64_arg(w0h, "word0", ~uint64_t(0)), u64_arg(w1h, "word1", ~uint64_t(0))};
        nb::dict d;
        d["type"] = protocol::cmd_type(c);
        d["flag"] = protocol::cmd_flag(c);
        d["dst_rank"] = protocol::cmd_dst_rank(c);
        d["len"] = protocol::cmd_len(c);
        d["value"] = protocol::cmd_value(c);
        d["counter"] = protocol::cmd_counter(c);
        d["increment"] = protocol::cmd_increment(c);
        d["src_off"] = protocol::cmd_src_off(c);
        d["dst_off"] = protocol::cmd_dst_off(c);
        d["reserved_clear"] = protocol::cmd_reserved_clear(c);
        return d;
      },
      any_arg("word0"), any_arg("word1"));
  m.def("imm_counted", [](nb::handle c) { return imm::counted(counter_field(c, "counter")); }, any_arg("counter"));
  m.def(
      "imm_ordered",
      [](nb::handle c, nb::handle seq, nb::handle inc) {
        return imm::ordered(ordered_counter_field(c, "counter"),
                            uint32_t(u64_arg(seq, "seq", imm::limits::kSeqModulus - 1, "sequence number (11-bit field)")),
                            increment_field(inc, "increment"));
      },
      any_arg("counter"), any_arg("seq"), any_arg("increment"));
  m.def(
      "imm_atomic",
      [](nb::handle c, nb::handle v, nb::handle fenced) {
        const bool f = bool_arg(fenced, "fenced");
        return imm::atomic(counter_field(c, "counter"), value_field(v, "value", f), f);
      },
      any_arg("counter"), any_arg("value"), any_arg("fenced"));
  m.def(
      "imm_control",
      [](nb::handle op, nb::handle arg) {
        return imm::control(uint32_t(u64_arg(op, "op", imm::kImmOp.max_value(), "control operation (6-bit field)")),
                            uint32_t(u64_arg(arg, "arg", imm::kImmArg.max_value(), "control argument (24-bit field)")));
      },
      any_arg("op"), any_arg("arg"));
  m.def(
      "imm_decode",
      [](nb::handle vh) {
        const uint32_t v = u32_word(vh, "imm");
        nb::dict d;
        d["kind"] = imm::kind(v);
        d["counter"] = imm::counter(v);
        d["seq"] = imm::seq(v);
        d["increment"] = imm::increment(v);
        d["value"] = imm::value(v);
        d["fenced"] = imm::fenced(v);
        d["op"] = imm::op(v);
        d["arg"] = imm::arg(v);
        d["well_formed"] = imm::well_formed(v);
        return d;
      },
      any_arg("imm"));
}

}  // namespace uccl_ep::bindings
