// Bindings of the protocol headers, the host FIFO and the proxy (uccl_ep._C).
//
// NOTES: every call that can wait releases the GIL; errors of the native core (EpError) become
// the matching uccl_ep.errors class, constructed by Python so messages and attributes are the
// same as errors raised in Python.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/register.h"
#include "fifo/fifo_host.h"
#include "fifo/fifo_stress.h"
#include "proxy/errors.h"
#include "proxy/proxy.h"
#include "proxy/proxy_bench.h"
#include "proxy/receiver.h"
#include "transport/transport.h"
#include "uccl_ep/fifo_layout.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace nb = nanobind;

namespace uccl_ep::bindings {

namespace {

using protocol::TransferCmd;
using U64Array = nb::ndarray<nb::numpy, uint64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Input = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const EpError& e) {
    nb::module_ errors = nb::module_::import_("uccl_ep.errors");
    const ErrorInfo& i = e.info;
    nb::object exc;
    nb::object peer = i.peer >= 0 ? nb::cast(i.peer) : nb::none();
    switch (i.kind) {
      case ErrorKind::kTimeout:
        exc = errors.attr("Timeout")(i.rank, peer, i.phase, i.waited_s,
                                     i.outstanding.empty() ? nb::none() : nb::cast(i.outstanding));
        break;
      case ErrorKind::kPeerFailure:
        exc = errors.attr("PeerFailure")(i.rank, peer, i.phase, i.detail);
        break;
      case ErrorKind::kPeerProtocolError:
        exc = errors.attr("PeerProtocolError")(std::string(e.what()));
        exc.attr("rank") = i.rank;
        exc.attr("peer") = peer;
        exc.attr("phase") = i.phase;
        break;
      case ErrorKind::kAborted:
        exc = errors.attr("Aborted")(std::string(e.what()));
        break;
      case ErrorKind::kUnsupported:
        exc = errors.attr("Unsupported")(std::string(e.what()));
        break;
      case ErrorKind::kInvalidArgument: {
        const std::string& d = i.detail;
        const size_t colon = d.find(':');
        exc = errors.attr("InvalidArgument")(colon == std::string::npos ? std::string("argument") : d.substr(0, colon),
                                             colon == std::string::npos ? d : d.substr(colon + 2));
        break;
      }
    }
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

nb::tuple words(const TransferCmd& c) { return nb::make_tuple(c.word0, c.word1); }

void check_offsets(uint64_t soff, uint64_t doff) {
  if (soff % protocol::kOffsetUnitBytes || doff % protocol::kOffsetUnitBytes)
    throw_error(ErrorKind::kInvalidArgument, -1, -1, "", "offset: expected multiples of " +
                std::to_string(protocol::kOffsetUnitBytes) + " bytes, got src " + std::to_string(soff) + ", dst " +
                std::to_string(doff));
}
TransferCmd cmd_of(uint64_t w0, uint64_t w1) { return TransferCmd{w0, w1}; }

nb::dict protocol_limits() {
  nb::dict d;
  d["protocol_version"] = UCCL_EP_PROTOCOL_VERSION;
  d["cmd_bytes"] = sizeof(TransferCmd);
  d["max_ranks"] = protocol::limits::kMaxRanks;
  d["max_write_bytes"] = protocol::limits::kMaxWriteBytes;
  d["max_region_bytes"] = protocol::limits::kMaxRegionBytes;
  d["offset_unit_bytes"] = protocol::kOffsetUnitBytes;
  d["max_counters"] = protocol::limits::kMaxCounters;
  d["max_increment"] = protocol::limits::kMaxIncrement;
  d["max_atomic_value"] = protocol::limits::kMaxAtomicValue;
  d["min_atomic_value"] = protocol::limits::kMinAtomicValue;
  d["max_fenced_count"] = protocol::limits::kMaxFencedCount;
  d["max_ordered_counters"] = imm::limits::kMaxOrderedCounters;
  d["seq_modulus"] = imm::limits::kSeqModulus;
  d["max_ordered_in_flight"] = imm::limits::kMaxOrderedInFlight;
  d["epoch_modulus"] = imm::limits::kEpochModulus;
  d["max_fifo_capacity"] = uint64_t(1) << fifo::kMaxCapacityLog2;
  return d;
}

// Batch encoder for tests and benchmarks: every argument an int64 array of the same length.
U64Array encode_writes(I64Input dst, I64Input src_off, I64Input dst_off, I64Input len, I64Input counter,
                       I64Input increment, bool ordered) {
  const size_t n = dst.shape(0);
  for (const auto* a : {&src_off, &dst_off, &len, &counter, &increment})
    if (a->shape(0) != n) throw std::invalid_argument("encode_writes: arrays of different lengths");
  auto* out = new uint64_t[2 * n];
  for (size_t i = 0; i < n; ++i) check_offsets(uint64_t(src_off(i)), uint64_t(dst_off(i)));
  for (size_t i = 0; i < n; ++i) {
    const TransferCmd c = ordered ? protocol::make_ordered_write(uint32_t(dst(i)), uint64_t(src_off(i)), uint64_t(dst_off(i)),
                                                                 uint32_t(len(i)), uint32_t(counter(i)), uint32_t(increment(i)))
                                  : protocol::make_counted_write(uint32_t(dst(i)), uint64_t(src_off(i)), uint64_t(dst_off(i)),
                                                                 uint32_t(len(i)), uint32_t(counter(i)));
    out[2 * i] = c.word0;
    out[2 * i + 1] = c.word1;
  }
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<uint64_t*>(p); });
  return U64Array(out, {n, 2}, owner);
}

