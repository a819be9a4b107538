// nanobind module `uccl_ep._C`: the only native entry point of the package.
//
// NOTES: no libtorch linkage. Tensors cross this boundary as raw pointers + sizes (or dlpack),
// so one build works with any torch version the user has.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/register.h"
#include "runtime/dynlib.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "uccl_ep native core: queue, proxy, transports, runtime (no libtorch linkage)";
  m.def("version", []() { return std::string(UCCL_EP_VERSION); });
  m.def("build_info", []() {
    nb::dict d;
    d["version"] = UCCL_EP_VERSION;
    d["build_type"] = UCCL_EP_BUILD_TYPE;
    d["compiler"] = UCCL_EP_COMPILER;
    d["build_time"] = UCCL_EP_BUILD_TIME;
#ifdef UCCL_EP_HAVE_FABRIC_HEADERS
    d["fabric_headers"] = true;
#else
    d["fabric_headers"] = false;
#endif
    return d;
  });
  m.def(
      "probe_library",
      [](const std::string& name) {
        auto p = uccl_ep::runtime::probe_library(name);
        nb::dict d;
        d["name"] = p.name;
        d["loadable"] = p.loadable;
        d["path"] = p.path;
        d["error"] = p.error;
        d["version"] = p.version;
        return d;
      },
      nb::arg("name"),
      "dlopen one vendor library ('cuda', 'hip', 'fabric', 'ibverbs') and report what loaded.");

  // Each subsystem registers its own bindings (see bindings/register.h).
  uccl_ep::bindings::register_all(m);
}
