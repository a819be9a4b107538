// Bindings of the GPU proxy path (uccl_ep/cuda/ll_proxy.py): where a proxy's FIFOs and counters
// live, the device-side FifoLayout table kernels push through, and the driver calls that make
// the proxy's host memory visible to kernels (`uccl_ep._C.cuda.host_register`, ...).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>

#include "bindings/args.h"
#include "bindings/register.h"
#include "proxy/proxy.h"
#include "runtime/cuda_driver.h"
#include "uccl_ep/fifo_layout.h"

namespace nb = nanobind;
namespace cu = uccl_ep::runtime::cu;

namespace uccl_ep::bindings {

namespace {

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

nb::dict fifo_layout(nb::handle proxy_h, nb::handle index_h) {
  proxy::Proxy& p = proxy_arg(proxy_h);
  const int index = int(int_arg(index_h, "index", 0, p.num_fifos() - 1));
  const fifo::FifoLayout& f = p.fifo(index).layout();
  nb::dict d;
  d["slots"] = addr(f.slots);
  d["head"] = addr(f.head);
  d["tail"] = addr(f.tail);
  d["tail_cache"] = addr(f.tail_cache);
  d["completed"] = addr(f.completed);
  d["status"] = addr(f.status);
  d["capacity"] = f.capacity;
  d["capacity_log2"] = f.capacity_log2;
  d["slots_end"] = addr(f.slots + f.capacity);
  return d;
}

// One FifoLayout as kernels read it (the struct of fifo_layout.h, packed by the compiler that
// also compiles the proxy, so Python never restates its layout).
nb::bytes pack_fifo_layout(nb::handle slots_h, nb::handle head_h, nb::handle tail_h, nb::handle tail_cache_h,
                           nb::handle completed_h, nb::handle status_h, nb::handle capacity_h, nb::handle log2_h) {
  const uint64_t kAddr = ~uint64_t(0);
  const uint64_t slots = u64_arg(slots_h, "slots", kAddr), head = u64_arg(head_h, "head", kAddr),
                 tail = u64_arg(tail_h, "tail", kAddr), tail_cache = u64_arg(tail_cache_h, "tail_cache", kAddr),
                 completed = u64_arg(completed_h, "completed", kAddr), status = u64_arg(status_h, "status", kAddr);
  const uint32_t capacity_log2 = uint32_t(int_arg(log2_h, "capacity_log2", 1, fifo::kMaxCapacityLog2));
  const uint64_t capacity = u64_arg(capacity_h, "capacity", uint64_t(1) << fifo::kMaxCapacityLog2, "FIFO slots");
  if (capacity != (uint64_t(1) << capacity_log2))
    raise_invalid("capacity", "2 ** capacity_log2 (" + std::to_string(uint64_t(1) << capacity_log2) + ")",
                  std::to_string(capacity));
  for (uint64_t a : {slots, head, tail, tail_cache, completed, status})
    if (a == 0 || a % 8) raise_invalid("address", "non-null 8-byte-aligned addresses of the FIFO words", std::to_string(a));
  fifo::FifoLayout f{};
  f.slots = reinterpret_cast<protocol::TransferCmd*>(slots);
  f.head = reinterpret_cast<uint64_t*>(head);
  f.tail = reinterpret_cast<uint64_t*>(tail);
  f.tail_cache = reinterpret_cast<uint64_t*>(tail_cache);
  f.completed = reinterpret_cast<uint64_t*>(completed);
  f.status = reinterpret_cast<uint64_t*>(status);
  f.capacity = uint32_t(capacity);
  f.capacity_log2 = capacity_log2;
  char raw[sizeof f];
  std::memcpy(raw, &f, sizeof f);
  return nb::bytes(raw, sizeof raw);
}

}  // namespace

void register_ipc(nb::module_& m) {
  m.def("proxy_fifo_layout", &fifo_layout, any_arg("proxy"), any_arg("index"),
        "Host addresses of one FIFO of a Proxy (slots, head, tail, tail_cache, completed, status).");
  m.def("proxy_counters_address", [](nb::handle h) {
    proxy::Proxy& p = proxy_arg(h);
    const proxy::ProxyConfig& c = p.config();
    return nb::make_tuple(addr(p.counters()), uint64_t(c.num_ranks) * c.num_counters * sizeof(int64_t));
  }, any_arg("proxy"), "(address, bytes) of the proxy's int64 [num_ranks, num_counters] counters.");
  m.def("proxy_region_address", [](nb::handle h) { return addr(proxy_arg(h).region()); }, any_arg("proxy"));
  m.def("pack_fifo_layout", &pack_fifo_layout, any_arg("slots"), any_arg("head"), any_arg("tail"),
        any_arg("tail_cache"), any_arg("completed"), any_arg("status"), any_arg("capacity"), any_arg("capacity_log2"));
  m.attr("FIFO_LAYOUT_BYTES") = sizeof(fifo::FifoLayout);

  nb::module_ c = nb::cast<nb::module_>(m.attr("cuda"));
  c.def("host_register", [](int device, uint64_t ptr, size_t bytes) {
    return static_cast<uint64_t>(cu::host_register(device, reinterpret_cast<void*>(ptr), bytes));
  }, any_arg("device"), any_arg("ptr"), any_arg("bytes"),
     "Page-lock existing host memory and map it for the device; returns the device address of ptr.");
  c.def("host_unregister", [](int device, uint64_t ptr) { cu::host_unregister(device, reinterpret_cast<void*>(ptr)); });
  c.def("host_device_pointer", [](int device, uint64_t ptr) {
    return static_cast<uint64_t>(cu::host_device_pointer(device, reinterpret_cast<void*>(ptr)));
  }, any_arg("device"), any_arg("ptr"), "Device address of a byte of registered host memory.");
  c.def("pointer_memory_type", [](uint64_t ptr) { return cu::pointer_memory_type(ptr); });
  c.attr("MEMORY_TYPE_DEVICE") = cu::kMemoryTypeDevice;
  c.attr("MEMORY_TYPE_HOST") = cu::kMemoryTypeHost;
}

}  // namespace uccl_ep::bindings
