// Bindings of the proxy and the transport table (uccl_ep._C); the protocol encoders are in
// bind_protocol.cc, the host FIFO and the receiver in bind_fifo.cc.
//
// NOTES: every call that can wait releases the GIL; errors of the native core (EpError) become
// the matching uccl_ep.errors class, constructed by Python so messages and attributes are the
// same as errors raised in Python. Every argument is checked (bindings/args.h) before native code
// sees it: an index out of range here would read or write outside the proxy's arrays.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdio.h>

#include <algorithm>
#include <cmath>

#include "bindings/args.h"
#include "bindings/register.h"
#include "fifo/fifo_host.h"
#include "proxy/errors.h"
#include "proxy/proxy.h"
#include "proxy/proxy_bench.h"
#include "runtime/cuda_driver.h"
#include "transport/transport.h"
#include "uccl_ep/fifo_layout.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace nb = nanobind;

namespace uccl_ep::bindings {

namespace {

using protocol::TransferCmd;

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
        // Native details read "<argument>: expected <what>[, got <value>]"; InvalidArgument adds
        // its own "expected" and "got", so they are split off here instead of repeated.
        const std::string& d = i.detail;
        const size_t colon = d.find(": ");
        std::string argument = colon == std::string::npos ? std::string("argument") : d.substr(0, colon);
        std::string rest = colon == std::string::npos ? d : d.substr(colon + 2);
        if (rest.rfind("expected ", 0) == 0) rest = rest.substr(9);
        const size_t got_at = rest.rfind(", got ");
        nb::object got = nb::none();
        if (got_at != std::string::npos) {
          got = nb::str(rest.substr(got_at + 6).c_str());
          rest = rest.substr(0, got_at);
        }
        exc = errors.attr("InvalidArgument")(argument, rest, got);
        break;
      }
    }
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

// Whether [addr, addr + bytes) lies in readable and writable mappings of this process.
bool host_range_writable(uint64_t addr, uint64_t bytes) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (f == nullptr) return true;  // cannot tell: leave it to the caller's contract
  uint64_t at = addr;
  const uint64_t end = addr + bytes;
  char line[512];
  std::vector<std::pair<uint64_t, uint64_t>> rw;
  while (fgets(line, sizeof line, f) != nullptr) {
    unsigned long long lo = 0, hi = 0;
    char perms[8] = {0};
    if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r' && perms[1] == 'w')
      rw.emplace_back(lo, hi);
  }
  fclose(f);
  std::sort(rw.begin(), rw.end());
  for (const auto& [lo, hi] : rw) {
    if (lo > at) break;
    if (hi > at) at = hi;
    if (at >= end) return true;
  }
  return at >= end;
}

