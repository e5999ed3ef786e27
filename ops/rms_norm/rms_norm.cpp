// Step 1 of the rms_norm flow: registers my_ops::rms_norm(Tensor input, Tensor weight, float eps=1e-6) with PyTorch
// from C++, with a kernel per dispatch key: CPU (rms_norm_out.cpp's kernel, the one the runtime runs), Meta (shapes
// and the CPU kernel's checks, for torch.export's fake tensors) and Autograd (gradients for input and weight, written
// in ATen ops so they are differentiable again). rms_norm.out's schema and CPU kernel come from codegen
// (custom_ops.yaml); rms_norm.py holds the ATen reference and the example model.
#include <ATen/TensorOperators.h>  // the backward's a * b: ATen/ATen.h would declare every op
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rsqrt.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "declared_dtypes/my_ops/rms_norm.h"
#include "kernel_helpers/kernel_contract.h"

namespace custom {
namespace native {

// Defined in rms_norm_out.cpp (ATen mode).
at::Tensor& rms_norm_out_impl(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor& out);

namespace {

constexpr const char* kOpName = "my_ops::rms_norm";

void check_arguments(const at::Tensor& input, const at::Tensor& weight, const char* op) {
  contract::check_dtype<declared_dtypes::my_ops::rms_norm>(input, op, "input");
  contract::check_same_dtype(weight, input, op, "weight", "input");
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least one dimension (the one normalized)");
  TORCH_CHECK(weight.dim() >= 1 && weight.dim() <= input.dim() && weight.sym_numel() == input.sym_size(-1) &&
                  weight.sym_size(-1) == input.sym_size(-1),
              op, ": weight of shape ", weight.sym_sizes(), " does not scale the last dimension of input of shape ",
              input.sym_sizes(), "; give it shape [", input.sym_size(-1), "]");
}

at::Tensor call_rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("my_ops::rms_norm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(input, weight, eps);
}

at::Tensor rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps) {
  check_arguments(input, weight, kOpName);
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  return rms_norm_out_impl(input, weight, eps, out);
}

at::Tensor rms_norm_meta(const at::Tensor& input, const at::Tensor& weight, double /*eps*/) {
  check_arguments(input, weight, kOpName);
  return at::empty_symint(input.sym_sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor& rms_norm_out_meta(const at::Tensor& input, const at::Tensor& weight, double /*eps*/, at::Tensor& out) {
  check_arguments(input, weight, "my_ops::rms_norm.out");
  contract::check_same_dtype(out, input, "my_ops::rms_norm.out", "out", "input");
  contract::resize_output(out, input.sym_sizes(), "my_ops::rms_norm.out");
  return out;
}

// y = x * r * w with r = (mean(x^2) + eps)^-1/2 over the last dimension (n elements):
//   dL/dw = sum over the broadcast dimensions of g * x * r
//   dL/dx = r * (g * w) - x * r^3 * mean((g * w) * x)
// in float for the half types, in ATen ops (so gradgradcheck differentiates the backward too).
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            double eps) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["eps"] = eps;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_rms_norm(input, weight, eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const double eps = ctx->saved_data["eps"].toDouble();
    const at::Tensor x = saved[0].to(at::kFloat);
    const at::Tensor w = saved[1].to(at::kFloat);
    const at::Tensor g = grad_outputs[0].to(at::kFloat);
    const at::Tensor r = at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
    const at::Tensor gw = g * w;
    const at::Tensor grad_input = r * gw - x * r.pow(3) * (gw * x).mean(-1, /*keepdim=*/true);
    const at::Tensor grad_weight = (g * x * r).sum_to_size(saved[1].sizes());
    return {grad_input.to(saved[0].scalar_type()), grad_weight.to(saved[1].scalar_type()), at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& input, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(input, weight, eps);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("rms_norm(Tensor input, Tensor weight, float eps=1e-06) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_meta));
  m.impl("rms_norm.out", TORCH_FN(rms_norm_out_meta));
}

TORCH_LIBRARY_IMPL(my_ops, Autograd, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_autograd));
}

} // namespace native
} // namespace custom
