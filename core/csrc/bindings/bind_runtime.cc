// Bindings of the lazy GPU runtime (CUDA driver or HIP runtime): `uccl_ep._C.cuda`.
//
// NOTES: pointers, streams, modules and functions cross as Python ints; kernel parameters as
// one bytes object (the kernel's by-value parameter struct, packed by uccl_ep.cuda.params).
// Driver failures raise uccl_ep.errors.DeviceError("<call>: <CUDA_ERROR_NAME> (...)", with the call,
// status, name and text as attributes; a RuntimeError); a missing driver raises
// uccl_ep.errors.MissingDependency (an ImportError). Addresses are the caller's: this module
// is the raw driver layer under uccl_ep.cuda, which owns every pointer it passes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

#include "bindings/args.h"
#include "bindings/register.h"
#include "runtime/cuda_driver.h"
#include "uccl_ep/kernel_abi.h"

namespace nb = nanobind;
namespace cu = uccl_ep::runtime::cu;

namespace uccl_ep::bindings {

namespace {

// NOTES: module and function handles are addresses the driver dereferences; one that did not come
// from module_load / module_function (a forged or stale int) would crash inside the driver, so
// every handle this module hands out is recorded and every handle it takes is looked up.
struct Handles {
  std::mutex mu;
  std::unordered_set<uint64_t> modules, functions;
};
Handles& handles() {
  static Handles h;
  return h;
}
void record(std::unordered_set<uint64_t> Handles::*set, uint64_t v) {
  std::lock_guard<std::mutex> lock(handles().mu);
  (handles().*set).insert(v);
}
void require(std::unordered_set<uint64_t> Handles::*set, uint64_t v, const char* name, const char* from) {
  std::lock_guard<std::mutex> lock(handles().mu);
  if (!(handles().*set).count(v)) raise_invalid(name, std::string("a handle returned by ") + from, std::to_string(v));
}

}  // namespace

void require_known_function(uint64_t function, const char* name) {
  require(&Handles::functions, function, name, "module_function()");
}

void register_runtime(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("cuda", "lazy GPU runtime: libcuda or libamdhip64, loaded at first use");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const cu::DriverMissing& e) {
      // MissingDependency is an ImportError: callers that catch ImportError keep working.
      nb::object exc = nb::module_::import_("uccl_ep.errors").attr("MissingDependency")(std::string(e.what()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const cu::DriverError& e) {
      // DeviceError is a RuntimeError (UcclEpError): callers that catch RuntimeError keep working.
      nb::object exc = nb::module_::import_("uccl_ep.errors").attr("DeviceError")(e.call, e.code, e.name, e.description);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  m.def("available", []() {
    std::string why;
    bool ok = cu::available(&why);
    return std::make_tuple(ok, why);
  }, "(ok, why): whether the chosen GPU runtime (auto-chosen if none was) loads and initialises.");
  m.def("select_runtime", [](const std::string& which) {
    std::string why;
    bool ok = cu::select_runtime(which, &why);
    return std::make_tuple(ok, why);
  }, nb::arg("which"), "(ok, why) after choosing 'cuda', 'hip' or 'auto' for this process (once; see cuda_driver.h).");
  m.def("runtime_name", &cu::runtime_name, "'cuda', 'hip', or '' while none is chosen and usable.");
  m.def("probe_runtime", [](const std::string& which) {
    cu::RuntimeProbe p = cu::probe_runtime(which);
    nb::dict d;
    d["loadable"] = p.loadable;
    d["usable"] = p.usable;
    d["path"] = p.path;
    d["why"] = p.why;
    d["version"] = p.version;
    return d;
  }, nb::arg("which"), "What loading 'cuda' or 'hip' found: loadable, usable, path, why, version.");
  m.def("driver_version", &cu::driver_version);
  m.def("device_count", &cu::device_count);
  m.def("device_attribute", &cu::device_attribute, nb::arg("device"), nb::arg("attr"));
  m.def("can_access_peer", &cu::can_access_peer, nb::arg("device"), nb::arg("peer"));
  m.attr("ATTR_SM_COUNT") = cu::kDevAttrMultiprocessorCount;
  m.attr("ATTR_CC_MAJOR") = cu::kDevAttrCcMajor;
  m.attr("ATTR_CC_MINOR") = cu::kDevAttrCcMinor;
  m.attr("ATTR_MAX_SHARED_OPTIN") = cu::kDevAttrMaxSharedPerBlockOptin;

  m.def("mem_alloc", [](int device, size_t bytes) { return static_cast<uint64_t>(cu::mem_alloc(device, bytes)); });
  m.def("mem_free", [](int device, uint64_t ptr) { cu::mem_free(device, ptr); });
  m.def("host_alloc_mapped", [](int device, size_t bytes) {
    cu::CUdeviceptr d = 0;
    void* h = cu::host_alloc_mapped(device, bytes, &d);
    std::memset(h, 0, bytes);
    return std::make_tuple(reinterpret_cast<uint64_t>(h), static_cast<uint64_t>(d));
  }, "Zeroed pinned host memory mapped for the device: (host_ptr, device_ptr).");
  m.def("host_free", [](int device, uint64_t host_ptr) { cu::host_free(device, reinterpret_cast<void*>(host_ptr)); });
  m.def("memset_d8", [](int device, uint64_t ptr, int value, size_t bytes, uint64_t stream) {
    cu::memset_d8(device, ptr, static_cast<unsigned char>(value), bytes, reinterpret_cast<cu::CUstream>(stream));
  });
  m.def("memcpy_dtoh", [](int device, uint64_t src, size_t bytes) {
    cu::use_device(device);  // the driver first: no host buffer for a call that cannot run
    if (bytes > (size_t(1) << 34))
      raise_invalid("bytes", "at most 16 GiB per copy into a Python bytes object", std::to_string(bytes));
    std::string out(bytes, '\0');
    cu::memcpy_dtoh(device, out.data(), src, bytes);
    return nb::bytes(out.data(), out.size());
  });
  m.def("memcpy_htod", [](int device, uint64_t dst, nb::bytes data) {
    cu::memcpy_htod(device, dst, data.c_str(), data.size());
  });
  m.def("synchronize", &cu::synchronize);
  m.def("memcpy_dtod_async_batch", [](int device, uint64_t stream, nb::bytes triples) {
    // packed little-endian u64 {dst, src, bytes} per copy, issued in order on `stream` (one call
    // from Python for a whole combine's copy-engine work: ht_ce.py)
    if (triples.size() % 24 != 0) raise_invalid("triples", "24 bytes per copy", std::to_string(triples.size()));
    cu::use_device(device);
    const auto* w = reinterpret_cast<const uint64_t*>(triples.c_str());
    for (size_t i = 0; i < triples.size() / 24; ++i)
      cu::memcpy_dtod_async(w[3 * i], w[3 * i + 1], w[3 * i + 2], reinterpret_cast<cu::CUstream>(stream));
  }, "Copies (device or peer-mapped addresses) on a stream, in order: copy engines do them.");
  m.def("ce_chain", [](int device, uint64_t stream, uint64_t wait_function, nb::bytes records) {
    // 12 little-endian u64 per step, issued in order on `stream`: {0, dst, src, bytes, ...} a copy;
    // {1, -, -, -, p0..p7} a one-thread launch of `wait_function` with the 64-byte parameter
    // struct p0..p7 (ht_ce_wait: the copy after it waits for a peer's flag, bounded). ht_ce.py.
    constexpr size_t kWords = 12;
    if (records.size() % (8 * kWords) != 0) raise_invalid("records", "96 bytes per step", std::to_string(records.size()));
    require(&Handles::functions, wait_function, "wait_function", "module_function()");
    cu::use_device(device);
    const auto* w = reinterpret_cast<const uint64_t*>(records.c_str());
    const unsigned grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    for (size_t i = 0; i < records.size() / (8 * kWords); ++i, w += kWords) {
      if (w[0] == 0)
        cu::memcpy_dtod_async(w[1], w[2], w[3], reinterpret_cast<cu::CUstream>(stream));
      else
        cu::launch(device, reinterpret_cast<cu::CUfunction>(wait_function), grid, block, 0,
                   reinterpret_cast<cu::CUstream>(stream), w + 4, 64, false, false);
    }
  }, "A stream's chain of copies and bounded one-thread waits (the copy-engine dispatch's receive side).");

  m.def("raise_host_error", [](uint64_t word, int code, int phase, int rank, int peer, int expert) {
    if (word == 0 || word % alignof(uccl_ep::ErrorWord) != 0)
      raise_invalid("word", "the host address of an ErrorWord (kernel_abi.h)", std::to_string(word));
    if (code <= 0) raise_invalid("code", "an ErrorCode > 0 (kernel_abi.h)", std::to_string(code));
    auto* e = reinterpret_cast<uccl_ep::ErrorWord*>(word);
    // As a kernel's raise_error (device/wait.cuh): the first error wins. The claim (-1) keeps a
    // kernel from filling the fields meanwhile; the fields are released with the code.
    int expected = 0;
    if (!__atomic_compare_exchange_n(&e->code, &expected, -1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return false;
    e->phase = phase;
    e->rank = rank;
    e->peer = peer;
    e->expert = expert;
    e->waited_us = 0;
    __atomic_store_n(&e->code, code, __ATOMIC_RELEASE);
    return true;
  }, nb::arg("word"), nb::arg("code"), nb::arg("phase"), nb::arg("rank"), nb::arg("peer"), nb::arg("expert") = -1,
     "Record an error in an ErrorWord (mapped host memory) from the host, as a kernel's raise_error does: "
     "True if it was the first; the kernels' bounded waits end once they see it.");

  m.def("ipc_get_handle", [](int device, uint64_t ptr) {
    cu::CUipcMemHandle h = cu::ipc_get_handle(device, ptr);
    return nb::bytes(h.reserved, sizeof(h.reserved));
  });
  m.def("ipc_open_handle", [](int device, nb::bytes handle) {
    if (handle.size() != sizeof(cu::CUipcMemHandle))
      raise_invalid("handle", "a 64-byte CUDA IPC handle", std::to_string(handle.size()) + " bytes");
    cu::CUipcMemHandle h;
    std::memcpy(h.reserved, handle.c_str(), sizeof(h.reserved));
    return static_cast<uint64_t>(cu::ipc_open_handle(device, h));
  });
  m.def("ipc_close_handle", [](int device, uint64_t ptr) { cu::ipc_close_handle(device, ptr); });

  m.def("module_load", [](int device, nb::bytes image) {
    const uint64_t mod = reinterpret_cast<uint64_t>(cu::module_load(device, image.c_str()));
    record(&Handles::modules, mod);
    return mod;
  }, "Load a cubin/fatbin (CUDA) or code object (HIP) image; the module stays loaded for the life of the process.");
  m.def("module_function", [](uint64_t module, const std::string& name) {
    require(&Handles::modules, module, "module", "module_load()");
    const uint64_t f = reinterpret_cast<uint64_t>(cu::module_function(reinterpret_cast<cu::CUmodule>(module), name));
    record(&Handles::functions, f);
    return f;
  });
  m.def("function_set_max_dynamic_smem", [](uint64_t f, int bytes) {
    require(&Handles::functions, f, "function", "module_function()");
    cu::function_set_max_dynamic_smem(reinterpret_cast<cu::CUfunction>(f), bytes);
  });
  m.def("launch", [](int device, uint64_t f, std::tuple<unsigned, unsigned, unsigned> grid,
                     std::tuple<unsigned, unsigned, unsigned> block, unsigned smem, uint64_t stream,
                     nb::bytes params, bool cooperative, bool programmatic) {
    require(&Handles::functions, f, "function", "module_function()");
    const unsigned g[3] = {std::get<0>(grid), std::get<1>(grid), std::get<2>(grid)};
    const unsigned b[3] = {std::get<0>(block), std::get<1>(block), std::get<2>(block)};
    cu::launch(device, reinterpret_cast<cu::CUfunction>(f), g, b, smem, reinterpret_cast<cu::CUstream>(stream),
               params.c_str(), params.size(), cooperative, programmatic);
  }, nb::arg("device"), nb::arg("function"), nb::arg("grid"), nb::arg("block"), nb::arg("smem"), nb::arg("stream"),
     nb::arg("params"), nb::arg("cooperative") = false, nb::arg("programmatic") = false,
     "Launch (cuLaunchKernelEx / hipModuleLaunchKernel) of a kernel taking one by-value parameter struct "
     "(`params`) on `stream`; `programmatic`: programmatic dependent launch (may overlap the previous kernel "
     "on the stream; plain stream order on HIP).");
}

}  // namespace uccl_ep::bindings
