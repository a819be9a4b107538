#include "bindings/register.h"

namespace uccl_ep::bindings {

void register_runtime(nanobind::module_& m);
void register_protocol(nanobind::module_& m);
void register_fifo(nanobind::module_& m);
void register_proxy(nanobind::module_& m);
void register_executor(nanobind::module_& m);
void register_ipc(nanobind::module_& m);
void register_op_plan(nanobind::module_& m);

// NOTES: subsystems add a declaration here and one call below; keeping the list in one small
// file makes the module's surface reviewable at a glance.
void register_all(nanobind::module_& m) {
  register_runtime(m);
  register_op_plan(m);  // into the cuda submodule register_runtime made
  register_proxy(m);
  register_protocol(m);
  register_fifo(m);
  register_executor(m);
  register_ipc(m);
}

}  // namespace uccl_ep::bindings
