// Bindings of the host FIFO and the receiver semantics, driven directly by tests and benchmarks.
//
// NOTES: these expose the consumer half of a FIFO (peek / pop / publish / status) that only a proxy
// thread calls in production; the checks below keep a caller from popping a slot that was never
// committed or publishing a completion for a command never pushed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "bindings/args.h"
#include "bindings/register.h"
#include "fifo/fifo_host.h"
#include "fifo/fifo_stress.h"
#include "proxy/receiver.h"
#include "uccl_ep/fifo_layout.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace nb = nanobind;

namespace uccl_ep::bindings {

namespace {

using protocol::TransferCmd;

nb::tuple words(const TransferCmd& c) { return nb::make_tuple(c.word0, c.word1); }

uint32_t capacity_arg(nb::handle v) {
  const uint64_t max = uint64_t(1) << fifo::kMaxCapacityLog2;
  const uint64_t c = u64_arg(v, "capacity", ~uint64_t(0));
  if (c < fifo::kMinCapacity || c > max || (c & (c - 1)) != 0)
    raise_invalid("capacity", "a power of two in [" + std::to_string(fifo::kMinCapacity) + ", " + std::to_string(max) + "]",
                  std::to_string(c));
  return uint32_t(c);
}

// A Receiver with its own counters, fed by hand: unit tests of the ordering / fence logic.
struct OwnedReceiver {
  std::vector<int64_t> counters;
  proxy::Receiver receiver;
  OwnedReceiver(int ranks, uint32_t c) : counters(size_t(ranks) * c, 0), receiver(ranks, c, counters.data()) {}
};

}  // namespace

void register_fifo(nb::module_& m) {
  m.def(
      "fifo_stress",
      [](nb::handle capacity, nb::handle producers, nb::handle per_producer, nb::handle timeout_s,
         nb::handle slow_consumer_ns) {
        const uint32_t cap = capacity_arg(capacity);
        const int n = int(int_arg(producers, "producers", 1, 256, "producer threads"));
        const uint64_t per = u64_arg(per_producer, "per_producer", uint64_t(1) << 40, "commands per producer (40-bit sequence)");
        const double t = timeout_arg(timeout_s, "timeout_s");
        const long slow = long(int_arg(slow_consumer_ns, "slow_consumer_ns", 0, 1000000000, "nanoseconds per command"));
        fifo::StressResult r;
        {
          nb::gil_scoped_release g;
          r = fifo::run_stress(cap, n, per, t, slow);
        }
        nb::dict d;
        d["pushed"] = r.pushed;
        d["consumed"] = r.consumed;
        d["out_of_order"] = r.out_of_order;
        d["corrupt"] = r.corrupt;
        d["timeouts"] = r.timeouts;
        d["seconds"] = r.seconds;
        return d;
      },
      any_arg("capacity"), any_arg("producers"), any_arg("per_producer"), any_arg("timeout_s") = 60.0,
      any_arg("slow_consumer_ns") = 0, "Multi-producer stress of one HostFifo with a checking consumer thread.");

  nb::class_<fifo::HostFifo>(m, "HostFifo", "One proxy FIFO's host half (tests and benchmarks drive it directly).")
      .def("__init__", [](fifo::HostFifo* f, nb::handle capacity) { new (f) fifo::HostFifo(capacity_arg(capacity)); },
           any_arg("capacity"))
      .def_prop_ro("capacity", &fifo::HostFifo::capacity)
      .def(
          "push",
          [](fifo::HostFifo& f, nb::handle w0, nb::handle w1, nb::handle timeout_s) -> nb::object {
            const TransferCmd c{u64_arg(w0, "word0", ~uint64_t(0)), u64_arg(w1, "word1", ~uint64_t(0))};
            const double t = timeout_arg(timeout_s, "timeout_s");
            uint64_t idx = 0;
            fifo::PushStatus st;
            {
              nb::gil_scoped_release g;
              st = f.push(c, t, &idx);
            }
            if (st == fifo::PushStatus::kOk) return nb::cast(idx);
            return nb::none();
          },
          any_arg("word0"), any_arg("word1"), any_arg("timeout_s"), "Returns the index, or None on timeout/stop.")
      .def("peek", [](const fifo::HostFifo& f) -> nb::object {
        TransferCmd c;
        if (!f.peek(&c)) return nb::none();
        return words(c);
      })
      .def("pop", [](fifo::HostFifo& f) {
        TransferCmd c;
        if (!f.peek(&c))
          raise_invalid("pop", "a committed command at the consumer index (peek() returns one)",
                        "an empty slot at index " + std::to_string(f.consumer_index()));
        f.pop();
      })
      .def_prop_ro("consumer_index", &fifo::HostFifo::consumer_index)
      .def(
          "publish_completed",
          [](fifo::HostFifo& f, nb::handle w) {
            const uint64_t wm = u64_arg(w, "watermark", ~uint64_t(0));
            if (wm < f.completed() || wm > f.reserved())
              raise_invalid("watermark", "a completion watermark in [" + std::to_string(f.completed()) + ", " +
                                             std::to_string(f.reserved()) + "] (monotone, at most what was pushed)",
                            std::to_string(wm));
            f.publish_completed(wm);
          },
          any_arg("watermark"))
      .def(
          "check_completion",
          [](const fifo::HostFifo& f, nb::handle idx) { return f.check_completion(u64_arg(idx, "index", ~uint64_t(0))); },
          any_arg("index"))
      .def(
          "set_status",
          [](fifo::HostFifo& f, nb::handle s) {
            f.set_status(u64_arg(s, "status", fifo::kStatusFailed,
                                 "status (0 running, 1 stopped, 2 failed: fifo_layout.h kStatus*)"));
          },
          any_arg("status"))
      .def_prop_ro("reserved", &fifo::HostFifo::reserved);

  nb::class_<OwnedReceiver>(m, "Receiver", "The receiver semantics of one proxy thread, driven directly (tests).")
      .def(
          "__init__",
          [](OwnedReceiver* r, nb::handle ranks, nb::handle counters) {
            new (r) OwnedReceiver(int(int_arg(ranks, "num_ranks", 1, int64_t(protocol::limits::kMaxRanks), "ranks")),
                                  uint32_t(int_arg(counters, "num_counters", 1, int64_t(protocol::limits::kMaxCounters),
                                                   "counters per source")));
          },
          any_arg("num_ranks"), any_arg("num_counters"))
      .def(
          "on_imm",
          [](OwnedReceiver& r, nb::handle src, nb::handle v) {
            const int s = int(int_arg(src, "src", -(int64_t(1) << 31), (int64_t(1) << 31) - 1));
            return r.receiver.on_imm(s, uint32_t(u64_arg(v, "imm", 0xFFFFFFFFull, "32-bit immediate")));
          },
          any_arg("src"), any_arg("imm"), "Applies one immediate; returns '' or the protocol violation.")
      .def("counters", [](OwnedReceiver& r) {
        const size_t c = r.counters.size();
        return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(r.counters.data(), {c}, nb::find(&r));
      });
}

}  // namespace uccl_ep::bindings
