// The out kernel of a gated activation, out = act(gate) * up element by element (my_ops::silu_mul, my_ops::gelu_mul):
// the arguments checked in the words of the op's Python `_check`, `out` resized, the layouts checked, the elements cut
// into chunks for the pool. An op gives its name and its element range, range(gate, up, out, first, end) for each
// floating type, returning the path counter of the code that ran (its _rows.h, which decoder_layer may share).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"

namespace custom {
namespace native {
namespace gated {

constexpr int64_t kChunk = 1024;  // elements a task: the pool's grain is counted in these

template <typename T, typename Range>
bool run(const Tensor& gate, const Tensor& up, Tensor& out, const Range& range) {
  const int64_t count = gate.numel();
  const T* g = gate.template const_data_ptr<T>();
  const T* u = up.template const_data_ptr<T>();
  T* o = out.template mutable_data_ptr<T>();
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  return rows::for_each_row(chunks, kChunk * 3 * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
    const int64_t begin = first * kChunk, stop = std::min(count, end * kChunk);
    elementwise::count(range(g, u, o, begin, stop), static_cast<uint64_t>(stop - begin));
  });
}

// The arguments, before `out` is resized, in the order and words of the op's Python `_check`; Dtypes: the op's
// declared set (declared_dtypes::my_ops::NAME).
template <typename Dtypes>
contract::Problem arguments_problem(const char* op, const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(gate, op, "gate")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(up, gate, op, "up", "gate")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, gate, op, "out", "gate")) {
    return p;
  }
  if (!contract::same_sizes(gate, up)) {
    return std::string(op) + ": gate of shape " + contract::shape_text(gate) + " and up of shape " +
        contract::shape_text(up) + " differ; give both the same shape";
  }
  return std::nullopt;
}

inline contract::Problem layout_problem(const char* op, const Tensor& gate, const Tensor& up, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{gate, "gate"}, {up, "up"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, op, name)) {
      return p;
    }
  }
  // Element i reads only element i: out may be either input exactly.
  return contract::memory_problem(op, {{out, "out"}}, {{gate, "gate", true}, {up, "up", true}});
}

#ifdef USE_ATEN_LIB
template <typename Dtypes, typename Range>
at::Tensor& out_kernel(const char* op, const at::Tensor& gate_in, const at::Tensor& up_in, at::Tensor& out,
                       const Range& range) {
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  contract::require(arguments_problem<Dtypes>(op, gate, up, out));
  contract::resize_output(out, gate.sym_sizes(), op);
  contract::check_memory(op, {{out, "out"}}, {{gate, "gate", true}, {up, "up", true}});
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(op, gate, up, y));
    Dtypes::visit(gate.scalar_type(), [&](auto tag) { run<decltype(tag)>(gate, up, y, range); });
  });
}
#else
template <typename Dtypes, typename Range>
Tensor& out_kernel(const char* op, KernelContext& ctx, const Tensor& gate, const Tensor& up, Tensor& out,
                   const Range& range) {
  if (!contract::require(ctx, arguments_problem<Dtypes>(op, gate, up, out)) ||
      !contract::resize_output(ctx, out, gate.sizes(), op, "out") ||
      !contract::require(ctx, layout_problem(op, gate, up, out))) {
    return out;
  }
  bool all_ran = true;
  Dtypes::visit(gate.scalar_type(), [&](auto tag) { all_ran = run<decltype(tag)>(gate, up, out, range); });
  ET_KERNEL_CHECK_MSG(ctx, all_ran, Internal, out, "%s: the threadpool did not run all of the elements", op);
  return out;
}
#endif

} // namespace gated
} // namespace native
} // namespace custom

// Defines custom::native::NAME_out_impl, the out kernel of my_ops::NAME.out that custom_ops.yaml binds, in the mode the
// source is compiled in, over RANGE (the member's element range in its _rows.h, e.g. swiglu::silu_mul_range). Used
// once per member, at global scope, in its NAME_out.cpp, after that source includes its declared set
// ("declared_dtypes/my_ops/NAME.h").
#ifdef USE_ATEN_LIB
#define CUSTOM_OPS_GATED_OUT_KERNEL(NAME, RANGE)                                                     \
  namespace custom::native {                                                                         \
  at::Tensor& NAME##_out_impl(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {       \
    return gated::out_kernel<declared_dtypes::my_ops::NAME>("my_ops::" #NAME ".out", gate, up, out,   \
                             [](const auto* g, const auto* u, auto* o, int64_t first, int64_t end) { \
                               return RANGE(g, u, o, first, end);                                    \
                             });                                                                     \
  }                                                                                                  \
  }
#else
#define CUSTOM_OPS_GATED_OUT_KERNEL(NAME, RANGE)                                                                \
  namespace custom::native {                                                                                    \
  executorch::aten::Tensor& NAME##_out_impl(executorch::runtime::KernelRuntimeContext& ctx,                     \
                                            const executorch::aten::Tensor& gate,                               \
                                            const executorch::aten::Tensor& up, executorch::aten::Tensor& out) { \
    return gated::out_kernel<declared_dtypes::my_ops::NAME>("my_ops::" #NAME ".out", ctx, gate, up, out,       \
                             [](const auto* g, const auto* u, auto* o, int64_t first, int64_t end) {            \
                               return RANGE(g, u, o, first, end);                                               \
                             });                                                                                \
  }                                                                                                             \
  }
#endif
