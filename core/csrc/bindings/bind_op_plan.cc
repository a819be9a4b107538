// Bindings of launch_plan.h: `uccl_ep._C.cuda.OpPlan`, an eager op's two launches prepared once
// (fixed parameter fields, per-call field indices, output shape words, the error word), issued by
// the torch op library (csrc/torch_ops), which takes the plan by address.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/args.h"
#include "runtime/launch_plan.h"

namespace nb = nanobind;
namespace rt = uccl_ep::runtime;

namespace uccl_ep::bindings {

void require_known_function(uint64_t function, const char* name);  // bind_runtime.cc

namespace {

// One launch from Python: (device, function, block, smem, params bytes, per-call field indices).
void fill_launch(rt::LaunchPlan& out, nb::handle spec, const char* name) {
  nb::tuple t;
  if (!nb::try_cast(spec, t) || t.size() != 6)
    raise_invalid(name, "(device, function, block, smem, params bytes, per-call field indices)", text_of(spec));
  out.device = static_cast<int32_t>(int_arg(t[0], "device", 0, 1 << 20));
  out.function = u64_arg(t[1], "function", UINT64_MAX);
  require_known_function(out.function, "function");
  out.block = static_cast<uint32_t>(int_arg(t[2], "block", 1, 1024));
  out.smem = static_cast<uint32_t>(int_arg(t[3], "smem", 0, 1 << 20));
  nb::bytes params;
  if (!nb::try_cast(t[4], params) || params.size() % 8 != 0)
    raise_invalid("params", "bytes of a parameter struct of 8-byte fields", text_of(t[4]));
  if (params.size() > rt::kMaxPlanParamBytes)
    raise_limit("params", "bytes of a planned launch's parameter struct", nb::int_(params.size()),
                rt::kMaxPlanParamBytes);
  out.num_fields = static_cast<uint32_t>(params.size() / 8);
  std::memcpy(out.params, params.c_str(), params.size());
  std::vector<int64_t> slots;
  if (!nb::try_cast(t[5], slots)) raise_invalid("slots", "a list of field indices", text_of(t[5]));
  if (slots.size() > rt::kMaxPlanSlots)
    raise_limit("slots", "per-call fields of a planned launch", nb::int_(slots.size()), rt::kMaxPlanSlots);
  out.num_slots = static_cast<uint32_t>(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= int64_t(out.num_fields))
      raise_invalid("slots", "field indices of the parameter struct", std::to_string(slots[i]));
    out.slots[i] = static_cast<uint32_t>(slots[i]);
  }
}

}  // namespace

void register_op_plan(nb::module_& parent) {
  nb::module_ m = nb::borrow<nb::module_>(parent.attr("cuda"));
  m.def("op_plan_abi", []() { return rt::op_plan_abi(); },
        "The OpPlan layout's version << 32 | size, as these bindings were built (launch_plan.h).");
  nb::class_<rt::OpPlan>(m, "OpPlan",
                         "An eager op's send and receive launches prepared once (launch_plan.h), issued by "
                         "uccl_ep's torch ops, which take the plan by address.")
      .def("__init__", [](rt::OpPlan* self, nb::handle send, nb::handle recv, std::vector<int64_t> shape,
                          nb::handle error_word) {
        new (self) rt::OpPlan{};
        self->issue = &rt::issue_launch_plan;
        fill_launch(self->send, send, "send");
        fill_launch(self->recv, recv, "recv");
        if (shape.size() > rt::kPlanShapeWords)
          raise_limit("shape", "shape words of an op plan", nb::int_(shape.size()), rt::kPlanShapeWords);
        for (size_t i = 0; i < shape.size(); ++i) self->shape[i] = shape[i];
        const uint64_t word = u64_arg(error_word, "error_word", UINT64_MAX);
        if (word == 0 || word % 4 != 0)
          raise_invalid("error_word", "the host address of an int32 error word", text_of(error_word));
        self->error_word = reinterpret_cast<const volatile int32_t*>(word);
      }, nb::arg("send"), nb::arg("recv"), nb::arg("shape"), nb::arg("error_word"))
      .def_prop_ro("address", [](const rt::OpPlan& p) { return reinterpret_cast<uint64_t>(&p); },
                   "The plan's address, which the torch ops take (valid while this object lives).");
}

}  // namespace uccl_ep::bindings
