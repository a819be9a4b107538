// A two-phase op's launches prepared once and issued per call with a few 8-byte fields patched in.
//
// Made and owned by the bindings (`uccl_ep._C.cuda.OpPlan`, torch-free), issued by the torch op
// library (csrc/torch_ops: allocation, patching and both launches in one call of an eager op) or
// by the bindings themselves (tests). Plain data: both libraries compile this header, and the
// launch itself goes through `issue`, the bindings' runtime, so there is one driver per process.
//
// NOTES: every kernel parameter struct is a sequence of 8-byte fields (kernel_abi.h), so a
// per-call value is named by its field index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace uccl_ep::runtime {

inline constexpr uint32_t kMaxPlanParamBytes = 1024;
inline constexpr uint32_t kMaxPlanSlots = 8;
inline constexpr uint32_t kPlanShapeWords = 8;

struct LaunchPlan;
// Issues `plan` on `stream` with parameter bytes `params` and grid (grid_x, 1, 1): 0, or nonzero
// with the driver's message in `err` (never throws: it crosses a library boundary).
using IssueFn = int (*)(const LaunchPlan* plan, uint32_t grid_x, const void* params, uint64_t stream,
                        int programmatic, char* err, size_t err_len);

struct LaunchPlan {
  uint64_t function;  // a function handle of the bindings' runtime (module_function)
  int32_t device;
  uint32_t block;
  uint32_t smem;
  uint32_t num_fields;  // 8-byte fields of the parameter struct
  uint32_t num_slots;   // per-call fields, in the order the caller gives their values
  uint32_t slots[kMaxPlanSlots];
  alignas(8) uint8_t params[kMaxPlanParamBytes];  // the fixed fields; per-call ones are patched
};

// What one eager op needs beyond its two launches: the words its output allocation reads
// (their meaning is the op's: torch_ops/ll_ops.cc) and the error word checked before the receive.
struct OpPlan {
  IssueFn issue;
  const volatile int32_t* error_word;  // host-mapped ErrorWord::code; nonzero: do not launch on
  LaunchPlan send, recv;
  int64_t shape[kPlanShapeWords];
};

// What both libraries must agree on to share an OpPlan by address: the layout's version and size.
// The torch op library reports its own (`uccl_ep::op_plan_abi`), the bindings theirs
// (`_C.cuda.op_plan_abi`), and uccl_ep.cuda.native_ops uses the ops only when they match (a stale
// `_ops.so` beside a newer `_C` is refused, not trusted).
inline constexpr int64_t kOpPlanAbiVersion = 1;
inline constexpr int64_t op_plan_abi() { return (kOpPlanAbiVersion << 32) | static_cast<int64_t>(sizeof(OpPlan)); }

// The parameter bytes of `plan` with `values` (plan.num_slots of them) in its per-call fields.
inline void fill_params(const LaunchPlan& plan, const int64_t* values, uint8_t* out) {
  std::memcpy(out, plan.params, 8 * plan.num_fields);
  for (uint32_t i = 0; i < plan.num_slots; ++i) std::memcpy(out + 8 * plan.slots[i], &values[i], 8);
}

// The bindings' issuer (cuda_driver.cc's launch behind the exception boundary).
int issue_launch_plan(const LaunchPlan* plan, uint32_t grid_x, const void* params, uint64_t stream, int programmatic,
                      char* err, size_t err_len);

}  // namespace uccl_ep::runtime
