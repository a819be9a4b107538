#include "bindings/register.h"

namespace uccl_ep::bindings {

// NOTES: subsystems add a declaration here and one call below; keeping the list in one small
// file makes the module's surface reviewable at a glance.
void register_all(nanobind::module_& m) { (void)m; }

}  // namespace uccl_ep::bindings
