// Step 1 of the mul4 flow: registers my_ops::mul4 with PyTorch from C++, the way production ops are written, with a
// kernel per dispatch key so the op works with every PyTorch subsystem (eager, export's fake tensors, autograd,
// autocast). Built into libcustom_ops_aot_lib.so with custom_ops_2_out.cpp (ATen mode) and the schema and CPU
// registration of mul4.out that codegen writes from custom_ops.yaml. The vmap rule is registered from Python when
// custom_ops_2.py loads the library: functorch's C++ batching headers need nlohmann/json, absent from the torch wheel.
// The CUDA kernels are in custom_ops_2_cuda.cu.
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

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
  return unary_elementwise_meta(input, kOpName);
}

// Meta for mul4.out (codegen registers its CPU kernel only): the CPU kernel's checks and resize on symbolic sizes.
at::Tensor& mul4_out_meta(const at::Tensor& input, at::Tensor& output) {
  return unary_elementwise_out_meta(input, output, "my_ops::mul4.out");
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

// Autocast: the "promote" policy autocast applies to PyTorch's own elementwise ops: run in the widest floating type
// among the inputs, so under autocast mul4(x) has x's dtype, exactly like x * 4, and an exported program gains no
// casts. An op with several inputs takes at::promote_types over its floating inputs and cached_casts each input to
// it; with one input the widest type is the input's own and the cast is a no-op. (at::autocast::promote_type assumes
// float32 or the device's one lower-precision type: it raises for a float16 input under CPU autocast, hence
// the explicit type.) Casting down to the autocast dtype instead is right only for ops on autocast's lower-precision
// list, such as matmul and conv, whose speed gain outweighs the precision loss.
template <c10::DeviceType kDevice, c10::DispatchKey kAutocastKey>
at::Tensor mul4_autocast(const at::Tensor& input) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kAutocastKey);
  const at::ScalarType widest_input_type = input.scalar_type();
  return call_mul4(at::autocast::cached_cast(widest_input_type, input, kDevice));
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

TORCH_LIBRARY_IMPL(my_ops, AutocastCPU, m) {
  m.impl("mul4", TORCH_FN((mul4_autocast<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>)));
}

#ifdef CUSTOM_OPS_WITH_CUDA
TORCH_LIBRARY_IMPL(my_ops, AutocastCUDA, m) {
  m.impl("mul4", TORCH_FN((mul4_autocast<c10::DeviceType::CUDA, c10::DispatchKey::AutocastCUDA>)));
}
#endif

} // namespace native
} // namespace custom
