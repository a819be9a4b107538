// Bindings of the host executor's native movers (csrc/executor): the ring engine of the HT
// protocol and the LL command pusher. Python plans (vectorized torch), C++ moves bytes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "bindings/args.h"
#include "bindings/register.h"
#include "executor/command_push.h"
#include "executor/ring_engine.h"
#include "uccl_ep/protocol.h"

namespace nb = nanobind;

namespace uccl_ep::bindings {

namespace {

using Table = nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using ConstTable = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void same_length(size_t n, std::initializer_list<size_t> others, const char* what) {
  for (size_t m : others)
    if (m != n) raise_invalid(what, "arrays of one length (" + std::to_string(n) + ")", "an array of " + std::to_string(m));
}

template <typename T>
T table_arg(nb::handle v, const char* name, bool writable) {
  T out;
  if (!nb::try_cast(v, out, false))
    raise_invalid(name, std::string("a 2-D C-contiguous ") + (writable ? "writable " : "") + "uint8 CPU array",
                  std::string(Py_TYPE(v.ptr())->tp_name));
  return out;
}

template <typename T>
T spec_item(const nb::dict& spec, const char* key, int64_t lo, int64_t hi) {
  if (!spec.contains(key)) raise_invalid("spec", std::string("a dict with key '") + key + "'", "no such key");
  return T(int_arg(spec[key], (std::string("spec['") + key + "']").c_str(), lo, hi));
}

// Every value of `v` in [lo, hi]; the first that is not names its index.
template <typename T>
void each_in(const Vec<T>& v, const char* name, int64_t lo, int64_t hi) {
  for (size_t i = 0; i < v.shape(0); ++i)
    if (int64_t(v(i)) < lo || int64_t(v(i)) > hi)
      raise_invalid(std::string(name) + "[" + std::to_string(i) + "]",
                    "an int in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", std::to_string(int64_t(v(i))));
}

}  // namespace

void register_executor(nb::module_& m) {
  nb::class_<executor::RingEngine>(m, "RingEngine", "HT message streams through ring buffers in the proxy region.")
      .def("__init__", [](executor::RingEngine* e, nb::handle p) { new (e) executor::RingEngine(proxy_arg(p)); },
           any_arg("proxy"), nb::keep_alive<1, 2>())
      .def(
          "run_phase",
          [](executor::RingEngine& eng, nb::handle spec_h, nb::handle table_h, nb::handle out_h, nb::handle send_dst_h,
             nb::handle send_ring_h, nb::handle send_start_h, nb::handle send_count_h, nb::handle send_rows_h,
             nb::handle recv_src_h, nb::handle recv_ring_h, nb::handle recv_out_row_h, nb::handle recv_count_h) {
            if (!nb::isinstance<nb::dict>(spec_h)) raise_invalid("spec", "a dict", std::string(Py_TYPE(spec_h.ptr())->tp_name));
            const nb::dict spec = nb::borrow<nb::dict>(spec_h);
            executor::PhaseSpec s;
            constexpr int64_t kU32 = 0xFFFFFFFFll, kOff = int64_t(protocol::limits::kMaxRegionBytes);
            s.msg_bytes = spec_item<uint32_t>(spec, "msg_bytes", 16, int64_t(protocol::limits::kMaxWriteBytes));
            s.ring_slots = spec_item<uint32_t>(spec, "ring_slots", 1, kU32);
            s.chunk = spec_item<uint32_t>(spec, "chunk", 1, kU32);
            s.num_rings = spec_item<uint32_t>(spec, "num_rings", 1, executor::kMaxRings);
            s.first_ring = spec.contains("first_ring") ? spec_item<uint32_t>(spec, "first_ring", 0, executor::kMaxRings - 1) : 0;
            s.recv_base = spec_item<uint64_t>(spec, "recv_base", 0, kOff);
            s.send_base = spec_item<uint64_t>(spec, "send_base", 0, kOff);
            s.threads = spec_item<int>(spec, "threads", 1, 64);
            if (!spec.contains("timeout_s")) raise_invalid("spec", "a dict with key 'timeout_s'", "no such key");
            s.timeout_s = timeout_arg(spec["timeout_s"], "spec['timeout_s']");
            if (!spec.contains("phase")) raise_invalid("spec", "a dict with key 'phase'", "no such key");
            s.phase = str_arg(spec["phase"], "spec['phase']");
            if (s.recv_base % protocol::kOffsetUnitBytes || s.send_base % protocol::kOffsetUnitBytes)
              raise_invalid("spec['recv_base'] / spec['send_base']", "multiples of 16 bytes (offsets travel in 16-byte units)",
                            std::to_string(s.recv_base) + " / " + std::to_string(s.send_base));
            ConstTable table = table_arg<ConstTable>(table_h, "table", false);
            Table out = table_arg<Table>(out_h, "out", true);
            const Vec<int32_t> send_dst = vec_arg<int32_t>(send_dst_h, "send_dst"),
                               send_ring = vec_arg<int32_t>(send_ring_h, "send_ring"),
                               recv_src = vec_arg<int32_t>(recv_src_h, "recv_src"),
                               recv_ring = vec_arg<int32_t>(recv_ring_h, "recv_ring");
            const Vec<int64_t> send_start = vec_arg<int64_t>(send_start_h, "send_start"),
                               send_count = vec_arg<int64_t>(send_count_h, "send_count"),
                               send_rows = vec_arg<int64_t>(send_rows_h, "send_rows"),
                               recv_out_row = vec_arg<int64_t>(recv_out_row_h, "recv_out_row"),
                               recv_count = vec_arg<int64_t>(recv_count_h, "recv_count");
            const size_t ns = send_dst.shape(0), nr = recv_src.shape(0);
            same_length(ns, {send_ring.shape(0), send_start.shape(0), send_count.shape(0)}, "send streams");
            same_length(nr, {recv_ring.shape(0), recv_out_row.shape(0), recv_count.shape(0)}, "receive streams");
            if ((table.shape(0) && table.shape(1) != s.msg_bytes) || (out.shape(0) && out.shape(1) != s.msg_bytes))
              raise_invalid("table/out", "rows of msg_bytes (" + std::to_string(s.msg_bytes) + ") bytes",
                            std::to_string(table.shape(1)) + " / " + std::to_string(out.shape(1)));
            each_in(send_ring, "send_ring", 0, executor::kMaxRings - 1);
            each_in(recv_ring, "recv_ring", 0, executor::kMaxRings - 1);
            each_in(send_start, "send_start", 0, int64_t(send_rows.shape(0)));
            each_in(send_count, "send_count", 0, int64_t(send_rows.shape(0)));
            each_in(recv_out_row, "recv_out_row", 0, int64_t(out.shape(0)));
            each_in(recv_count, "recv_count", 0, int64_t(out.shape(0)));
            std::vector<executor::SendStream> sends;
            for (size_t i = 0; i < ns; ++i) {
              if (uint64_t(send_start(i) + send_count(i)) > send_rows.shape(0))
                raise_invalid("send_start/send_count[" + std::to_string(i) + "]", "rows within send_rows",
                              std::to_string(send_start(i)) + " + " + std::to_string(send_count(i)));
              sends.push_back({send_dst(i), uint32_t(send_ring(i)), send_rows.data() + send_start(i), uint64_t(send_count(i))});
            }
            std::vector<executor::RecvStream> recvs;
            for (size_t i = 0; i < nr; ++i)
              recvs.push_back({recv_src(i), uint32_t(recv_ring(i)), uint64_t(recv_out_row(i)), uint64_t(recv_count(i))});
            nb::gil_scoped_release g;
            eng.run_phase(s, table.data(), table.shape(0), out.data(), out.shape(0), sends, recvs);
          },
          any_arg("spec"), any_arg("table"), any_arg("out"), any_arg("send_dst"), any_arg("send_ring"),
          any_arg("send_start"), any_arg("send_count"), any_arg("send_rows"), any_arg("recv_src"), any_arg("recv_ring"),
          any_arg("recv_out_row"), any_arg("recv_count"));

  m.def(
      "push_counted",
      [](nb::handle proxy_h, nb::handle dst_h, nb::handle src_off_h, nb::handle dst_off_h, nb::handle counter_h,
         nb::handle len_h, nb::handle atomic_dst_h, nb::handle atomic_counter_h, nb::handle atomic_value_h,
         nb::handle atomic_fenced_h, nb::handle threads_h, nb::handle timeout_h) {
        proxy::Proxy& p = proxy_arg(proxy_h);
        const Vec<int32_t> dst = vec_arg<int32_t>(dst_h, "dst"), counter = vec_arg<int32_t>(counter_h, "counter");
        const Vec<int64_t> src_off = vec_arg<int64_t>(src_off_h, "src_off"), dst_off = vec_arg<int64_t>(dst_off_h, "dst_off");
        const Vec<int32_t> atomic_dst = vec_arg<int32_t>(atomic_dst_h, "atomic_dst"),
                           atomic_counter = vec_arg<int32_t>(atomic_counter_h, "atomic_counter"),
                           atomic_value = vec_arg<int32_t>(atomic_value_h, "atomic_value");
        const Vec<uint8_t> atomic_fenced = vec_arg<uint8_t>(atomic_fenced_h, "atomic_fenced");
        const uint32_t len = uint32_t(u64_arg(len_h, "len", protocol::limits::kMaxWriteBytes,
                                              "bytes of one write (24-bit len field of the TransferCmd)"));
        const int threads = int(int_arg(threads_h, "threads", 1, 64));
        const double timeout_s = timeout_arg(timeout_h, "timeout_s");
        same_length(dst.shape(0), {src_off.shape(0), dst_off.shape(0), counter.shape(0)}, "writes");
        same_length(atomic_dst.shape(0), {atomic_counter.shape(0), atomic_value.shape(0), atomic_fenced.shape(0)},
                    "atomics");
        // NOTES: every value meets its TransferCmd field here; the kernels' encoders mask silently.
        const int64_t R = p.config().num_ranks, C = p.config().num_counters;
        const int64_t region = int64_t(p.region_bytes());
        each_in(dst, "dst", 0, R - 1);
        each_in(counter, "counter", 0, C - 1);
        each_in(atomic_dst, "atomic_dst", 0, R - 1);
        each_in(atomic_counter, "atomic_counter", 0, C - 1);
        each_in(atomic_fenced, "atomic_fenced", 0, 1);
        each_in(src_off, "src_off", 0, region - int64_t(len));
        each_in(dst_off, "dst_off", 0, int64_t(protocol::limits::kMaxRegionBytes) - int64_t(len));
        for (size_t i = 0; i < src_off.shape(0); ++i)
          if (src_off(i) % int64_t(protocol::kOffsetUnitBytes) || dst_off(i) % int64_t(protocol::kOffsetUnitBytes))
            raise_invalid("src_off/dst_off[" + std::to_string(i) + "]", "multiples of 16 bytes",
                          std::to_string(src_off(i)) + " / " + std::to_string(dst_off(i)));
        executor::CountedWrites w{dst.data(), src_off.data(), dst_off.data(), counter.data(), dst.shape(0), len};
        executor::Atomics a{atomic_dst.data(), atomic_counter.data(), atomic_value.data(), atomic_fenced.data(),
                            atomic_dst.shape(0)};
        nb::gil_scoped_release g;
        executor::push_counted(p, w, a, threads, timeout_s);
      },
      any_arg("proxy"), any_arg("dst"), any_arg("src_off"), any_arg("dst_off"), any_arg("counter"), any_arg("len"),
      any_arg("atomic_dst"), any_arg("atomic_counter"), any_arg("atomic_value"), any_arg("atomic_fenced"),
      any_arg("threads"), any_arg("timeout_s"),
      "LL sends: counted writes, then the atomics (fenced: value = writes + 1), each to FIFO counter % num_fifos.");
  m.def(
      "wait_counters",
      [](nb::handle proxy_h, nb::handle src_h, nb::handle counter_h, nb::handle target_h, nb::handle timeout_h,
         nb::handle phase_h) {
        proxy::Proxy& p = proxy_arg(proxy_h);
        const Vec<int32_t> src = vec_arg<int32_t>(src_h, "src"), counter = vec_arg<int32_t>(counter_h, "counter");
        const Vec<int64_t> target = vec_arg<int64_t>(target_h, "target");
        const double timeout_s = timeout_arg(timeout_h, "timeout_s");
        const std::string phase = str_arg(phase_h, "phase");
        same_length(src.shape(0), {counter.shape(0), target.shape(0)}, "wait_counters");
        each_in(src, "src", 0, p.config().num_ranks - 1);
        each_in(counter, "counter", 0, int64_t(p.config().num_counters) - 1);
        nb::gil_scoped_release g;
        executor::wait_counters(p, src.data(), counter.data(), target.data(), src.shape(0), timeout_s, phase);
      },
      any_arg("proxy"), any_arg("src"), any_arg("counter"), any_arg("target"), any_arg("timeout_s"), any_arg("phase"));
}

}  // namespace uccl_ep::bindings
