// uccl_ep's torch ops (torch's stable ABI: no libtorch version pin): an eager low-latency op's host
// path in one call: the outputs from torch's caching allocator, both kernels' parameters, the send
// launch, the error word check and the receive launch.
//
// The launches are an `OpPlan` (runtime/launch_plan.h) the bindings made once per (layout, buffer
// set, flags) and pass by address; they go through the bindings' runtime (`OpPlan::issue`), so
// this library never loads a GPU runtime itself. Called by uccl_ep.cuda.ll (native_ops.py loads it).
//
// NOTES: from Python an eager LL op's host time went mostly to torch allocations, slices and views
// and to Python frames (docs/benchmarks.md, "Eager calls"); here each allocation is one C call.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <tuple>

#include "runtime/launch_plan.h"

namespace rt = uccl_ep::runtime;
using torch::stable::Tensor;

namespace {

// The op's status (the last output): whether the receive launch was issued.
enum Status : int64_t { kReceiveLaunched = 0, kReceiveLeftToCaller = 1, kErrorWordSet = 2 };

Tensor empty_like_device(const Tensor& on, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
                         int32_t dtype) {
  int32_t device_type = 0, device_index = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(on.get(), &device_type));
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(on.get(), &device_index));
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.begin(), strides.begin(),
                                                  dtype, device_type, device_index, &out));
  return Tensor(out);
}

int64_t address(const Tensor& t) { return reinterpret_cast<int64_t>(t.data_ptr()); }
int64_t address(const std::optional<Tensor>& t) { return t.has_value() ? address(*t) : 0; }

void issue(const rt::OpPlan& plan, const rt::LaunchPlan& launch, uint32_t grid, std::initializer_list<int64_t> values,
           int64_t stream, bool programmatic) {
  STD_TORCH_CHECK(values.size() == launch.num_slots, "uccl_ep op plan: ", launch.num_slots, " per-call fields, got ",
                  values.size());
  alignas(8) uint8_t params[rt::kMaxPlanParamBytes];
  rt::fill_params(launch, values.begin(), params);
  char err[512] = "";
  STD_TORCH_CHECK(plan.issue(&launch, grid, params, static_cast<uint64_t>(stream), programmatic, err, sizeof err) == 0,
                  "uccl_ep launch: ", err);
}

// Dispatch plan shape words: E_loc, R * num_max (rows), hidden, use_fp8, use_ue8m0, scale columns, R.
std::tuple<Tensor, std::optional<Tensor>, Tensor, Tensor, Tensor, int64_t> ll_dispatch(
    Tensor x, Tensor topk_idx, std::optional<Tensor> cumulative_stats, std::optional<Tensor> wait_stats,
    int64_t plan_address, int64_t stream, bool launch_recv, bool recv_pdl) {
  const auto& plan = *reinterpret_cast<const rt::OpPlan*>(plan_address);
  const int64_t E_loc = plan.shape[0], rows = plan.shape[1], H = plan.shape[2], cols = plan.shape[5], R = plan.shape[6];
  const bool fp8 = plan.shape[3] != 0, ue8m0 = plan.shape[4] != 0;
  const int64_t T = x.size(0);
  Tensor recv_x = empty_like_device(x, {E_loc, rows, H}, {rows * H, H, 1},
                                    fp8 ? aoti_torch_dtype_float8_e4m3fn() : aoti_torch_dtype_bfloat16());
  std::optional<Tensor> scales;
  if (fp8)  // column-major in the last two dims, as DeepEP's
    scales = empty_like_device(x, {E_loc, rows, cols}, {cols * rows, 1, rows},
                               ue8m0 ? aoti_torch_dtype_int32() : aoti_torch_dtype_float32());
  Tensor recv_count = empty_like_device(x, {E_loc}, {1}, aoti_torch_dtype_int32());
  Tensor src_info = empty_like_device(x, {E_loc, rows}, {rows, 1}, aoti_torch_dtype_int32());
  Tensor layout_range = empty_like_device(x, {E_loc, R}, {R, 1}, aoti_torch_dtype_int64());
  issue(plan, plan.send, static_cast<uint32_t>(std::max<int64_t>(T, 1)), {address(x), address(topk_idx), T}, stream,
        false);
  int64_t status = kReceiveLeftToCaller;
  if (launch_recv) {
    if (*plan.error_word != 0) {
      status = kErrorWordSet;
    } else {
      issue(plan, plan.recv, static_cast<uint32_t>(E_loc),
            {address(recv_x), address(scales), address(recv_count), address(src_info), address(layout_range),
             address(cumulative_stats), address(wait_stats)},
            stream, recv_pdl);
      status = kReceiveLaunched;
    }
  }
  return {recv_x, scales, recv_count, src_info, layout_range, status};
}

// Combine plan shape words: hidden, the send kernel's grid.
std::tuple<Tensor, int64_t> ll_combine(int64_t y_address, Tensor src_info, Tensor layout_range, Tensor topk_idx,
                                       Tensor topk_weights, std::optional<Tensor> out, std::optional<Tensor> wait_stats,
                                       int64_t plan_address, int64_t stream, bool launch_recv, bool recv_pdl) {
  const auto& plan = *reinterpret_cast<const rt::OpPlan*>(plan_address);
  const int64_t H = plan.shape[0], T = topk_idx.size(0), K = topk_idx.size(1);
  Tensor result = out.has_value() ? *out : empty_like_device(topk_idx, {T, H}, {H, 1}, aoti_torch_dtype_bfloat16());
  issue(plan, plan.send, static_cast<uint32_t>(plan.shape[1]), {y_address, address(src_info), address(layout_range)},
        stream, false);
  int64_t status = kReceiveLeftToCaller;
  if (launch_recv) {
    if (*plan.error_word != 0) {
      status = kErrorWordSet;
    } else {
      issue(plan, plan.recv, static_cast<uint32_t>(std::max<int64_t>(T, 1)),
            {address(topk_idx), address(topk_weights), address(result), address(wait_stats), T, K}, stream, recv_pdl);
      status = kReceiveLaunched;
    }
  }
  return {result, status};
}

int64_t op_plan_abi() { return rt::op_plan_abi(); }

}  // namespace

STABLE_TORCH_LIBRARY(uccl_ep, m) {
  m.def("op_plan_abi() -> int");
  m.def("ll_dispatch(Tensor x, Tensor topk_idx, Tensor? cumulative_stats, Tensor? wait_stats, int plan, int stream, "
        "bool launch_recv, bool recv_pdl) -> (Tensor, Tensor?, Tensor, Tensor, Tensor, int)");
  m.def("ll_combine(int y, Tensor src_info, Tensor layout_range, Tensor topk_idx, Tensor topk_weights, Tensor? out, "
        "Tensor? wait_stats, int plan, int stream, bool launch_recv, bool recv_pdl) -> (Tensor, int)");
}

STABLE_TORCH_LIBRARY_IMPL(uccl_ep, CompositeExplicitAutograd, m) {
  m.impl("ll_dispatch", TORCH_BOX(&ll_dispatch));
  m.impl("ll_combine", TORCH_BOX(&ll_combine));
  m.impl("op_plan_abi", TORCH_BOX(&op_plan_abi));
}
