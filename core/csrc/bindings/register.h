// Per-subsystem binding registration. Each subsystem owns one `bind_<name>.cc` in this folder
// defining its register function; register_all() calls every one of them.
#pragma once
#include <nanobind/nanobind.h>

namespace uccl_ep::bindings {
void register_all(nanobind::module_& m);
}  // namespace uccl_ep::bindings
