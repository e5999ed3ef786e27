// The kernel of my_ops::gelu_mul.out (gelu_mul.py registers the op with PyTorch): out = gelu_tanh(gate) * up element by
// element (gelu_mul_rows.h: one exp where ExecuTorch's gelu kernel takes a tanh per lane, the gelu rounded to the
// dtype, then the product). Within a few ulp of ATen's gelu(approximate="tanh") * up, not its bits: ExecuTorch's gelu
// calls libm's tanhf lane by lane, which cost a third of Gemma 3's prefill.
// ExecuTorch mode: the runtime kernel; ATen mode: the CPU kernel gelu_mul_without_python.cpp registers.
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"
#include "ops/gelu_mul/gelu_mul_rows.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::gelu_mul.out";
using Dtypes = contract::FloatingDtypes;
constexpr int64_t kChunk = 1024;  // elements a task: the pool's grain is counted in these

template <typename T>
bool run(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t count = gate.numel();
  const T* g = gate.template const_data_ptr<T>();
  const T* u = up.template const_data_ptr<T>();
  T* o = out.template mutable_data_ptr<T>();
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  return rows::for_each_row(chunks, kChunk * 3 * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
    const int64_t begin = first * kChunk, stop = std::min(count, end * kChunk);
    geglu::gelu_mul_range<T>(g, u, o, begin, stop);
    elementwise::count(elementwise::kBaselineElements, static_cast<uint64_t>(stop - begin));
  });
}
// The arguments, before `out` is resized: gelu_mul.py's _check, in its order and words.
contract::Problem arguments_problem(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(gate, kOp, "gate")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(up, gate, kOp, "up", "gate")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, gate, kOp, "out", "gate")) {
    return p;
  }
  if (!contract::same_sizes(gate, up)) {
    return std::string(kOp) + ": gate of shape " + contract::shape_text(gate) + " and up of shape " +
        contract::shape_text(up) + " differ; give both the same shape";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& gate, const Tensor& up, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{gate, "gate"}, {up, "up"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  // Element i reads only element i: out may be either input exactly.
  return contract::memory_problem(kOp, {{out, "out"}}, {{gate, "gate", true}, {up, "up", true}});
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& gelu_mul_out_impl(const at::Tensor& gate_in, const at::Tensor& up_in, at::Tensor& out) {
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  contract::require(arguments_problem(gate, up, out));
  contract::resize_output(out, gate.sym_sizes(), kOp);
  contract::check_memory(kOp, {{out, "out"}}, {{gate, "gate", true}, {up, "up", true}});
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(gate, up, y));
    Dtypes::visit(gate.scalar_type(), [&](auto tag) { run<decltype(tag)>(gate, up, y); });
  });
}
#else
executorch::aten::Tensor& gelu_mul_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                            const executorch::aten::Tensor& gate, const executorch::aten::Tensor& up,
                                            executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(gate, up, out)) ||
      !contract::resize_output(ctx, out, gate.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(gate, up, out))) {
    return out;
  }
  bool all_ran = true;
  Dtypes::visit(gate.scalar_type(), [&](auto tag) { all_ran = run<decltype(tag)>(gate, up, out); });
  ET_KERNEL_CHECK_MSG(ctx, all_ran, Internal, out, "%s: the threadpool did not run all of the elements", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom
