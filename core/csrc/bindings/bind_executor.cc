// Bindings of the host executor's native movers (csrc/executor): the ring engine of the HT
// protocol and the LL command pusher. Python plans (vectorized torch), C++ moves bytes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "bindings/register.h"
#include "executor/command_push.h"
#include "executor/ring_engine.h"

namespace nb = nanobind;

namespace uccl_ep::bindings {

namespace {

template <typename T>
using Vec = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Table = nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using ConstTable = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void same_length(size_t n, std::initializer_list<size_t> others, const char* what) {
  for (size_t m : others)
    if (m != n) throw_error(ErrorKind::kInvalidArgument, -1, -1, "", std::string(what) + ": arrays of different lengths");
}

}  // namespace

void register_executor(nb::module_& m) {
  nb::class_<executor::RingEngine>(m, "RingEngine", "HT message streams through ring buffers in the proxy region.")
      .def(nb::init<proxy::Proxy&>(), nb::arg("proxy"), nb::keep_alive<1, 2>())
      .def(
          "run_phase",
          [](executor::RingEngine& eng, const nb::dict& spec, ConstTable table, Table out, Vec<int32_t> send_dst,
             Vec<int32_t> send_ring, Vec<int64_t> send_start, Vec<int64_t> send_count, Vec<int64_t> send_rows,
             Vec<int32_t> recv_src, Vec<int32_t> recv_ring, Vec<int64_t> recv_out_row, Vec<int64_t> recv_count) {
            executor::PhaseSpec s;
            s.msg_bytes = nb::cast<uint32_t>(spec["msg_bytes"]);
            s.ring_slots = nb::cast<uint32_t>(spec["ring_slots"]);
            s.chunk = nb::cast<uint32_t>(spec["chunk"]);
            s.num_rings = nb::cast<uint32_t>(spec["num_rings"]);
            s.first_ring = spec.contains("first_ring") ? nb::cast<uint32_t>(spec["first_ring"]) : 0;
            s.recv_base = nb::cast<uint64_t>(spec["recv_base"]);
            s.send_base = nb::cast<uint64_t>(spec["send_base"]);
            s.threads = nb::cast<int>(spec["threads"]);
            s.timeout_s = nb::cast<double>(spec["timeout_s"]);
            s.phase = nb::cast<std::string>(spec["phase"]);
            const size_t ns = send_dst.shape(0), nr = recv_src.shape(0);
            same_length(ns, {send_ring.shape(0), send_start.shape(0), send_count.shape(0)}, "send streams");
            same_length(nr, {recv_ring.shape(0), recv_out_row.shape(0), recv_count.shape(0)}, "receive streams");
            if ((table.shape(0) && table.shape(1) != s.msg_bytes) || (out.shape(0) && out.shape(1) != s.msg_bytes))
              throw_error(ErrorKind::kInvalidArgument, -1, -1, "", "table/out: rows of msg_bytes bytes expected");
            std::vector<executor::SendStream> sends;
            for (size_t i = 0; i < ns; ++i) {
              if (send_start(i) < 0 || send_count(i) < 0 || uint64_t(send_start(i) + send_count(i)) > send_rows.shape(0))
                throw_error(ErrorKind::kInvalidArgument, -1, -1, "", "send streams: rows outside send_rows");
              sends.push_back({send_dst(i), uint32_t(send_ring(i)), send_rows.data() + send_start(i), uint64_t(send_count(i))});
            }
            std::vector<executor::RecvStream> recvs;
            for (size_t i = 0; i < nr; ++i) {
              if (recv_out_row(i) < 0 || recv_count(i) < 0)
                throw_error(ErrorKind::kInvalidArgument, -1, -1, "", "receive streams: negative rows");
              recvs.push_back({recv_src(i), uint32_t(recv_ring(i)), uint64_t(recv_out_row(i)), uint64_t(recv_count(i))});
            }
            nb::gil_scoped_release g;
            eng.run_phase(s, table.data(), table.shape(0), out.data(), out.shape(0), sends, recvs);
          },
          nb::arg("spec"), nb::arg("table"), nb::arg("out"), nb::arg("send_dst"), nb::arg("send_ring"),
          nb::arg("send_start"), nb::arg("send_count"), nb::arg("send_rows"), nb::arg("recv_src"), nb::arg("recv_ring"),
          nb::arg("recv_out_row"), nb::arg("recv_count"));

  m.def(
      "push_counted",
      [](proxy::Proxy& p, Vec<int32_t> dst, Vec<int64_t> src_off, Vec<int64_t> dst_off, Vec<int32_t> counter,
         uint32_t len, Vec<int32_t> atomic_dst, Vec<int32_t> atomic_counter, Vec<int32_t> atomic_value,
         Vec<uint8_t> atomic_fenced, int threads, double timeout_s) {
        same_length(dst.shape(0), {src_off.shape(0), dst_off.shape(0), counter.shape(0)}, "writes");
        same_length(atomic_dst.shape(0), {atomic_counter.shape(0), atomic_value.shape(0), atomic_fenced.shape(0)},
                    "atomics");
        executor::CountedWrites w{dst.data(), src_off.data(), dst_off.data(), counter.data(), dst.shape(0), len};
        executor::Atomics a{atomic_dst.data(), atomic_counter.data(), atomic_value.data(), atomic_fenced.data(),
                            atomic_dst.shape(0)};
        nb::gil_scoped_release g;
        executor::push_counted(p, w, a, threads, timeout_s);
      },
      nb::arg("proxy"), nb::arg("dst"), nb::arg("src_off"), nb::arg("dst_off"), nb::arg("counter"), nb::arg("len"),
      nb::arg("atomic_dst"), nb::arg("atomic_counter"), nb::arg("atomic_value"), nb::arg("atomic_fenced"),
      nb::arg("threads"), nb::arg("timeout_s"),
      "LL sends: counted writes, then the atomics (fenced: value = writes + 1), each to FIFO counter % num_fifos.");
  m.def(
      "wait_counters",
      [](proxy::Proxy& p, Vec<int32_t> src, Vec<int32_t> counter, Vec<int64_t> target, double timeout_s,
         const std::string& phase) {
        same_length(src.shape(0), {counter.shape(0), target.shape(0)}, "wait_counters");
        nb::gil_scoped_release g;
        executor::wait_counters(p, src.data(), counter.data(), target.data(), src.shape(0), timeout_s, phase);
      },
      nb::arg("proxy"), nb::arg("src"), nb::arg("counter"), nb::arg("target"), nb::arg("timeout_s"), nb::arg("phase"));
}

}  // namespace uccl_ep::bindings
