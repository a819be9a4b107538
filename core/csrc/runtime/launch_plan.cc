#include "runtime/launch_plan.h"

#include <cstdio>
#include <exception>

#include "runtime/cuda_driver.h"

namespace uccl_ep::runtime {

int issue_launch_plan(const LaunchPlan* plan, uint32_t grid_x, const void* params, uint64_t stream, int programmatic,
                      char* err, size_t err_len) {
  try {
    const unsigned grid[3] = {grid_x, 1, 1}, block[3] = {plan->block, 1, 1};
    cu::launch(plan->device, reinterpret_cast<cu::CUfunction>(plan->function), grid, block, plan->smem,
               reinterpret_cast<cu::CUstream>(stream), params, 8 * plan->num_fields, false, programmatic != 0);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
    return 1;
  }
}

}  // namespace uccl_ep::runtime