proxy::ProxyConfig config_from(const nb::dict& d) {
  proxy::ProxyConfig c;
  auto get = [&](const char* k, auto& field) {
    if (d.contains(k)) field = nb::cast<std::decay_t<decltype(field)>>(d[k]);
  };
  get("rank", c.rank);
  get("num_ranks", c.num_ranks);
  get("ranks_per_node", c.ranks_per_node);
  get("num_threads", c.num_threads);
  get("fifos_per_thread", c.fifos_per_thread);
  get("fifo_capacity", c.fifo_capacity);
  get("num_counters", c.num_counters);
  get("region_bytes", c.region_bytes);
  get("external_region", c.external_region);
  get("transport", c.transport);
  get("ipc_copy", c.ipc_copy);
  get("provider", c.provider);
  get("domains", c.domains);
  get("token_digest", c.token_digest);
  get("max_inflight", c.max_inflight);
  get("timeout_s", c.timeout_s);
  get("heartbeat_s", c.heartbeat_s);
  get("idle_sleep_ns", c.idle_sleep_ns);
  get("check_remote_bounds", c.check_remote_bounds);
  get("cpus", c.cpus);
  get("fault_seed", c.fault_seed);
  get("fault_reorder", c.fault_reorder);
  get("fault_max_delay", c.fault_max_delay);
  get("fault_tear", c.fault_tear);
  get("fault_max_pieces", c.fault_max_pieces);
  for (auto item : d) {
    const std::string k = nb::cast<std::string>(item.first);
    static const char* known[] = {"rank", "num_ranks", "ranks_per_node", "num_threads", "fifos_per_thread",
                                  "fifo_capacity", "num_counters", "region_bytes", "external_region", "transport", "ipc_copy",
                                  "provider", "domains",
                                  "token_digest", "max_inflight", "timeout_s", "heartbeat_s", "idle_sleep_ns",
                                  "check_remote_bounds",
                                  "cpus", "fault_seed", "fault_reorder", "fault_max_delay", "fault_tear",
                                  "fault_max_pieces"};
    bool ok = false;
    for (const char* kk : known) ok |= k == kk;
    if (!ok) throw_error(ErrorKind::kInvalidArgument, -1, -1, "", "config: unknown proxy option '" + k + "'");
  }
  return c;
}

}  // namespace