proxy::ProxyConfig config_from(nb::handle h) {
  if (!nb::isinstance<nb::dict>(h)) raise_invalid("config", "a dict of proxy options", text_of(h));
  nb::dict d = nb::borrow<nb::dict>(h);
  static const char* known[] = {"rank", "num_ranks", "ranks_per_node", "num_threads", "fifos_per_thread",
                                "fifo_capacity", "num_counters", "region_bytes", "external_region", "transport", "ipc_copy",
                                "provider", "domains", "token_digest", "max_inflight", "timeout_s", "heartbeat_s",
                                "idle_sleep_ns", "check_remote_bounds", "cpus", "fault_seed", "fault_reorder",
                                "fault_max_delay", "fault_tear", "fault_max_pieces"};
  for (auto item : d) {
    if (!nb::isinstance<nb::str>(item.first)) raise_invalid("config", "option names of type str", text_of(item.first));
    const std::string k = nb::cast<std::string>(item.first);
    bool ok = false;
    for (const char* kk : known) ok |= k == kk;
    if (!ok) raise_invalid("config", "known proxy options", "unknown proxy option '" + k + "'");
  }
  proxy::ProxyConfig c;
  constexpr int64_t kInt = (int64_t(1) << 31) - 1;
  auto i32 = [&](const char* k, int& field) {
    if (d.contains(k)) field = int(int_arg(d[k], k, -kInt - 1, kInt));
  };
  auto u32 = [&](const char* k, uint32_t& field) {
    if (d.contains(k)) field = uint32_t(u64_arg(d[k], k, 0xFFFFFFFFull));
  };
  auto u64 = [&](const char* k, uint64_t& field) {
    if (d.contains(k)) field = u64_arg(d[k], k, ~uint64_t(0));
  };
  auto str = [&](const char* k, std::string& field) {
    if (d.contains(k)) field = str_arg(d[k], k);
  };
  auto real = [&](const char* k, double& field, double lo, double hi) {
    if (!d.contains(k)) return;
    nb::handle v = d[k];
    const std::string expected = "a finite number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr())))
      raise_invalid(k, expected, text_of(v));
    const double x = PyFloat_AsDouble(v.ptr());
    if (PyErr_Occurred()) PyErr_Clear();
    if (!std::isfinite(x) || x < lo || x > hi) raise_invalid(k, expected, text_of(v));
    field = x;
  };
  i32("rank", c.rank);
  i32("num_ranks", c.num_ranks);
  i32("ranks_per_node", c.ranks_per_node);
  i32("num_threads", c.num_threads);
  i32("fifos_per_thread", c.fifos_per_thread);
  u32("fifo_capacity", c.fifo_capacity);
  u32("num_counters", c.num_counters);
  u64("region_bytes", c.region_bytes);
  u64("external_region", c.external_region);
  str("transport", c.transport);
  str("ipc_copy", c.ipc_copy);
  str("provider", c.provider);
  str("domains", c.domains);
  str("token_digest", c.token_digest);
  u32("max_inflight", c.max_inflight);
  if (d.contains("timeout_s")) c.timeout_s = timeout_arg(d["timeout_s"], "timeout_s");
  real("heartbeat_s", c.heartbeat_s, 0.0, 3600.0);
  if (d.contains("idle_sleep_ns")) c.idle_sleep_ns = int_arg(d["idle_sleep_ns"], "idle_sleep_ns", -1, 1000000000);
  if (d.contains("check_remote_bounds")) c.check_remote_bounds = bool_arg(d["check_remote_bounds"], "check_remote_bounds");
  str("cpus", c.cpus);
  u64("fault_seed", c.fault_seed);
  real("fault_reorder", c.fault_reorder, 0.0, 1.0);
  if (d.contains("fault_max_delay"))
    c.fault_max_delay = uint32_t(u64_arg(d["fault_max_delay"], "fault_max_delay", 1u << 20, "polls a write may be held"));
  real("fault_tear", c.fault_tear, 0.0, 1.0);
  if (d.contains("fault_max_pieces"))
    c.fault_max_pieces = uint32_t(int_arg(d["fault_max_pieces"], "fault_max_pieces", 2, 64, "pieces of a torn write"));
  if (c.fifo_capacity < fifo::kMinCapacity || (c.fifo_capacity & (c.fifo_capacity - 1)) != 0 ||
      c.fifo_capacity > (uint32_t(1) << fifo::kMaxCapacityLog2))
    raise_invalid("fifo_capacity", "a power of two in [" + std::to_string(fifo::kMinCapacity) + ", " +
                                       std::to_string(uint32_t(1) << fifo::kMaxCapacityLog2) + "]",
                  std::to_string(c.fifo_capacity));
  if (c.external_region != 0) {
    // NOTES: a forged address would be written by peers' transfers; accept only memory this
    // process maps read-write (or CUDA device memory, which the driver vouches for).
    const bool device = runtime::cu::available(nullptr) &&
                        runtime::cu::pointer_memory_type(c.external_region) == runtime::cu::kMemoryTypeDevice;
    if (!device && (c.region_bytes == 0 || c.external_region + c.region_bytes < c.external_region ||
                    !host_range_writable(c.external_region, c.region_bytes)))
      raise_invalid("external_region", "the address of region_bytes of memory this process maps read-write (or CUDA "
                                       "device memory)",
                    std::to_string(c.external_region) + " with region_bytes " + std::to_string(c.region_bytes));
  }
  return c;
}

