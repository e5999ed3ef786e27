// Step 1 of the mul4 flow: registers my_ops::mul4 with PyTorch from C++, the way production ops are written, with a
// kernel per dispatch key so the op works with every PyTorch subsystem (eager, export's fake tensors, autograd). Built
// into libcustom_ops_aot_lib.so with custom_ops_2_out.cpp (ATen mode) and the schema and CPU registration of mul4.out
// that codegen writes from custom_ops.yaml; the vmap rule comes from Python (flow/vmap_rules.py: functorch's C++
// batching headers need nlohmann/json, absent from the torch wheel). The CUDA kernels are in ops/mul4/custom_ops_2_cuda.cu.
//
// No autocast kernel: with one input, autocast's fallthrough already runs mul4 in the input's dtype, as it does x * 4
// (an op with several inputs would promote them to the widest, or, on autocast's lower-precision list, downcast).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "declared_dtypes/my_ops/mul4.h"
#include "kernel_helpers/unary_elementwise.h"

namespace custom {
namespace native {

// Defined in custom_ops_2_out.cpp (ATen mode): the same kernel the runtime runs for mul4.out.
at::Tensor& mul4_out_impl(const at::Tensor& input, at::Tensor& output);

namespace {

constexpr const char* kOpName = "my_ops::mul4";

at::Tensor call_mul4(const at::Tensor& input) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("my_ops::mul4", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(input);
}

// Meta: shape, dtype and layout only. torch.export traces with fake tensors, which dispatch here, so dynamic shapes
// work; it rejects what the CPU kernel rejects, so export fails early instead of writing a program the runtime cannot
// run.
at::Tensor mul4_meta(const at::Tensor& input) {
  return unary_elementwise_meta<declared_dtypes::my_ops::mul4>(input, kOpName);
}

// Meta for mul4.out (codegen registers its CPU kernel only): the CPU kernel's checks and resize on symbolic sizes.
at::Tensor& mul4_out_meta(const at::Tensor& input, at::Tensor& output) {
  return unary_elementwise_out_meta<declared_dtypes::my_ops::mul4>(input, output, "my_ops::mul4.out");
}

// Autograd: d(4x)/dx = 4. The backward calls mul4 itself, so higher-order gradients work too. (PyTorch does not let a
// C++ autograd::Function run under torch.func transforms such as torch.func.grad; torch.autograd works.)
class Mul4Function : public torch::autograd::Function<Mul4Function> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& input) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_mul4(input);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* /*ctx*/,
      torch::autograd::variable_list grad_outputs) {
    return {call_mul4(grad_outputs[0])};
  }
};

at::Tensor mul4_autograd(const at::Tensor& input) {
  return Mul4Function::apply(input);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("mul4(Tensor input) -> Tensor");
}

// CPU: a result laid out like the input (channels-last stays channels-last, as with x * 4), computed by mul4.out's
// kernel, the one the runtime runs.
TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("mul4", TORCH_FN(unary_elementwise_functional<mul4_out_impl>));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("mul4", TORCH_FN(mul4_meta));
  m.impl("mul4.out", TORCH_FN(mul4_out_meta));
}

TORCH_LIBRARY_IMPL(my_ops, Autograd, m) {
  m.impl("mul4", TORCH_FN(mul4_autograd));
}

} // namespace native
} // namespace custom
