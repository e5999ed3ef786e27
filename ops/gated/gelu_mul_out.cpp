// The kernel of my_ops::gelu_mul.out (gated.py registers the op with PyTorch): out = gelu_tanh(gate) * up element by
// element (gelu_mul_rows.h: one exp where ExecuTorch's gelu kernel takes a tanh per lane, the gelu rounded to the
// dtype, then the product). Within a few ulp of ATen's gelu(approximate="tanh") * up, not its bits: ExecuTorch's gelu
// calls libm's tanhf lane by lane, which cost a third of Gemma 3's prefill.
// ExecuTorch mode: the runtime kernel; ATen mode: the CPU kernel gelu_mul_without_python.cpp registers.
#include "kernel_helpers/gated_activation.h"
#include "ops/gated/gelu_mul_rows.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::gelu_mul.out";
constexpr auto kRange = [](const auto* gate, const auto* up, auto* out, int64_t first, int64_t end) {
  return geglu::gelu_mul_range(gate, up, out, first, end);
};

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& gelu_mul_out_impl(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  return gated::out_kernel(kOp, gate, up, out, kRange);
}
#else
executorch::aten::Tensor& gelu_mul_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                            const executorch::aten::Tensor& gate, const executorch::aten::Tensor& up,
                                            executorch::aten::Tensor& out) {
  return gated::out_kernel(kOp, ctx, gate, up, out, kRange);
}
#endif

} // namespace native
} // namespace custom