int fifo_arg(const proxy::Proxy& p, nb::handle v) {
  return int(int_arg(v, "fifo", 0, p.num_fifos() - 1));
}
int rank_arg(const proxy::Proxy& p, nb::handle v, const char* name) {
  return int(int_arg(v, name, 0, p.config().num_ranks - 1));
}
uint32_t counter_arg(const proxy::Proxy& p, nb::handle v) {
  return uint32_t(int_arg(v, "counter", 0, int64_t(p.config().num_counters) - 1));
}
uint64_t pushed_index_arg(proxy::Proxy& p, int f, nb::handle v) {
  const uint64_t idx = u64_arg(v, "index", ~uint64_t(0));
  // NOTES: an index that was never pushed would be waited for until the timeout: refuse at once.
  const uint64_t reserved = p.fifo(f).reserved();
  if (idx >= reserved)
    raise_invalid("index", "an index pushed into fifo " + std::to_string(f) + " (< " + std::to_string(reserved) + ")",
                  std::to_string(idx));
  return idx;
}

}  // namespace

void register_proxy(nb::module_& m) {
  nb::register_exception_translator(&translate, nullptr);

  m.def("transport_backends", &transport::backend_names, "Names in the transport table (csrc/transport/registry.cc).");
  m.def("transport_unavailable_reason", [](nb::handle name) { return transport::unavailable_reason(str_arg(name, "name")); },
        any_arg("name"), "'' when the transport can be created on this machine, else why not.");
  m.def("fabric_domain_pci", [](nb::handle prov) { return transport::fabric_domain_pci(str_arg(prov, "provider")); },
        any_arg("provider") = "", "(NIC name, PCI address or '') of a provider's domains usable by the fabric transport.");
  m.def("fabric_domains", [](nb::handle prov) { return transport::fabric_domains(str_arg(prov, "provider")); },
        any_arg("provider") = "", "NICs (libfabric domain names) of a provider usable by the fabric transport, in its order.");
  m.def(
      "fabric_probe",
      [](nb::handle provider, nb::handle domain, nb::handle device) {
        const std::string prov = str_arg(provider, "provider"), dom = str_arg(domain, "domain");
        const int dev = int(int_arg(device, "hmem_cuda_device", -1, 1023));
        std::string why;
        std::string name = transport::fabric_probe(prov, dom, dev, &why);
        return std::make_pair(name, why);
      },
      any_arg("provider") = "", any_arg("domain") = "", any_arg("hmem_cuda_device") = -1,
      "(endpoint name, '') if the fabric transport opens here for a host region (or, with hmem_cuda_device >= 0, "
      "one in that GPU's memory: FI_HMEM), else ('', why). Registers and connects nothing.");
  nb::class_<proxy::Proxy>(m, "Proxy", "The CPU proxy of one rank (see csrc/proxy/proxy.h).")
      .def("__init__", [](proxy::Proxy* p, nb::handle cfg) { new (p) proxy::Proxy(config_from(cfg)); }, any_arg("config"))
      .def("local_info", [](const proxy::Proxy& p) {
        const std::vector<uint8_t> b = p.local_info();
        return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      })
      .def("connect", [](proxy::Proxy& p, nb::handle infos) {
        if (!nb::isinstance<nb::list>(infos) && !nb::isinstance<nb::tuple>(infos))
          raise_invalid("infos", "a list of every rank's local_info() bytes", text_of(infos));
        std::vector<std::vector<uint8_t>> v;
        size_t i = 0;
        for (nb::handle b : infos) {
          if (!nb::isinstance<nb::bytes>(b))
            raise_invalid("infos[" + std::to_string(i) + "]", "bytes from Proxy.local_info()",
                          std::string(Py_TYPE(b.ptr())->tp_name));
          const nb::bytes bb = nb::borrow<nb::bytes>(b);
          const auto* s = static_cast<const uint8_t*>(bb.data());
          v.emplace_back(s, s + bb.size());
          ++i;
        }
        nb::gil_scoped_release g;
        p.connect(v);
      }, any_arg("infos"))
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
      .def("transport_trace", [](const proxy::Proxy& p) {
        const std::vector<int64_t> flat = p.transport_trace();
        nb::list rows;
        const size_t width = size_t(transport::Transport::kTraceFields) + 1;
        for (size_t i = 0; i + width <= flat.size(); i += width) {
          nb::list row;
          for (size_t k = 0; k < width; ++k) row.append(flat[i + k]);
          rows.append(row);
        }
        return rows;
      }, "The transport's recorded events as rows [thread, kind, t_ns, a, b, c, d, e] (NIC model trace=N).")
      .def("push", [](proxy::Proxy& p, nb::handle f, nb::handle w0, nb::handle w1, nb::handle t) {
            const int fifo = fifo_arg(p, f);
            const TransferCmd c{u64_arg(w0, "word0", ~uint64_t(0)), u64_arg(w1, "word1", ~uint64_t(0))};
            const double timeout = timeout_arg(t, "timeout_s");
            nb::gil_scoped_release g;
            return p.push(fifo, c, timeout);
          }, any_arg("fifo"), any_arg("word0"), any_arg("word1"), any_arg("timeout_s"))
      .def("push_batch", [](proxy::Proxy& p, nb::handle f, nb::handle cmds_h, nb::handle t) {
            const int fifo = fifo_arg(p, f);
            using Cmds = nb::ndarray<const uint64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
            Cmds cmds;
            if (!nb::try_cast(cmds_h, cmds, false) || cmds.shape(1) != 2)
              raise_invalid("commands", "a C-contiguous uint64 array of shape [n, 2] on the CPU",
                            text_of(cmds_h).substr(0, 200));
            const double timeout = timeout_arg(t, "timeout_s");
            const uint64_t* w = cmds.data();
            const size_t n = cmds.shape(0);
            if (n == 0) raise_invalid("commands", "at least one row", "an empty array");
            uint64_t last = 0;
            nb::gil_scoped_release g;
            for (size_t i = 0; i < n; ++i) last = p.push(fifo, TransferCmd{w[2 * i], w[2 * i + 1]}, timeout);
            return last;
          }, any_arg("fifo"), any_arg("commands"), any_arg("timeout_s"), "Pushes rows in order; returns the last index.")
      .def("wait_completion", [](proxy::Proxy& p, nb::handle f, nb::handle idx, nb::handle t, nb::handle phase) {
            const int fifo = fifo_arg(p, f);
            const uint64_t index = pushed_index_arg(p, fifo, idx);
            const double timeout = timeout_arg(t, "timeout_s");
            const std::string ph = str_arg(phase, "phase");
            nb::gil_scoped_release g;
            p.wait_completion(fifo, index, timeout, ph);
          }, any_arg("fifo"), any_arg("index"), any_arg("timeout_s"), any_arg("phase"))
      .def("fifo_layout", [](proxy::Proxy& p, nb::handle fh) {
        const fifo::HostFifo& q = p.fifo(fifo_arg(p, fh));
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
      }, any_arg("fifo"),
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
      .def("check_completion", [](proxy::Proxy& p, nb::handle fh, nb::handle idx) {
        const int f = fifo_arg(p, fh);
        return p.fifo(f).check_completion(u64_arg(idx, "index", ~uint64_t(0)));
      }, any_arg("fifo"), any_arg("index"))
      .def("counter", [](proxy::Proxy& p, nb::handle src, nb::handle c) {
        return p.counter(rank_arg(p, src, "src"), counter_arg(p, c));
      }, any_arg("src"), any_arg("counter"))
      .def("wait_counter", [](proxy::Proxy& p, nb::handle src, nb::handle c, nb::handle target, nb::handle t,
                              nb::handle phase) {
            const int s = rank_arg(p, src, "src");
            const uint32_t ctr = counter_arg(p, c);
            const int64_t tgt = int_arg(target, "target", INT64_MIN, INT64_MAX);
            const double timeout = timeout_arg(t, "timeout_s");
            const std::string ph = str_arg(phase, "phase");
            nb::gil_scoped_release g;
            return p.wait_counter(s, ctr, tgt, timeout, ph);
          }, any_arg("src"), any_arg("counter"), any_arg("target"), any_arg("timeout_s"), any_arg("phase"))
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
          [](proxy::Proxy& p, nb::handle producers, nb::handle per_producer, nb::handle dst, nb::handle write_bytes,
             nb::handle src_off, nb::handle dst_off, nb::handle slots, nb::handle fence, nb::handle timeout_s) {
            proxy::LoadSpec s;
            s.producers = int(int_arg(producers, "producers", 1, 256, "producer threads"));
            s.per_producer = u64_arg(per_producer, "per_producer", uint64_t(1) << 32, "commands per producer");
            s.dst = int(int_arg(dst, "dst", -1, p.config().num_ranks - 1));
            s.write_bytes = uint32_t(u64_arg(write_bytes, "write_bytes", protocol::limits::kMaxWriteBytes,
                                             "bytes of one write (24-bit len field)"));
            s.src_off = offset_arg(src_off, "src_off");
            s.dst_off = offset_arg(dst_off, "dst_off");
            s.slots = uint32_t(int_arg(slots, "slots", 1, int64_t(1) << 24));
            s.fence = bool_arg(fence, "fence");
            s.timeout_s = timeout_arg(timeout_s, "timeout_s");
            if (s.slots > 1 && s.write_bytes % protocol::kOffsetUnitBytes)
              raise_invalid("write_bytes", "a multiple of 16 when slots > 1 (slot offsets travel in 16-byte units)",
                            std::to_string(s.write_bytes));
            if (s.dst_off + uint64_t(s.slots) * s.write_bytes > protocol::limits::kMaxRegionBytes)
              raise_invalid("slots", "dst_off + slots * write_bytes within the 32 GiB an offset field addresses",
                            std::to_string(s.slots));
            proxy::LoadResult r;
            {
              nb::gil_scoped_release g;
              r = proxy::run_load(p, s);
            }
            return nb::make_tuple(r.commands, r.seconds);
          },
          any_arg("producers"), any_arg("per_producer"), any_arg("dst") = -1, any_arg("write_bytes") = 0,
          any_arg("src_off") = 0, any_arg("dst_off") = 0, any_arg("slots") = 1, any_arg("fence") = false,
          any_arg("timeout_s") = 60.0,
          "Host threads push commands into the FIFOs and wait for completion; returns (commands, seconds).")
      .def("set_excluded", [](proxy::Proxy& p, nb::handle peer, nb::handle on) {
            p.set_excluded(rank_arg(p, peer, "peer"), bool_arg(on, "excluded"));
          }, any_arg("peer"), any_arg("excluded"),
           "Shrink mode: an excluded peer's failure marks it dead instead of failing the proxy.")
      .def("peer_dead", [](const proxy::Proxy& p, nb::handle peer) { return p.dead(rank_arg(p, peer, "peer")); },
           any_arg("peer"))
      .def_prop_ro("failed", &proxy::Proxy::failed)
      .def("raise_if_failed", &proxy::Proxy::throw_if_failed);
}

}  // namespace uccl_ep::bindings