void register_proxy(nb::module_& m) {
  nb::register_exception_translator(&translate, nullptr);

  m.def("transport_backends", &transport::backend_names, "Names in the transport table (csrc/transport/registry.cc).");
  m.def("transport_unavailable_reason", &transport::unavailable_reason, nb::arg("name"),
        "'' when the transport can be created on this machine, else why not.");
  m.def("fabric_domain_pci", &transport::fabric_domain_pci, nb::arg("provider") = "",
        "(NIC name, PCI address or '') of a provider's domains usable by the fabric transport.");
  m.def("fabric_domains", &transport::fabric_domains, nb::arg("provider") = "",
        "NICs (libfabric domain names) of a provider usable by the fabric transport, in its order.");
  m.def(
      "fabric_probe",
      [](const std::string& provider, const std::string& domain, int hmem_cuda_device) {
        std::string why;
        std::string name = transport::fabric_probe(provider, domain, hmem_cuda_device, &why);
        return std::make_pair(name, why);
      },
      nb::arg("provider") = "", nb::arg("domain") = "", nb::arg("hmem_cuda_device") = -1,
      "(endpoint name, '') if the fabric transport opens here for a host region (or, with hmem_cuda_device >= 0, "
      "one in that GPU's memory: FI_HMEM), else ('', why). Registers and connects nothing.");
  m.def("protocol_limits", &protocol_limits, "Limits implied by the TransferCmd and immediate field widths.");
  m.def("encode_counted_write", [](uint32_t dst, uint64_t soff, uint64_t doff, uint32_t len, uint32_t counter) {
    check_offsets(soff, doff);
    return words(protocol::make_counted_write(dst, soff, doff, len, counter));
  });
  m.def("encode_ordered_write", [](uint32_t dst, uint64_t soff, uint64_t doff, uint32_t len, uint32_t counter,
                                   uint32_t inc) {
    check_offsets(soff, doff);
    return words(protocol::make_ordered_write(dst, soff, doff, len, counter, inc));
  });
  m.def("encode_atomic", [](uint32_t dst, uint32_t counter, int32_t value, bool fenced) {
    return words(protocol::make_atomic(dst, counter, value, fenced));
  });
  m.def("encode_quiet", [](bool whole_thread) { return words(protocol::make_quiet(whole_thread)); });
  m.def("encode_barrier", [](bool rail) { return words(protocol::make_barrier(rail)); });
  m.def("encode_writes", &encode_writes, nb::arg("dst"), nb::arg("src_off"), nb::arg("dst_off"), nb::arg("len"),
        nb::arg("counter"), nb::arg("increment"), nb::arg("ordered"));
  m.def("decode_cmd", [](uint64_t w0, uint64_t w1) {
    const TransferCmd c = cmd_of(w0, w1);
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
  });
  m.def("imm_counted", [](uint32_t c) { return imm::counted(c); });
  m.def("imm_ordered", [](uint32_t c, uint32_t seq, uint32_t inc) { return imm::ordered(c, seq, inc); });
  m.def("imm_atomic", [](uint32_t c, int32_t v, bool fenced) { return imm::atomic(c, v, fenced); });
  m.def("imm_control", [](uint32_t op, uint32_t arg) { return imm::control(op, arg); });
  m.def("imm_decode", [](uint32_t v) {
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
  });

  m.def(
      "fifo_stress",
      [](uint32_t capacity, int producers, uint64_t per_producer, double timeout_s, long slow_consumer_ns) {
        fifo::StressResult r;
        {
          nb::gil_scoped_release g;
          r = fifo::run_stress(capacity, producers, per_producer, timeout_s, slow_consumer_ns);
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
      nb::arg("capacity"), nb::arg("producers"), nb::arg("per_producer"), nb::arg("timeout_s") = 60.0,
      nb::arg("slow_consumer_ns") = 0, "Multi-producer stress of one HostFifo with a checking consumer thread.");

  nb::class_<fifo::HostFifo>(m, "HostFifo", "One proxy FIFO's host half (tests and benchmarks drive it directly).")
      .def(nb::init<uint32_t>(), nb::arg("capacity"))
      .def_prop_ro("capacity", &fifo::HostFifo::capacity)
      .def(
          "push",
          [](fifo::HostFifo& f, uint64_t w0, uint64_t w1, double timeout_s) -> nb::object {
            uint64_t idx = 0;
            fifo::PushStatus st;
            {
              nb::gil_scoped_release g;
              st = f.push(cmd_of(w0, w1), timeout_s, &idx);
            }
            if (st == fifo::PushStatus::kOk) return nb::cast(idx);
            return nb::none();
          },
          nb::arg("word0"), nb::arg("word1"), nb::arg("timeout_s"), "Returns the index, or None on timeout/stop.")
      .def("peek", [](const fifo::HostFifo& f) -> nb::object {
        TransferCmd c;
        if (!f.peek(&c)) return nb::none();
        return words(c);
      })
      .def("pop", &fifo::HostFifo::pop)
      .def_prop_ro("consumer_index", &fifo::HostFifo::consumer_index)
      .def("publish_completed", &fifo::HostFifo::publish_completed)
      .def("check_completion", &fifo::HostFifo::check_completion)
      .def("set_status", &fifo::HostFifo::set_status)
      .def_prop_ro("reserved", &fifo::HostFifo::reserved);

  // A Receiver with its own counters, fed by hand: unit tests of the ordering / fence logic.
  struct OwnedReceiver {
    std::vector<int64_t> counters;
    proxy::Receiver receiver;
    OwnedReceiver(int ranks, uint32_t c)
        : counters(size_t(ranks) * c, 0), receiver(ranks, c, counters.data()) {}
  };
  nb::class_<OwnedReceiver>(m, "Receiver", "The receiver semantics of one proxy thread, driven directly (tests).")
      .def(nb::init<int, uint32_t>(), nb::arg("num_ranks"), nb::arg("num_counters"))
      .def("on_imm", [](OwnedReceiver& r, int src, uint32_t imm) { return r.receiver.on_imm(src, imm); },
           "Applies one immediate; returns '' or the protocol violation.")
      .def("counters", [](OwnedReceiver& r) {
        const size_t c = r.counters.size();
        return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(r.counters.data(), {c}, nb::find(&r));
      });

  nb::class_<proxy::Proxy>(m, "Proxy", "The CPU proxy of one rank (see csrc/proxy/proxy.h).")
      .def("__init__", [](proxy::Proxy* p, const nb::dict& cfg) { new (p) proxy::Proxy(config_from(cfg)); })
      .def("local_info", [](const proxy::Proxy& p) {
        const std::vector<uint8_t> b = p.local_info();
        return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      })
      .def("connect", [](proxy::Proxy& p, const std::vector<nb::bytes>& infos) {
        std::vector<std::vector<uint8_t>> v;
        for (const nb::bytes& b : infos) {
          const auto* s = static_cast<const uint8_t*>(b.data());
          v.emplace_back(s, s + b.size());
        }
        nb::gil_scoped_release g;
        p.connect(v);
      })
      .def("finalize_setup", &proxy::Proxy::finalize_setup)
      .def("start", &proxy::Proxy::start)
      .def("stop", &proxy::Proxy::stop, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("num_fifos", &proxy::Proxy::num_fifos)
      .def_prop_ro("transport_name", &proxy::Proxy::transport_name)
      .def_prop_ro("transport_devices", &proxy::Proxy::transport_devices,
                   "Per proxy thread, the device its transport uses (fabric: the libfabric domain, i.e. NIC).")
      .def_prop_ro("region_bytes", &proxy::Proxy::region_bytes)
      .def_prop_ro("commands_posted", &proxy::Proxy::stat_commands)
      .def("transport_counters", [](const proxy::Proxy& p) {
        nb::dict d;
        for (const auto& [name, value] : p.transport_counters()) d[name.c_str()] = value;
        return d;
      }, "Named transport event counts summed over threads (e.g. the fault decorator's).")
      .def("push", [](proxy::Proxy& p, int f, uint64_t w0, uint64_t w1, double t) {
            nb::gil_scoped_release g;
            return p.push(f, cmd_of(w0, w1), t);
          }, nb::arg("fifo"), nb::arg("word0"), nb::arg("word1"), nb::arg("timeout_s"))
      .def("push_batch", [](proxy::Proxy& p, int f, nb::ndarray<const uint64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> cmds,
                            double t) {
            if (cmds.shape(1) != 2) throw std::invalid_argument("push_batch: expected commands of shape [n, 2]");
            const uint64_t* w = cmds.data();
            const size_t n = cmds.shape(0);
            uint64_t last = 0;
            nb::gil_scoped_release g;
            for (size_t i = 0; i < n; ++i) last = p.push(f, cmd_of(w[2 * i], w[2 * i + 1]), t);
            return last;
          }, nb::arg("fifo"), nb::arg("commands"), nb::arg("timeout_s"), "Pushes rows in order; returns the last index.")
      .def("wait_completion", &proxy::Proxy::wait_completion, nb::arg("fifo"), nb::arg("index"), nb::arg("timeout_s"),
           nb::arg("phase"), nb::call_guard<nb::gil_scoped_release>())
      .def("fifo_layout", [](proxy::Proxy& p, int f) {
        if (f < 0 || f >= p.num_fifos()) throw std::out_of_range("fifo index out of range");
        const fifo::HostFifo& q = p.fifo(f);
        const fifo::FifoLayout& l = q.layout();
        auto addr = [](const void* ptr) { return uint64_t(reinterpret_cast<uintptr_t>(ptr)); };
        nb::dict d;
        d["memory"] = addr(q.memory());
        d["memory_bytes"] = uint64_t(q.memory_bytes());
        d["slots"] = addr(l.slots);
        d["head"] = addr(l.head);
        d["tail"] = addr(l.tail);
        d["tail_cache"] = addr(l.tail_cache);
        d["completed"] = addr(l.completed);
        d["status"] = addr(l.status);
        d["capacity"] = l.capacity;
        d["capacity_log2"] = l.capacity_log2;
        return d;
      }, nb::arg("fifo"),
      "Addresses of one FIFO (fifo_layout.h) for a GPU runtime: register `memory` (mapped) and hand "
      "kernels a FifoLayout with device-side head/tail_cache.")
      .def("copy_rings", [](const proxy::Proxy& p) {
        nb::list out;
        for (const auto& r : p.copy_rings()) {
          if (r.empty()) {
            out.append(nb::none());
            continue;
          }
          nb::dict d;
          d["memory"] = r[0];
          d["memory_bytes"] = r[1];
          d["capacity"] = r[2];
          out.append(d);
        }
        return out;
      }, "Per proxy thread, the copy ring (dma_ring.h) its ipc endpoint waits on: {memory, memory_bytes, "
         "capacity}, or None (every backend but ipc with ipc_copy='kernel'). Register `memory` for the device.")
      .def("check_completion", [](proxy::Proxy& p, int f, uint64_t idx) {
        if (f < 0 || f >= p.num_fifos()) throw std::out_of_range("fifo index out of range");
        return p.fifo(f).check_completion(idx);
      }, nb::arg("fifo"), nb::arg("index"))
      .def("counter", &proxy::Proxy::counter)
      .def("wait_counter", &proxy::Proxy::wait_counter, nb::arg("src"), nb::arg("counter"), nb::arg("target"),
           nb::arg("timeout_s"), nb::arg("phase"), nb::call_guard<nb::gil_scoped_release>())
      .def("reset_counters", &proxy::Proxy::reset_counters)
      .def("counters", [](proxy::Proxy& p) {
        const proxy::ProxyConfig& c = p.config();
        return nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>(p.counters(), {size_t(c.num_ranks), size_t(c.num_counters)},
                                                            nb::find(&p));
      }, "int64 [num_ranks, num_counters] view (owned by the proxy).")
      .def("region", [](proxy::Proxy& p) {
        return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(p.region(), {size_t(p.region_bytes())}, nb::find(&p));
      }, "uint8 view of this rank's registered region (owned by the proxy).")
      .def(
          "run_load",
          [](proxy::Proxy& p, int producers, uint64_t per_producer, int dst, uint32_t write_bytes, uint64_t src_off,
             uint64_t dst_off, uint32_t slots, bool fence, double timeout_s) {
            proxy::LoadSpec s;
            s.producers = producers;
            s.per_producer = per_producer;
            s.dst = dst;
            s.write_bytes = write_bytes;
            s.src_off = src_off;
            s.dst_off = dst_off;
            s.slots = slots < 1 ? 1 : slots;
            s.fence = fence;
            s.timeout_s = timeout_s;
            proxy::LoadResult r;
            {
              nb::gil_scoped_release g;
              r = proxy::run_load(p, s);
            }
            return nb::make_tuple(r.commands, r.seconds);
          },
          nb::arg("producers"), nb::arg("per_producer"), nb::arg("dst") = -1, nb::arg("write_bytes") = 0,
          nb::arg("src_off") = 0, nb::arg("dst_off") = 0, nb::arg("slots") = 1, nb::arg("fence") = false,
          nb::arg("timeout_s") = 60.0,
          "Host threads push commands into the FIFOs and wait for completion; returns (commands, seconds).")
      .def("set_excluded", &proxy::Proxy::set_excluded, nb::arg("peer"), nb::arg("excluded"),
           "Shrink mode: an excluded peer's failure marks it dead instead of failing the proxy.")
      .def("peer_dead", &proxy::Proxy::dead, nb::arg("peer"))
      .def_prop_ro("failed", &proxy::Proxy::failed)
      .def("raise_if_failed", &proxy::Proxy::throw_if_failed);
}

}  // namespace uccl_ep::bindings
